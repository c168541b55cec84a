"""test_front_end_parity.py: the CLI and Python call one judge in the core, so the same files,
policy and arguments give the same report (text, JSON, warnings, exit code), and options
resolve in one order in both: defaults < policy file < arguments given."""
import json

import pytest
import torch

import numalign
from numalign import Trace


def _runs(tmp_path, *, drop_from_truth=(), test_only=(), bug=None):
    """A bf16 run of four tensors (float64 truth), saved as three traces; `bug` names a
    tensor of test whose error is 20x the reference's."""
    g = torch.Generator().manual_seed(7)
    truth = {f"layers.{i}.out": torch.randn(1500, dtype=torch.float64, generator=g) for i in range(3)}
    truth["head.logits"] = torch.randn(40, 30, dtype=torch.float64, generator=g)
    noise = {n: 3e-3 * torch.randn(t.shape, dtype=torch.float64, generator=g) for n, t in truth.items()}
    ref = {n: (t + noise[n]).to(torch.bfloat16) for n, t in truth.items()}
    test = {n: (t - noise[n]).to(torch.bfloat16) for n, t in truth.items()}
    if bug:
        test[bug] = (truth[bug] + 20 * noise[bug]).to(torch.bfloat16)
    for n in test_only:
        test[n] = torch.zeros(4, dtype=torch.bfloat16)
    order = list(truth)
    paths = {}
    for role, tensors in (("test", test), ("ref", ref), ("truth", truth)):
        if role == "truth":
            tensors = {n: t for n, t in tensors.items() if n not in drop_from_truth}
        paths[role] = tmp_path / f"{role}.safetensors"
        Trace(tensors, metadata={"role": role, "order": order,
                                 "dtype_recipe": "float64" if role == "truth" else "bfloat16"}).save(paths[role])
    return paths


CASES = {
    "aligned": (dict(), [], {}),
    "truth missing a tensor": (dict(drop_from_truth=["layers.1.out"]), [], {}),
    "a bug and a test-only tensor": (dict(bug="layers.2.out", test_only=["extra"]), [], {}),
    "only": (dict(bug="layers.2.out"), ["--only", "layers.*", "--only", "head.*"],
             {"only": ["layers.*", "head.*"]}),
    "rule override": (dict(), ["--rule", "head.*=ulp:1", "--check-bias"],
                      {"rules": ["head.*=ulp:1"], "check_bias": True}),
    "abs default rule": (dict(bug="layers.0.out"), ["--rule", "abs:0.05", "--tol", "0"],
                         {"rules": "abs:0.05", "tol": 0.0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cli_and_python_give_the_same_report(tmp_path, cli, case):
    layout, cli_args, py_args = CASES[case]
    p = _runs(tmp_path, **layout)
    files = [p["test"], p["ref"], p["truth"]]
    text = cli("judge", *files, *cli_args)
    as_json = cli("judge", *files, *cli_args, "--format", "json")
    report = numalign.judge(*map(str, files), **py_args)
    assert text.returncode == report.exit_code == as_json.returncode, text.stderr
    assert str(report) == text.stdout
    assert report.to_json() == as_json.stdout
    # Tensors in memory judge the same; only the title (the paths) is absent.
    in_memory = numalign.judge(*(Trace.load(f) for f in files), **py_args)
    assert in_memory.to_json() == as_json.stdout
    if case == "truth missing a tensor":
        assert "1 tensor(s) of ref are missing from truth" in report.warnings
    if case == "a bug and a test-only tensor":
        assert not report.aligned and report.summary["worst"] == "layers.2.out"
        assert any("only in test, not judged: extra" in w for w in report.warnings)
    if case == "only":
        assert {t["name"] for t in report.tensors} == {"layers.0.out", "layers.1.out",
                                                       "layers.2.out", "head.logits"}


def _tol_case(tmp_path):
    """One tensor whose verdict hangs on tol: within 0.05 of ref (fast path), far outside
    1e-4 and the rmse allowance."""
    g = torch.Generator().manual_seed(3)
    truth = torch.randn(2000, dtype=torch.float64, generator=g)
    ref = (truth + 1e-3 * torch.randn(2000, dtype=torch.float64, generator=g)).float()
    test = (truth + 5e-3 * torch.randn(2000, dtype=torch.float64, generator=g)).float()
    paths = [tmp_path / f"{r}.safetensors" for r in ("test", "ref", "truth")]
    for path, t in zip(paths, (test, ref, truth)):
        Trace({"y": t}).save(path)
    return paths


@pytest.mark.parametrize("tol_given", [None, 1e-4, 0.05])
@pytest.mark.parametrize("policy_tol", [None, 0.05, 1e-4])
def test_precedence_defaults_then_policy_then_arguments(tmp_path, cli, tol_given, policy_tol):
    files = _tol_case(tmp_path)
    policy = tmp_path / "policy.json"
    # same's tol decides (its allclose fast path); the measured rule has none.
    policy.write_text(json.dumps({"default": "same"} if policy_tol is None
                                 else {"default": "same", "tol": policy_tol}))
    expected_tol = tol_given if tol_given is not None else (policy_tol if policy_tol is not None else 1e-4)
    cli_args = ["--policy", policy] + ([] if tol_given is None else ["--tol", tol_given])
    proc = cli("judge", *files, *cli_args, "--format", "json")
    report = numalign.judge(*map(str, files), policy=policy, tol=tol_given)
    assert report.to_json() == proc.stdout
    assert report.aligned == (expected_tol == 0.05), report
    assert {1e-4: "tol 0.0001", 0.05: "tol 0.05"}[expected_tol] in report.summary["settings"]


def test_a_flag_given_overrides_the_policy_both_ways(tmp_path):
    files = _tol_case(tmp_path)
    policy = {"check_bias": True, "equal_nan": True}
    on = numalign.judge(*map(str, files), policy=policy)
    assert "equal_nan" in on.summary["settings"] and "bias check" in on.summary["settings"]
    off = numalign.judge(*map(str, files), policy=policy, equal_nan=False, check_bias=False)
    assert "equal_nan" not in off.summary["settings"] and "bias" not in off.summary["settings"]


def test_bad_options_raise_before_judging():
    with pytest.raises(numalign.NumalignError, match="tol"):
        numalign.judge({"a": torch.ones(2)}, {"a": torch.ones(2)}, tol=-1.0)
    with pytest.raises(numalign.NumalignError, match="empty glob"):
        numalign.judge({"a": torch.ones(2)}, {"a": torch.ones(2)}, rules=["=ulp:1"])
    with pytest.raises(numalign.NumalignError, match="has no reason"):
        numalign.judge({"a": torch.ones(2)}, {"a": torch.ones(2)}, rules={"a": "ulp:4"})
