"""_runs.py: running a function or module forward and backward in one precision, shared by
capture (which records the runs) and isolation (which reruns each module on its own)."""
from __future__ import annotations

import contextlib
import copy
import fnmatch
import hashlib

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import _core, _precision
from ._tensors import cache_tensor_names, flatten, map_tensors


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


def dtype_name(dtype):
    """"bfloat16" for torch.bfloat16: how metadata and messages name a dtype."""
    return str(dtype).replace("torch.", "")


def _held_as(t, dtype, values_of=None):
    """A floating tensor in ``dtype``; with ``values_of`` (a truth's), first rounded to that
    dtype, as the run under judgement holds it, then widened (exactly, to float64). The
    rounding is the truth's input, not its computation: the float64 watch of a truth run
    (_precision.py), which would keep the cast float64, does not see it."""
    if values_of is None:
        return t.to(dtype)
    with _disable_current_modes():
        return t.to(values_of).to(dtype)


def _cast(x, dtype, device, values_of=None):
    def leaf(t):
        y = t.detach().to(device)
        if y.is_floating_point():
            y = _held_as(y, dtype, values_of)
        return y.requires_grad_(y.is_floating_point())
    return map_tensors(x, leaf)


def check_truth_of(dtype, truth_of):
    """``truth_of`` names the dtype of the runs a float64 truth judges; a run in that dtype
    itself may name it too (then nothing changes), so one call makes all three runs. Returns
    the dtype whose values the run computes on: ``truth_of`` for the truth, else None."""
    if truth_of is None:
        return None
    if not (isinstance(truth_of, torch.dtype) and truth_of.is_floating_point):
        raise ValueError(f"truth_of must be the floating dtype of the runs judged against this "
                         f"truth (torch.bfloat16, ...), got {truth_of!r}")
    if dtype not in (torch.float64, truth_of):
        raise ValueError(f"truth_of={truth_of} is for the float64 truth of {truth_of} runs (or a "
                         f"{truth_of} run itself), not a {dtype_name(dtype)} run")
    return truth_of if dtype == torch.float64 else None


def _upstream_grad(out: torch.Tensor, name: str, seed: int, values_of=None) -> torch.Tensor:
    """A fixed gradient per output, drawn by the core from (seed, name): values k / 128 with
    |k| <= 222 (about unit variance; see numalign/upstream_gradient.hpp), which bf16, fp16,
    float32 and float64 hold exactly, so every run, on every machine and whatever the dtype
    of its outputs, receives the same one (recorded as ``UPSTREAM_GRADIENT``); a truth's
    (``values_of``) is rounded as its runs' is where their dtype holds fewer bits (fp8)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    values = torch.from_numpy(_core.upstream_gradient(int.from_bytes(digest[:8], "little"),
                                                      out.numel()))
    return _held_as(values.reshape(out.shape).to(out.device), out.dtype, values_of)


UPSTREAM_GRADIENT = _core.UPSTREAM_GRADIENT_RECIPE


def _as_args(inputs):
    return inputs if isinstance(inputs, (list, tuple, dict)) else (inputs,)


def _cast_state_buffers(module, dtype, values_of=None):
    """Floating buffers that are part of the model's state (persistent: saved with it, as
    BatchNorm's running statistics are) cast with the parameters, as torch's ``Module.to``
    casts them, and with ``values_of`` first rounded as a ``values_of`` run holds them.
    Non-persistent buffers (constants a model derives when built, such as rotary
    frequencies) keep their dtype, as ``from_pretrained(torch_dtype=...)`` leaves them."""
    for m in module.modules():
        for name, b in list(m._buffers.items()):
            if (b is not None and b.is_floating_point()
                    and name not in m._non_persistent_buffers_set):
                setattr(m, name, _held_as(b, dtype, values_of))


def _module_copy(module, dtype, device, float64_truth="keep", values_of=None):
    """A deep copy of ``module`` with its floating parameters and state buffers cast (see
    _cast_state_buffers): the caller's model is left untouched. Each parameter is cast
    straight from the original (the deep copy is handed the cast one), so its data is
    copied once, not copied and then cast; tied parameters stay tied. A float64 copy whose
    truth is kept float64 (``float64_truth`` "keep", see _precision.py) has its other
    floating buffers cast to float64 too; with ``values_of``, its parameters and state
    buffers are those of a ``values_of`` run, widened (other buffers keep their own dtype in
    every run, so widening them is already what such a run holds)."""
    memo = {}
    for p in module.parameters():  # each shared parameter once
        if id(p) not in memo:
            data = p.detach()
            if p.is_floating_point() and values_of is not None:
                data = data.to(device=device, dtype=values_of)
            data = data.to(device=device, dtype=dtype if p.is_floating_point() else None,
                           copy=True)
            memo[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
    copied = copy.deepcopy(module, memo).to(device)
    copied.zero_grad(set_to_none=True)
    _cast_state_buffers(copied, dtype, values_of)
    if dtype == torch.float64 and float64_truth == "keep":
        _precision.cast_buffers_to_float64(copied)
    return copied


def _generator_states():
    """{name: state} of the global generators a run can draw from: the CPU one, and each
    CUDA device's once CUDA is initialized (asking earlier would initialize it)."""
    states = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            states[f"cuda:{i}"] = torch.cuda.get_rng_state(i)
    return states


def _dropout_in_training(module, within=None):
    """Paths of the submodules that drop elements at random as the module stands; with
    ``within`` (module paths), only those inside one of them (the modules a run calls)."""
    if module is None:
        return []
    return [path or "(the model)" for path, m in module.named_modules()
            if m.training and isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
            and (within is None or any(path == p or path.startswith(p + ".") for p in within))]


@contextlib.contextmanager
def watch_randomness(module, within=None):
    """Yields a dict that, once the block ends, holds the randomness the run used, as trace
    metadata records it: {"generators": [...whose state moved], "dropout": [...]}. A run
    that drew random numbers computes on draws no other run shares (fail closed). With
    ``within``, only dropout inside those module paths counts (a run that calls only them)."""
    used = {"generators": [], "dropout": _dropout_in_training(module, within)}
    before = _generator_states()
    yield used
    after = _generator_states()
    used["generators"] = [name for name, state in after.items()
                          if name not in before or not torch.equal(state, before[name])]


def upstream_recipe(caches_seeded: bool) -> str:
    """The metadata's ``upstream_gradient``: the recipe, and whether a returned cache's tensors
    seeded backward too (``caches_seed_backward``). A run whose caches seeded it started
    backward differently from one without a cache, and the judge then says so rather than
    compare their gradients; by default a cache seeds nothing, so a run with one and a run
    without start alike."""
    return UPSTREAM_GRADIENT + ("; a cache's tensors seed it too" if caches_seeded else "")


def check_autocast(dtype, autocast):
    """``autocast``: the dtype ``torch.autocast`` computes in, for a run whose parameters and
    inputs are held in ``dtype``; a float64 truth runs without it."""
    if autocast is None:
        return
    if not (isinstance(autocast, torch.dtype) and autocast.is_floating_point):
        raise ValueError(f"autocast must be a floating dtype (torch.bfloat16, ...), got "
                         f"{autocast!r}")
    if dtype == torch.float64:
        raise ValueError("autocast is for the runs judged, not for their float64 truth: capture "
                         "the truth without it, with truth_of=the dtype the runs hold")


def autocast_context(autocast, device):
    """``torch.autocast`` in dtype ``autocast`` on ``device``'s type; nothing when None."""
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=autocast)


def is_compiled(module) -> bool:
    """Whether ``module`` is a ``torch.compile``'d one (an OptimizedModule)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def recipe_name(dtype, autocast=None) -> str:
    """The metadata's ``dtype_recipe``: "bfloat16", or "float32+autocast(bfloat16)"."""
    return dtype_name(dtype) + (f"+autocast({dtype_name(autocast)})" if autocast else "")


def _forward_backward(call, args, seed, values_of=None, caches_seed_backward=False,
                      autocast=None, device="cpu"):
    """Runs forward, then backward with fixed upstream gradients (a truth's, ``values_of``, as
    its runs hold them) on every floating output, except, unless ``caches_seed_backward``,
    the tensors of a Hugging Face cache the model returns: state kept for the next tokens,
    which a port without a cache does not have and no loss reads. Returns ({out name:
    tensor}, whether a cache's tensors seeded backward). With ``autocast``, the forward pass
    runs under ``torch.autocast`` in that dtype (backward follows the dtypes it chose)."""
    with autocast_context(autocast, device):
        result = call(**args) if isinstance(args, dict) else call(*args)

    def named(k):
        return f"out.{k}" if k != "output" else "out"

    outputs = {named(k): v for k, v in flatten(result).items()}
    in_caches = {named(k) for k in cache_tensor_names(result)}
    held_back = set() if caches_seed_backward else in_caches
    grads_for = [(n, o) for n, o in outputs.items()
                 if isinstance(o, torch.Tensor) and o.requires_grad and n not in held_back]
    if grads_for:
        torch.autograd.backward([o for _, o in grads_for],
                                [_upstream_grad(o, n, seed, values_of) for n, o in grads_for])
    return outputs, caches_seed_backward and bool(in_caches)


def selected_modules(model, globs):
    """[(path, module)] of the submodules whose paths match one of ``globs`` (a glob or a
    list of them; None: every submodule), the model itself excluded."""
    if isinstance(globs, str):
        globs = [globs]
    return [(p, m) for p, m in model.named_modules()
            if p and (globs is None or any(fnmatch.fnmatchcase(p, g) for g in globs))]
