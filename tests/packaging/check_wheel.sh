#!/usr/bin/env bash
# check_wheel.sh: the wheel carries every library it needs beyond the C/C++ runtime, and runs.
# Usage: check_wheel.sh PYTHON OUT. PYTHON: the dev venv's interpreter (scikit-build-core,
# nanobind); OUT: a scratch folder, emptied. Builds the wheel, lists each ELF file's NEEDED
# entries, then installs the wheel into a fresh venv and judges from Python and the CLI.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-.venv/bin/python}
OUT=$(realpath -m "${2:-build/wheel-check}")
rm -rf "$OUT" && mkdir -p "$OUT"
start=$SECONDS
fail() { echo "wheel-check FAILED: $*" >&2; exit 1; }

# Release build in scikit-build-core's cached build dir (build/python-<tag>, shared with
# `make install-python`), so a rebuild compiles only what changed.
"$PY" -m pip wheel . --no-build-isolation --no-deps --disable-pip-version-check -w "$OUT/dist" \
  > "$OUT/pip-wheel.log" 2>&1 || { cat "$OUT/pip-wheel.log"; fail "pip wheel"; }
wheel=$(echo "$OUT"/dist/numalign-*.whl)
[ -f "$wheel" ] || fail "no wheel in $OUT/dist"
echo "== $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB, built in $((SECONDS - start)) s)"
"$PY" -m zipfile -e "$wheel" "$OUT/unpacked"
for f in numalign/py.typed numalign/_core.pyi numalign/__init__.py numalign-*.data/scripts/numalign \
         numalign-*.dist-info/licenses/LICENSE; do
  compgen -G "$OUT/unpacked/$f" > /dev/null || fail "the wheel lacks $f"
done

# Every NEEDED entry of every ELF file is the C/C++ runtime or a library inside the wheel.
runtime='^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libpthread\.so\.0|ld-linux-x86-64\.so\.2)$'
mapfile -t elves < <(cd "$OUT/unpacked" && find . -type f | sort | while read -r f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "${f#./}"; done)
[ ${#elves[@]} -ge 3 ] || fail "expected _core, the CLI and libsimdjson among the ELF files: ${elves[*]}"
carried=$(for f in "${elves[@]}"; do basename "$f"; done)
missing=0
for f in "${elves[@]}"; do
  runpath=$(readelf -d "$OUT/unpacked/$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  echo "$f${runpath:+  (RUNPATH $runpath)}"
  for lib in $(readelf -d "$OUT/unpacked/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if [[ $lib =~ $runtime ]]; then kind="C/C++ runtime"
    elif grep -qxF "$lib" <<< "$carried"; then kind="carried in the wheel"
    else kind="MISSING from the wheel"; missing=1; fi
    printf '    NEEDED %-22s %s\n' "$lib" "$kind"
  done
done
[ $missing = 0 ] || fail "the wheel needs libraries it does not carry"

# A fresh venv from the same base interpreter (the wheel is for its CPython), no system site
# packages, nothing but numpy (the pip cache's copy of the dev venv's version) and the wheel.
base=$("$PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
"$base" -m venv "$OUT/venv"
V=$OUT/venv
numpy_version=$("$PY" -c 'import numpy; print(numpy.__version__)')
"$V/bin/python" -m pip install -q --disable-pip-version-check "numpy==$numpy_version" "$wheel" \
  > "$OUT/pip-install.log" 2>&1 || { cat "$OUT/pip-install.log"; fail "pip install into the fresh venv"; }

# Everything below runs as a user's shell would, without LD_LIBRARY_PATH or PYTHONPATH.
run() { env -u LD_LIBRARY_PATH -u PYTHONPATH "$@"; }
mkdir -p "$OUT/run"
run "$V/bin/python" - "$OUT/run" <<'EOF' || fail "numalign from Python in the fresh venv"
import importlib.util, os, sys
import numpy as np
import numalign

pkg = os.path.dirname(numalign.__file__)
assert pkg.startswith(sys.prefix + os.sep), f"numalign imported from {pkg}, not the fresh venv"
assert importlib.util.find_spec("torch") is None, "torch is in the fresh venv"
# The extension resolved libsimdjson to the wheel's copy.
maps = {line.split()[-1] for line in open("/proc/self/maps") if "libsimdjson" in line}
assert maps == {os.path.join(pkg, "libsimdjson.so.14")}, maps

u = np.linspace(1, 2, 4096)
ref = u.astype(np.float32)
bad = (u + 1e-3).astype(np.float32)
assert numalign.judge({"y": ref}, {"y": ref}, {"y": u}).aligned
assert not numalign.judge({"y": bad}, {"y": ref}, {"y": u}).aligned
out = sys.argv[1]
for name, a in {"ref": ref, "bad": bad, "truth": u}.items():
    numalign.Trace({"y": a}).save(os.path.join(out, name + ".safetensors"))
print(f"python: numalign {numalign.__version__} from {pkg}, libsimdjson from the package, "
      "judge() verdicts right")
EOF

cli=$V/bin/numalign
echo "cli: $(run "$cli" --version)"
run "$cli" judge "$OUT/run/ref.safetensors" "$OUT/run/ref.safetensors" "$OUT/run/truth.safetensors" \
  > "$OUT/run/aligned.txt" || fail "numalign judge of an aligned trace: exit $?"
rc=0; run "$cli" judge "$OUT/run/bad.safetensors" "$OUT/run/ref.safetensors" "$OUT/run/truth.safetensors" \
  > "$OUT/run/bad.txt" || rc=$?
[ $rc = 1 ] || fail "numalign judge of a misaligned trace: exit $rc, expected 1"
echo "cli: judge exits 0 (aligned) and 1 (not aligned)"
for f in "$cli" "$V"/lib/python*/site-packages/numalign/_core*.so; do
  resolved=$(realpath -m "$(run ldd "$f" | sed -n 's/^\s*libsimdjson\.so\.14 => \(\S*\).*/\1/p')")
  [[ $resolved == "$V"/lib/python*/site-packages/numalign/libsimdjson.so.14 ]] \
    || fail "$f resolves libsimdjson.so.14 to '$resolved', not the wheel's copy"
  echo "ldd: ${f#"$V"/} -> libsimdjson.so.14 => ${resolved#"$V"/}"
done

# auditwheel's own view, where it is installed (not a requirement).
if "$PY" -c 'import auditwheel' 2> /dev/null; then "$PY" -m auditwheel show "$wheel" || true; fi
echo "wheel-check passed in $((SECONDS - start)) s"
