"""test_fail_closed.py: verdicts that must not say ALIGNED (issue "Verdicts that fail closed"):
a judgement of nothing, names that collide when flattened, ..."""
import json

import numpy as np
import pytest

import numalign
from numalign import Trace


def _save(path, tensors):
    Trace(tensors).save(str(path))
    return str(path)


# --- nothing judged is "could not judge", never a pass -----------------------------------


def test_empty_ref_with_a_failing_test_could_not_judge(tmp_path):
    bad = {"a": np.full(8, 9.0, np.float32)}
    report = numalign.judge(bad, {}, None)
    assert not report.aligned and report.exit_code == 2
    assert report.could_not_judge == ["nothing was judged: ref holds no tensors"]
    with pytest.raises(AssertionError, match="could not judge: nothing was judged"):
        numalign.assert_aligned(bad, {}, None)


def test_only_matching_nothing_could_not_judge(tmp_path):
    x = {"a": np.ones(8, np.float32)}
    report = numalign.judge(x, x, None, rules="exact", only=["zzz*"])
    assert report.exit_code == 2
    assert "zzz*" in report.could_not_judge[0]
    assert str(report).startswith("could not judge this run:")
    assert str(report).rstrip().splitlines()[-1].startswith("COULD NOT JUDGE (nothing was judged")


def test_cli_only_matching_nothing_and_empty_index_exit_2(tmp_path, cli):
    ref = _save(tmp_path / "ref.safetensors", {"a": np.ones(8, np.float32)})
    test = _save(tmp_path / "test.safetensors", {"a": np.full(8, 3.0, np.float32)})
    proc = cli("judge", test, ref, "--rule", "exact", "--only", "nope")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "COULD NOT JUDGE" in proc.stdout
    # An index whose weight_map is empty is a trace of nothing.
    index = tmp_path / "empty.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    for fmt in ("text", "json", "junit"):
        proc = cli("judge", test, str(index), "--rule", "exact", "--format", fmt)
        assert proc.returncode == 2, (fmt, proc.stdout + proc.stderr)
    proc = cli("judge", test, str(index), "--rule", "exact", "--format", "json")
    out = json.loads(proc.stdout)
    assert out["aligned"] is False and out["could_not_judge"]


def test_a_missing_test_tensor_still_fails_by_name():
    report = numalign.judge({}, {"a": np.ones(4, np.float32)}, None, rules="exact")
    assert report.exit_code == 1 and report.could_not_judge == []
    assert report["a"]["reason"] == "missing from test"


# --- flattening refuses names that collide ------------------------------------------------


def test_nested_names_that_collide_are_refused():
    good, bad = np.ones(4, np.float32), np.full(4, 5.0, np.float32)
    with pytest.raises(ValueError, match=r"'a\.b'.*\['a\.b'\].*\['a'\]\['b'\]"):
        numalign.judge({"a.b": bad, "a": {"b": good}}, {"a.b": good}, None, rules="exact")
    with pytest.raises(ValueError, match="collide|flatten to the name '0'"):
        numalign.judge({0: good, "0": bad}, {"0": good}, None, rules="exact")
    with pytest.raises(ValueError, match="flatten to the name 'x.0'"):
        Trace({"x": [good], "x.0": bad})


# --- integers of every width are compared exactly ------------------------------------------


@pytest.mark.parametrize("dtype,test,ref", [
    (np.int64, 2**53 + 1, 2**53),
    (np.int64, 2**63 - 1, 2**63 - 2),
    (np.int64, -2**63 + 1, -2**63),
    (np.uint64, 2**64 - 1, 2**64 - 1000),
])
def test_64_bit_integers_are_not_rounded_through_double(tmp_path, cli, dtype, test, ref):
    t = _save(tmp_path / "test.safetensors", {"i": np.array([test], dtype)})
    r = _save(tmp_path / "ref.safetensors", {"i": np.array([ref], dtype)})
    for rule in ("ulp:0", "abs:0", "exact"):
        assert cli("judge", t, r, "--rule", rule).returncode == 1, rule
        assert not numalign.judge(t, r, None, rules=rule).aligned, rule
    assert cli("consistent", r, t, "--rule", "ulp:0").returncode == 1
    distance = abs(test - ref)
    loose = numalign.judge(t, r, None, rules={"*": (f"ulp:{distance}", "the exact distance")})
    assert loose.aligned, str(loose)
    if distance > 1:
        tight = numalign.judge(t, r, None, rules={"*": (f"ulp:{distance - 1}", "one short")})
        assert not tight.aligned


# --- runs on random draws (dropout in training mode, the RNG) ----------------------------


def _dropout_net():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.1))


def _three_runs(model, capture_fn):
    import torch
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return [capture_fn(model, (x,), dtype) for dtype in
            (torch.bfloat16, torch.bfloat16, torch.float64)]


@pytest.mark.parametrize("capture", ["run_fwd_bwd", "trace_model"])
def test_dropout_in_training_could_not_judge(capture):
    from numalign import capture as cap
    test, ref, truth = _three_runs(_dropout_net().train(), getattr(cap, capture))
    assert test.metadata["random"]["dropout"] == ["1"]
    assert test.metadata["random"]["generators"] == ["cpu"]
    report = numalign.judge(test, ref, truth)
    assert report.exit_code == 2
    reason = report.could_not_judge[0]
    assert "random" in reason and "1" in reason and "eval()" in reason
    with pytest.raises(AssertionError, match="could not judge"):
        numalign.assert_aligned(test, ref, truth)


def test_the_same_model_in_eval_mode_is_judged():
    from numalign import capture as cap
    test, ref, truth = _three_runs(_dropout_net().eval(), cap.run_fwd_bwd)
    assert test.metadata["random"] == {"generators": [], "dropout": []}
    report = numalign.judge(test, ref, truth)
    assert report.could_not_judge == [] and report.aligned


def test_randomness_declared_shared_is_judged_with_its_reason_shown():
    from numalign import capture as cap
    # the declaration is the user's to make; numalign judges (whatever the verdict) and says so
    test, ref, truth = _three_runs(_dropout_net().train(), cap.run_fwd_bwd)
    report = numalign.judge(test, ref, truth, shared_randomness="same seed, same mask shapes")
    assert report.could_not_judge == [] and report.exit_code in (0, 1)
    assert "same seed, same mask shapes" in str(report)
    with pytest.raises(ValueError, match="shared randomness"):
        numalign.judge(test, ref, truth, shared_randomness="  ")


def test_cli_refuses_random_runs_unless_declared(tmp_path, cli):
    from numalign import capture as cap
    paths = []
    for name, trace in zip(("test", "ref", "truth"),
                           _three_runs(_dropout_net().train(), cap.run_fwd_bwd)):
        paths.append(str(tmp_path / f"{name}.safetensors"))
        trace.save(paths[-1])
    refused = cli("judge", *paths)
    assert refused.returncode == 2 and "random" in refused.stdout
    declared = cli("judge", *paths, "--shared-randomness", "same seed")
    assert declared.returncode in (0, 1) and "same seed" in declared.stdout


def test_isolate_of_a_model_drawing_random_numbers_could_not_judge():
    """Isolation's runs each draw their own dropout masks: even a model against itself is
    not a judgement (it said ALIGNED before, each module within its own noise)."""
    model = _dropout_net().train()
    import torch
    from numalign.capture import isolate
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    report = isolate(model, model, (x,), torch.bfloat16)
    assert report.exit_code == 2 and not report.aligned
    assert "random" in report.could_not_judge[0] and "eval()" in report.could_not_judge[0]
    judged = isolate(model, model, (x,), torch.bfloat16, shared_randomness="a model against itself")
    assert judged.could_not_judge == []
    # Only the modules isolate reruns count: the Linear alone draws nothing.
    alone = isolate(model, model, (x,), torch.bfloat16, modules="0")
    assert alone.could_not_judge == [] and alone.aligned
    model.eval()
    assert isolate(model, model, (x,), torch.bfloat16).aligned
