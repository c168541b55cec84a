"""test_training.py: numalign.training on real processes (gloo, CPU): data-parallel runs
against the single-process run (aligned, and a loss summed per shard caught), resumed runs
against uninterrupted ones (exact with the whole checkpoint; the optimizer state or the
random generator left out caught and named)."""
import random

import pytest
import torch

from numalign import training


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def mlp_with_dropout():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                               torch.nn.Linear(16, 4))


def summed_loss(model, batch):
    """Summed over the shard: DistributedDataParallel averages the shards' gradients, so the
    whole batch's gradient is off by the number of ranks (a known porting mistake)."""
    inputs, target = batch
    return torch.nn.functional.mse_loss(model(inputs), target, reduction="sum")


def adam(params):
    return torch.optim.Adam(params, lr=1e-2)


def _batch(n=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


@pytest.mark.parametrize("world,dtype", [(2, torch.float32), (4, torch.float32), (2, torch.bfloat16)])
def test_data_parallel_equals_the_single_process_run(world, dtype):
    report = training.check_data_parallel(mlp, _batch(), world, dtype, steps=2)
    assert report.aligned, str(report)
    names = {t["name"] for t in report.tensors}
    per_rank = {"step0.loss", "step1.loss"} | {f"step{k}.{kind}.{p}" for k in (0, 1)
                for kind in ("grad", "param") for p in ("0.weight", "0.bias", "2.weight", "2.bias")}
    assert names == {f"rank{r}/{n}" for r in range(world) for n in per_rank}
    # Data parallelism really ran: the gradients are not bitwise the single process's.
    assert any(t["frac_diff"] for t in report.tensors if ".grad." in t["name"])


def test_a_loss_summed_per_shard_is_caught():
    report = training.check_data_parallel(mlp, _batch(), 2, torch.float32, loss_fn=summed_loss)
    assert not report.aligned
    failing = {t["name"].split("/", 1)[1] for t in report.tensors if t["verdict"] == "fail"}
    assert {"step0.grad.0.weight", "step0.grad.2.bias", "step0.param.2.weight"} <= failing
    assert report.tensors[0]["ratio"] > 1e3 * report.tensors[0]["limit"]


def test_a_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(RuntimeError, match="a batch of 30 does not split evenly over 4 ranks"):
        training.check_data_parallel(mlp, _batch(30), 4)


def _data(steps=6):
    return [_batch(16, seed) for seed in range(steps)]


def test_resume_with_the_whole_checkpoint_is_exact():
    report = training.check_resume(mlp_with_dropout, adam, _data(), total_steps=6, resume_at=3)
    assert report.aligned, str(report)
    assert report.first_differing is None
    names = {t["name"] for t in report.tensors}
    assert "optimizer.0.weight.exp_avg_sq" in names and "param.3.bias" in names
    assert all(t["rule"] == "exact" for t in report.tensors)


def save_without_optimizer(model, optimizer, path):
    torch.save({"model": model.state_dict(), "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate()}, path)


def load_without_optimizer(model, optimizer, path):
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    torch.set_rng_state(state["torch_rng"])


def save_without_rng(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def load_without_rng(model, optimizer, path):
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@pytest.mark.parametrize("checkpoint,model_fn", [
    ((save_without_optimizer, load_without_optimizer), mlp),
    ((save_without_rng, load_without_rng), mlp_with_dropout),
])
def test_a_checkpoint_that_leaves_state_out_is_caught_and_named(checkpoint, model_fn):
    report = training.check_resume(model_fn, adam, _data(), total_steps=6, resume_at=3,
                                   checkpoint=checkpoint)
    assert not report.aligned
    assert report.first_differing == "param.0.weight", "the first parameter in model order"
    assert str(report).startswith("first tensor that differs: param.0.weight\n")


def test_resume_with_a_ulp_rule_and_bad_steps():
    report = training.check_resume(mlp, training.sgd, _data(), total_steps=4, resume_at=2,
                                   rule="ulp:2")
    assert report.aligned and all(t["rule"] == "ulp:2" for t in report.tensors)
    with pytest.raises(ValueError, match="resume_at 4: it must lie strictly between 0 and total_steps 4"):
        training.check_resume(mlp, training.sgd, _data(), total_steps=4, resume_at=4)


def test_functions_that_cannot_reach_a_fresh_process_are_refused_clearly():
    with pytest.raises(TypeError, match="must be importable by name .*no lambdas"):
        training.check_resume(lambda: torch.nn.Linear(8, 4), adam, _data(), 4, 2)
