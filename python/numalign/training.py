"""training.py: questions about a training loop. Does a data-parallel step equal the
single-process step? Does a run resumed from a checkpoint continue exactly where it
stopped? Every run is a fresh process (numalign.distributed.spawn): nothing leaks from the
caller's process or from one run into the next. ``model_fn``, ``loss_fn``,
``optimizer_fn`` and ``checkpoint`` functions must be module-level (importable by name)."""
from __future__ import annotations

import os
import random
import sys
import tempfile

import torch
import torch.distributed as dist

from . import _core, distributed
from ._runs import _held_as
from ._tensors import map_tensors
from .api import _judge
from .trace import Trace


def mse_loss(model, batch):
    """The default loss: ``batch`` is ``(inputs, target)``, the loss their mean squared error."""
    inputs, target = batch
    return torch.nn.functional.mse_loss(model(inputs), target)


def sgd(params):
    """The default optimizer: SGD with momentum, so that its state matters on resume."""
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _cast(batch, dtype):
    return map_tensors(batch, lambda t: t.to(dtype) if t.is_floating_point() else t)


def _shard(batch, rank, world):
    def part(t):
        if t.shape[0] % world:
            raise ValueError(f"a batch of {t.shape[0]} does not split evenly over {world} ranks "
                             f"(data parallelism equals the whole batch only for equal shards)")
        n = t.shape[0] // world
        return t[rank * n:(rank + 1) * n]
    return map_tensors(batch, part)


def _train(model, named, optimizer_fn, loss_fn, batch, steps, record_loss):
    """``steps`` optimizer steps on ``batch``; each step's gradients and updated parameters."""
    optimizer = optimizer_fn(model.parameters())
    out = {}
    for k in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        out[f"step{k}.loss"] = record_loss(loss.detach())
        for n, p in named.named_parameters():
            if p.grad is not None:
                out[f"step{k}.grad.{n}"] = p.grad.detach().clone()
        optimizer.step()
        for n, p in named.named_parameters():
            out[f"step{k}.param.{n}"] = p.detach().clone()
    return out


def _single_process_runs(model_fn, optimizer_fn, loss_fn, batch, dtype, steps, seed):
    """The reference (``dtype``) and the truth (float64), each on the whole batch. The truth
    starts from what the runs hold: the weights, buffers and batch cast to ``dtype``, widened."""
    runs = []
    for run_dtype in (dtype, torch.float64):
        torch.manual_seed(seed)
        model = model_fn().to(dtype).to(run_dtype)
        held = map_tensors(batch, lambda t: _held_as(t, run_dtype, dtype)
                           if t.is_floating_point() else t)
        runs.append(_train(model, model, optimizer_fn, loss_fn, held, steps, lambda loss: loss))
    return runs


def _data_parallel_rank(model_fn, optimizer_fn, loss_fn, batch, dtype, steps, seed, ref, truth,
                        options):
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    module = model_fn().to(dtype)
    model = DistributedDataParallel(module)

    def global_loss(loss):  # the whole batch's loss: the mean of the equal shards' losses
        total = loss.clone()
        dist.all_reduce(total)
        return total / world

    test = _train(model, module, optimizer_fn, loss_fn, _shard(_cast(batch, dtype), rank, world),
                  steps, global_loss)
    return distributed.judge(test, ref, truth, **options)


def check_data_parallel(model_fn, batch, world_size: int, dtype=torch.float32, steps: int = 1, *,
                        loss_fn=mse_loss, optimizer_fn=sgd, seed: int = 0, timeout: float = 300.0,
                        **options):
    """Trains ``model_fn()`` (seeded with ``seed``, cast to ``dtype``) for ``steps`` steps on
    ``batch`` twice: with DistributedDataParallel on ``world_size`` CPU processes (gloo), each
    on an equal shard of the batch, and in one process on all of it. Every rank's gradients,
    updated parameters and the loss of each step (``step<k>.grad.<param>``,
    ``step<k>.param.<param>``, ``step<k>.loss``) are judged against the single-process run,
    measured against the same single-process run in float64 (the measured rule; ``options`` as
    for ``numalign.judge``). Returns the merged Report, names prefixed ``rank<N>/``."""
    ref, truth = distributed.spawn(_single_process_runs, 1, (model_fn, optimizer_fn, loss_fn, batch,
                                                             dtype, steps, seed), timeout=timeout)[0]
    reports = distributed.spawn(_data_parallel_rank, world_size,
                                (model_fn, optimizer_fn, loss_fn, batch, dtype, steps, seed, ref,
                                 truth, options), timeout=timeout)
    return reports[0]


def save_everything(model, optimizer, path):
    """The default checkpoint: model and optimizer state and every random generator's."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
    if "numpy" in sys.modules:
        state["numpy_rng"] = sys.modules["numpy"].random.get_state()
    torch.save(state, path)


def load_everything(model, optimizer, path):
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if "numpy_rng" in state:
        import numpy

        numpy.random.set_state(state["numpy_rng"])


def _state(model, optimizer):
    """Parameters, buffers and the optimizer's state, by parameter name, in model order."""
    out = {f"param.{n}": p.detach().clone() for n, p in model.named_parameters()}
    out.update({f"buffer.{n}": b.detach().clone() for n, b in model.named_buffers()})
    by_id = {id(p): n for n, p in model.named_parameters()}
    for p in (p for g in optimizer.param_groups for p in g["params"]):
        for key, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"optimizer.{by_id[id(p)]}.{key}"] = value.detach().clone()
    return out


def _run_steps(model_fn, optimizer_fn, loss_fn, data, start, stop, seed, load_from, save_to,
               checkpoint):
    torch.manual_seed(seed)
    model = model_fn()
    optimizer = optimizer_fn(model.parameters())
    save, load = checkpoint
    if load_from is not None:
        load(model, optimizer, load_from)
    for k in range(start, stop):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, data[k % len(data)]).backward()
        optimizer.step()
    if save_to is not None:
        save(model, optimizer, save_to)
    return _state(model, optimizer)


def check_resume(model_fn, optimizer_fn, data, total_steps: int, resume_at: int, *,
                 loss_fn=mse_loss, rule: str = "exact", checkpoint=(save_everything, load_everything),
                 seed: int = 0, timeout: float = 300.0):
    """Trains ``model_fn()`` with ``optimizer_fn(params)`` on ``data[k % len(data)]`` at step
    k, for ``total_steps`` steps without a stop; and again for ``resume_at`` steps, saving a
    checkpoint (``checkpoint = (save(model, optimizer, path), load(model, optimizer,
    path))``, by default model, optimizer and random generator states), then, in a fresh
    process, loading it and training to ``total_steps``. Each run is its own process. The
    parameters, buffers and optimizer state (``param.<name>``, ``buffer.<name>``,
    ``optimizer.<param>.<key>``) of the resumed run are judged against the uninterrupted
    run with ``rule`` (``"exact"``, or ``"ulp:K"``). The Report's ``first_differing`` names
    the first tensor, in that order, that differs."""
    if _core.rule_kind(rule, "check_resume") not in ("exact", "ulp"):
        raise ValueError(f"rule {rule!r}: check_resume takes 'exact' or 'ulp:K'")
    if not 0 < resume_at < total_steps:
        raise ValueError(f"resume_at {resume_at}: it must lie strictly between 0 and "
                         f"total_steps {total_steps}")
    args = (model_fn, optimizer_fn, loss_fn, list(data))
    uninterrupted = distributed.spawn(_run_steps, 1, (*args, 0, total_steps, seed, None, None,
                                                      checkpoint), timeout=timeout)[0]
    with tempfile.TemporaryDirectory(prefix="numalign-resume-") as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        distributed.spawn(_run_steps, 1, (*args, 0, resume_at, seed, None, path, checkpoint),
                          timeout=timeout)
        resumed = distributed.spawn(_run_steps, 1, (*args, resume_at, total_steps, seed, path,
                                                    None, checkpoint), timeout=timeout)[0]
    order = list(uninterrupted)
    # The caller chose the rule, loosened or not: that choice is the override's reason.
    return _judge(Trace(resumed), Trace(uninterrupted, metadata={"order": order}),
                  rules={"*": (rule, f"check_resume(rule={rule!r})")}, first_failing=True)
