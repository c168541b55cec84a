"""test_readme.py: every `numalign` command in README.md runs, with the exit code it notes."""
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    for block in blocks:
        for line in block.splitlines():
            if line.startswith("numalign "):
                command, _, comment = line.partition("  #")
                match = re.search(r"exit (\d)", comment)
                yield shlex.split(command)[1:], int(match.group(1)) if match else 0


def test_readme_has_commands():
    assert len(list(readme_commands())) >= 8


def test_every_readme_command_runs(cli, examples, monkeypatch):
    monkeypatch.chdir(examples)
    for args, code in readme_commands():
        proc = cli(*args)
        assert proc.returncode == code, (args, proc.stdout[-2000:], proc.stderr)
        assert "error" not in proc.stderr.lower() or code == 2, proc.stderr


def test_report_excerpt_matches_real_output(cli, examples, monkeypatch):
    """The 'Reading a report' excerpt is real output: its lines (but the elided one) appear."""
    monkeypatch.chdir(examples)
    text = (ROOT / "README.md").read_text()
    excerpt = re.search(r"### Reading a report\n\n```\n(.*?)```", text, flags=re.S).group(1)
    proc = cli("judge", "matmul/dropped_column.safetensors", "matmul/ref.safetensors",
               "matmul/truth.safetensors")
    for line in excerpt.splitlines():
        if line.strip() and line.strip() != "...":
            assert line in proc.stdout.splitlines(), line


def test_sensitivity_excerpt_is_real_output(cli, examples, monkeypatch):
    """The sensitivity table in the README is what the command prints, line for line."""
    monkeypatch.chdir(examples)
    text = (ROOT / "README.md").read_text()
    excerpt = re.search(r"### Could this test fail at all\?\n.*?```\n(.*?)```", text,
                        flags=re.S).group(1)
    proc = cli("sensitivity", "allreduce/fused.safetensors", "allreduce/unfused.safetensors",
               "allreduce/truth.safetensors")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == excerpt.strip()


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def prints_as_shown(printed, shown):
    """The text is the same, and each number the same to its last shown digit or the next:
    torch's CPU kernels round differently from one processor to another (a README ratio of
    8.389 printed 8.39 on another machine), and the README shows four significant digits."""
    if NUMBER.split(printed) != NUMBER.split(shown):
        return False
    # The same text around them: as many numbers in each.
    return all(abs(float(g) - float(w)) <= 2e-3 * abs(float(w))
               for g, w in zip(NUMBER.findall(printed), NUMBER.findall(shown)))


def test_prints_as_shown_rejects_other_words_and_numbers():
    shown = "1. FAIL  layers.1.mlp  ratio 8.389 / limit 3"
    assert prints_as_shown(shown.replace("8.389", "8.39"), shown)
    assert not prints_as_shown(shown.replace("FAIL", "pass"), shown)
    assert not prints_as_shown(shown.replace("8.389", "8.47"), shown)
    assert not prints_as_shown(shown.replace("limit 3", "limit 4"), shown)
    assert not prints_as_shown(shown + " extra", shown)


def test_python_examples_run_in_order(tmp_path, monkeypatch, capsys):
    """Every ```python block of the README runs, in order, in one namespace; where the README
    shows what a block prints, the block prints that (numbers to their last digit)."""
    monkeypatch.chdir(tmp_path)
    # The README's paths are relative to the repository root, where a reader runs them.
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "transformer"))
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "hf"))
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "two_implementations"))
    blocks = re.findall(r"```python\n(.*?)```(?:\n\nprints\n\n```\n(.*?)```)?",
                        (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) >= 2
    assert any(shown for _, shown in blocks), "some block shows its output"
    namespace = {}
    for block, shown in blocks:
        capsys.readouterr()
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
        if shown:
            printed = capsys.readouterr().out.strip()
            assert prints_as_shown(printed, shown.strip()), (printed, shown)
    # The README registers a custom op, which holds its functions' globals (this namespace)
    # for the life of the process: let go of the reports and traces in it.
    namespace.clear()
