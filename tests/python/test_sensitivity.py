"""test_sensitivity.py: numalign.sensitivity and `numalign sensitivity` plant known bugs in a
copy of the test run and say which the rule would catch; the inputs are never modified."""
import json

import torch
from safetensors.torch import save_file

import numalign


def _runs(tmp_path, scale=1 + 2 ** -10):
    """bf16 runs of three tensors; the test run scales the truth by ``scale`` first (the
    default leans every element away from zero: a biased run)."""
    g = torch.Generator().manual_seed(0)
    truth = {f"t{i}": torch.randn(4096, dtype=torch.float64, generator=g) for i in range(3)}
    ref = {n: t.to(torch.bfloat16) for n, t in truth.items()}
    test = {n: (t * scale).to(torch.bfloat16) for n, t in truth.items()}
    paths = []
    for role, tensors in (("test", test), ("ref", ref), ("truth", truth)):
        save_file(tensors, tmp_path / f"{role}.safetensors")
        paths.append(tmp_path / f"{role}.safetensors")
    return paths


def _by_bug(result):
    return {b["bug"].split(" (")[0]: b for b in result["bugs"]}


def test_python_and_cli_agree_and_inputs_are_untouched(tmp_path, cli):
    paths = _runs(tmp_path)
    before = [p.read_bytes() for p in paths]
    py = numalign.sensitivity(*paths)
    p = cli("sensitivity", *paths, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == py
    assert [p.read_bytes() for p in paths] == before
    bugs = _by_bug(py)
    assert not bugs["(none: the run as it is)"]["caught"]
    assert bugs["one element NaN"]["caught"] and bugs["one element NaN"]["planted"] == 3
    assert not bugs["2 ULP on 1% of the elements"]["caught"], "rmse averages a sparse error away"
    assert not bugs["truncation toward zero"]["caught"]


def test_the_rule_and_options_change_what_is_caught(tmp_path, cli):
    paths = _runs(tmp_path)
    assert _by_bug(numalign.sensitivity(*paths, rules="ulp:1"))["2 ULP on 1% of the elements"]["caught"]
    # the default test run is biased: with the bias check it fails as it is, and no planted
    # bug can be said to be caught by it
    biased = _by_bug(numalign.sensitivity(*paths, check_bias=True))
    assert biased["(none: the run as it is)"]["caught"]
    assert not biased["truncation toward zero"]["caught"]
    assert biased["truncation toward zero"]["why_not"] == "every tensor it was planted in fails as it is"
    unbiased = _by_bug(numalign.sensitivity(*_runs(tmp_path, scale=1), check_bias=True))
    assert not unbiased["(none: the run as it is)"]["caught"]
    assert unbiased["truncation toward zero"]["caught"]
    text = cli("sensitivity", *paths, "--rule", "exact").stdout
    assert "every planted bug would fail this rule" in text
    assert "settings: rule exact" in text
