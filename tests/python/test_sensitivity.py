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
    # The default rule's bias check fails the biased run as it is: no planted bug can be
    # said to be caught there.
    bugs = _by_bug(py)
    assert bugs["(none: the run as it is)"]["caught"]
    assert bugs["truncation toward zero"]["why_not"] == "every tensor it was planted in fails as it is"
    # same()'s rule passes it, and misses the sparse error and truncation.
    same = _by_bug(numalign.sensitivity(*paths, rules="same"))
    assert not same["(none: the run as it is)"]["caught"]
    assert same["one element NaN"]["caught"] and same["one element NaN"]["planted"] == 3
    assert not same["2 ULP on 1% of the elements"]["caught"], "same()'s RMSE averages it away"
    assert not same["truncation toward zero"]["caught"]
    # On an unbiased run the default rule sees both: the worst element and the bias check.
    unbiased = _by_bug(numalign.sensitivity(*_runs(tmp_path, scale=1)))
    assert not unbiased["(none: the run as it is)"]["caught"]
    assert unbiased["2 ULP on 1% of the elements"]["caught"]
    assert unbiased["truncation toward zero"]["caught"]


def test_the_rule_and_options_change_what_is_caught(tmp_path, cli):
    paths = _runs(tmp_path)
    assert _by_bug(numalign.sensitivity(*paths, rules="ulp:1"))["2 ULP on 1% of the elements"]["caught"]
    # the default test run is biased: same's rule with the bias check fails it as it is, and
    # no planted bug can be said to be caught by it
    biased = _by_bug(numalign.sensitivity(*paths, rules="same", check_bias=True))
    assert biased["(none: the run as it is)"]["caught"]
    assert not biased["truncation toward zero"]["caught"]
    assert biased["truncation toward zero"]["why_not"] == "every tensor it was planted in fails as it is"
    unbiased = _by_bug(numalign.sensitivity(*_runs(tmp_path, scale=1), rules="same",
                                            check_bias=True))
    assert not unbiased["(none: the run as it is)"]["caught"]
    assert unbiased["truncation toward zero"]["caught"]
    text = cli("sensitivity", *paths, "--rule", "exact").stdout
    assert "every planted bug would fail this rule" in text
    assert "settings: rule exact" in text
