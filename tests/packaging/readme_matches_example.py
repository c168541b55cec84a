"""readme_matches_example.py ROOT: the C++ and CMake code of README's "From C++ tests" is the
code of examples/cpp_kernel_test, line for line and in its order (lines between may be left out)."""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1])
readme = (root / "README.md").read_text()
section = readme[readme.index("## From C++ tests\n"):readme.index("## Layout\n")]
example = root / "examples" / "cpp_kernel_test"
for lang, source in (("cpp", "fused_allreduce_test.cpp"), ("cmake", "CMakeLists.txt")):
    lines = (example / source).read_text().splitlines()
    blocks = re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)
    if not blocks:
        sys.exit(f"README's 'From C++ tests' has no {lang} block")
    for block in blocks:
        at = 0
        for line in (l for l in block.splitlines() if l.strip()):
            try:
                at = lines.index(line, at) + 1
            except ValueError:
                sys.exit(f"README's {lang} line is not in {source} (in this order):\n{line}")
