"""capture.py: run a function or module forward and backward in one precision and record
outputs, input grads and parameter grads as a Trace, so truth / ref / test runs line up."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import platform

import torch

from ._tensors import flatten, map_tensors
from .trace import Trace


def fingerprint(t: torch.Tensor) -> str:
    """A hash of a tensor's dtype, shape and bytes: equal inputs give equal fingerprints."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + h.hexdigest()[:32]


@contextlib.contextmanager
def tf32_off():
    """TF32 off for matmul and cuDNN during the run, restored after, even on exceptions."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _cast(x, dtype, device):
    def leaf(t):
        y = t.detach().to(device)
        if y.is_floating_point():
            y = y.to(dtype)
        return y.requires_grad_(y.is_floating_point())
    return map_tensors(x, leaf)


def _upstream_grad(out: torch.Tensor, name: str, seed: int) -> torch.Tensor:
    """A fixed random gradient per output, drawn in float64 from (seed, name) and cast, so
    every precision's run receives the same one."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2 ** 63 - 1))
    return torch.randn(out.shape, dtype=torch.float64, generator=g).to(out.dtype).to(out.device)


def _as_args(inputs):
    return inputs if isinstance(inputs, (list, tuple, dict)) else (inputs,)


def _module_copy(module, dtype, device):
    """A deep copy of ``module`` with its floating parameters cast: the caller's model is
    left untouched."""
    copied = copy.deepcopy(module).to(device)
    for p in copied.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    copied.zero_grad(set_to_none=True)
    return copied


def _prepare(fn, inputs, dtype, device):
    """(callable, module copy or None, cast inputs, fingerprints of inputs and parameters)."""
    inputs_list = _as_args(inputs)
    fingerprints = {f"input.{k}": fingerprint(v) for k, v in flatten(inputs_list).items()
                    if isinstance(v, torch.Tensor)}
    module = None
    if isinstance(fn, torch.nn.Module):
        fingerprints.update({f"param.{name}": fingerprint(p) for name, p in fn.named_parameters()})
        module = fn = _module_copy(fn, dtype, device)
    return fn, module, _cast(inputs_list, dtype, device), fingerprints


def _forward_backward(call, args, seed):
    """Runs forward, then backward with fixed upstream gradients; returns {out name: tensor}."""
    result = call(**args) if isinstance(args, dict) else call(*args)
    outputs = {f"out.{k}" if k != "output" else "out": v for k, v in flatten(result).items()}
    grads_for = [(n, o) for n, o in outputs.items() if isinstance(o, torch.Tensor) and o.requires_grad]
    if grads_for:
        torch.autograd.backward([o for _, o in grads_for],
                                [_upstream_grad(o, n, seed) for n, o in grads_for])
    return outputs


def _end_grads(args, module):
    """{name: grad} of the inputs and parameters after backward."""
    grads = {}
    for k, v in flatten(args).items():
        if isinstance(v, torch.Tensor) and v.grad is not None:
            grads[f"grad.input.{k}"] = v.grad.detach()
    if module is not None:
        for name, p in module.named_parameters():
            if p.grad is not None:
                grads[f"grad.param.{name}"] = p.grad.detach()
    return grads


def _metadata(dtype, device, seed, fingerprints, order, tags, inputs=None):
    meta = {
        "dtype_recipe": str(dtype).replace("torch.", ""),
        "device": str(device),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                 "cudnn": torch.backends.cudnn.allow_tf32},
        "seed": seed,
        "order": order,
        "tags": tags,
        "fingerprints": fingerprints,
    }
    if inputs:
        meta["inputs"] = inputs
    return meta


def _kind_of(name):
    return ("output" if name.startswith("out") else
            "input-grad" if name.startswith("grad.input") else "param-grad")


def run_fwd_bwd(fn, inputs, dtype, *, seed: int = 0, device="cpu") -> Trace:
    """Runs ``fn(*inputs)`` (or ``fn(**inputs)`` for a dict) in ``dtype`` on ``device``, then
    backward with fixed upstream gradients; returns a Trace of ``out.*``, ``grad.input.*`` and
    ``grad.param.*`` in execution order. ``fn`` (a module is deep-copied) is left untouched."""
    call, module, args, fingerprints = _prepare(fn, inputs, dtype, device)
    with tf32_off():
        outputs = _forward_backward(call, args, seed)
        tensors = {n: o.detach() for n, o in outputs.items()}
        tensors.update(_end_grads(args, module))
        metadata = _metadata(dtype, device, seed, fingerprints, list(tensors),
                             {n: {"kind": _kind_of(n)} for n in tensors})
    return Trace(tensors, metadata=metadata)


def trace_model(model, inputs, dtype, *, modules=None, seed: int = 0, save_to=None,
                device="cpu") -> Trace:
    """Runs ``model`` forward and backward like ``run_fwd_bwd`` and records every selected
    submodule on the way: its inputs (``PATH.in``), outputs (``PATH.out``), the gradients it
    passes upstream (``PATH.grad``) and those it received (``PATH.grad_out``); a module
    called again gets a call index (``layers.0.attn#1.out``). ``modules``: globs on module
    paths (default all). The trace keeps execution order and, per tensor, its module, kind
    and call, and what it was computed from, so a judgement can name the first module to
    go wrong. With ``save_to``, tensors stream to that file as they are produced (memory
    stays bounded by the largest tensor) and the returned Trace maps it."""
    from ._module_hooks import ModuleRecorder

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"trace_model needs a torch.nn.Module, got {type(model).__name__}")
    call, module, args, fingerprints = _prepare(model, inputs, dtype, device)
    recorder = ModuleRecorder(module, modules, save_to)
    try:
        with tf32_off(), recorder.hooked():
            outputs = _forward_backward(call, args, seed)
            for n, o in outputs.items():
                recorder.record(n, o, module="", kind="output")
            for n, g in _end_grads(args, module).items():
                owner = n[len("grad.param."):].rpartition(".")[0] if n.startswith("grad.param.") else ""
                recorder.record(n, g, module=owner, kind=_kind_of(n))
            metadata = _metadata(dtype, device, seed, fingerprints, recorder.order, recorder.tags,
                                 recorder.inputs)
    except BaseException:
        recorder.abort()
        raise
    return recorder.finish(metadata)


# isolate() lives in isolation.py (it judges); imported here so users find it next to
# trace_model. At the end: isolation.py imports this module's helpers.
from .isolation import isolate  # noqa: E402,F401
