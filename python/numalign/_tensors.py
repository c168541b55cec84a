"""_tensors.py: torch tensors and numpy arrays as (dtype name, shape, bytes) for the core, with
no copy for contiguous CPU data; nested outputs flattened to dotted names."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from . import _core

try:
    import torch
except ImportError:  # numpy-only use
    torch = None

_NUMPY_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "float32": "F32",
    "float64": "F64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0",
}
_TORCH_NAMES = {}
if torch is not None:
    for _name, _code in _NUMPY_NAMES.items():
        if hasattr(torch, _name):
            _TORCH_NAMES[getattr(torch, _name)] = _code
    _TORCH_FROM_CODE = {code: dtype for dtype, code in _TORCH_NAMES.items()}


def is_tensor(x) -> bool:
    return (torch is not None and isinstance(x, torch.Tensor)) or isinstance(x, np.ndarray)


def check_text(text, what: str) -> None:
    """Text crosses to the core as UTF-8: a str that cannot be encoded (a lone surrogate, as
    os.fsdecode makes of a byte that is not UTF-8) is refused here, naming `what` holds it,
    rather than by the binding's type check ("incompatible function arguments")."""
    if not isinstance(text, str):
        return  # the binding's type check names what it expected
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} {text!r}: not valid Unicode ({e.reason} at position "
                         f"{e.start}) and cannot be written as UTF-8") from None


def _check_name(name: str) -> None:
    check_text(name, "tensor")


def to_core(x, name: str):
    """(safetensors dtype, shape, data) of a tensor or array for the core, zero copy when it
    can be: data is uint8 bytes, or for a torch tensor (address, size, tensor)."""
    _check_name(name)
    if torch is not None and isinstance(x, torch.Tensor):
        code = _TORCH_NAMES.get(x.dtype)
        if code is None:
            raise TypeError(f"tensor {name!r}: dtype {x.dtype} is not supported")
        t = x
        if t.is_neg() or t.is_conj():  # lazy bits: the bytes in memory are not the values
            t = t.detach().resolve_neg().resolve_conj()
        if not t.is_cpu:
            t = t.detach().cpu()  # one copy to the host
        if not t.is_contiguous():
            t = t.detach().contiguous()
        # (address, size, owner): the core reads the bytes in place while the tuple holds t.
        # (No detach for CPU tensors: the address is the same, and detach costs more than
        # judging a small tensor.)
        return code, list(t.shape), (t.data_ptr(), t.nbytes, t)
    if isinstance(x, np.ndarray):
        code = _NUMPY_NAMES.get(x.dtype.name)
        if code is None:
            raise TypeError(f"array {name!r}: dtype {x.dtype} is not supported")
        a = np.ascontiguousarray(x)
        if a.dtype.byteorder == ">":
            raise ValueError(f"array {name!r}: big-endian data is not supported")
        return code, list(a.shape), a.reshape(-1).view(np.uint8)
    raise TypeError(f"{name!r}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def fingerprint(t) -> str:
    """A hash of a tensor's dtype, shape and bytes, by the core (XXH3-128): equal tensors
    give equal fingerprints (the inputs of runs in trace metadata)."""
    return _core.fingerprint(to_core(t.detach(), "fingerprint"))


def torch_dtype(code: str):
    if torch is None:
        raise ImportError("torch is needed to turn trace entries into tensors")
    if code not in _TORCH_FROM_CODE:
        raise TypeError(f"dtype {code} has no torch equivalent")
    return _TORCH_FROM_CODE[code]


def map_tensors(obj, fn):
    """``obj`` with ``fn`` applied to every torch tensor in it, through dicts, lists, tuples
    and namedtuples (rebuilt as their own types); anything else is kept as it is."""
    if torch is not None and isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        mapped = [map_tensors(v, fn) for v in obj]
        return type(obj)(*mapped) if hasattr(obj, "_fields") else type(obj)(mapped)
    return obj


def flatten(obj, prefix: str = "", *, skipped: dict | None = None) -> dict:
    """Nested outputs as {dotted name: tensor}: dicts (keys), lists / tuples (indices),
    namedtuples and dataclasses (fields), HF-style ModelOutput (its keys), Trace objects, and
    a Hugging Face cache's tensors (``past_key_values.layers.0.keys``...).
    Two paths that give one dotted name (``{"a.b": x, "a": {"b": y}}``) are a ValueError:
    one would silently hide the other. With ``skipped`` (a dict), what cannot be judged is
    listed there, {name: why}, instead of raising, and caches too: what a module is handed
    as state to update in place is not a value it computes from (module inputs)."""
    if not prefix and type(obj) is dict and all(
            type(k) is str and is_tensor(v) for k, v in obj.items()):
        return dict(obj)  # the common case, a state dict: nothing to flatten
    out: dict = {}
    _flatten_into(obj, prefix, (), out, {}, skipped)
    return out


def _join(prefix, key):
    return f"{prefix}.{key}" if prefix else str(key)


def _put(out, paths, name, path, value):
    if name in out:
        raise ValueError(f"two outputs flatten to the name {name!r}: {_describe(paths[name])} "
                         f"and {_describe(path)}; rename one of them")
    out[name] = value
    paths[name] = path


def _describe(path) -> str:
    return "".join(f"[{k!r}]" for k in path) or "the output itself"


STATE_UPDATED_IN_PLACE = "state updated in place"


def cache_tensor_names(obj) -> set:
    """The names flatten(obj) gives the tensors held in Hugging Face caches within ``obj``
    (``past_key_values.layers.0.keys``...): state a model fills as it goes, not its results."""
    skipped: dict = {}
    flatten(obj, skipped=skipped)
    prefixes = [p for p, why in skipped.items() if why.endswith(STATE_UPDATED_IN_PLACE)]
    if not prefixes:
        return set()
    return {n for n in flatten(obj) if any(n == p or n.startswith(p + ".") for p in prefixes)}


def is_hf_cache(obj) -> bool:
    """A Hugging Face ``Cache`` (DynamicCache, StaticCache, EncoderDecoderCache...), known by
    its class rather than by importing transformers."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers.")
               for c in type(obj).__mro__)


def _cache_state(obj):
    """(key, value) pairs of a cache's or cache layer's state worth recording: tensors, lists
    of layers, nested caches (an encoder-decoder cache holds two)."""
    for k, v in vars(obj).items():
        if is_tensor(v) or is_hf_cache(v) or type(v).__module__.startswith("transformers.cache"):
            yield k, v
        elif isinstance(v, (list, tuple)):
            yield k, v


def _flatten_cache(obj, prefix, path, out, paths):
    for k, v in _cache_state(obj):
        name, at = _join(prefix, k), path + (k,)
        if is_tensor(v):
            if v.numel() or v.dim() > 1:  # a layer not yet filled holds an empty placeholder
                _put(out, paths, name, at, v)
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                if is_tensor(item):
                    _put(out, paths, _join(name, i), at + (i,), item)
                elif hasattr(item, "__dict__"):
                    _flatten_cache(item, _join(name, i), at + (i,), out, paths)
        else:
            _flatten_cache(v, name, at, out, paths)


def _flatten_into(obj, prefix, path, out, paths, skipped=None):
    if obj is None:
        return
    if is_tensor(obj):
        _put(out, paths, prefix or "output", path, obj)
    elif is_hf_cache(obj):
        if skipped is not None:
            skipped[prefix or "output"] = f"a {type(obj).__name__}: {STATE_UPDATED_IN_PLACE}"
        else:
            _flatten_cache(obj, prefix or "output", path, out, paths)
    elif isinstance(obj, Mapping):  # dict, OrderedDict, ModelOutput, Trace
        for k, v in obj.items():
            _flatten_into(v, _join(prefix, k), path + (k,), out, paths, skipped)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        for k in obj._fields:
            _flatten_into(getattr(obj, k), _join(prefix, k), path + (k,), out, paths, skipped)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten_into(v, _join(prefix, i), path + (i,), out, paths, skipped)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _flatten_into(getattr(obj, f.name), _join(prefix, f.name), path + (f.name,), out,
                          paths, skipped)
    elif isinstance(obj, (bool, int, float)):
        value = np.asarray(obj, dtype=np.float64 if isinstance(obj, float) else None)
        _put(out, paths, prefix or "output", path, value)
    elif skipped is not None:
        skipped[prefix or "output"] = f"a {type(obj).__name__}: not a value numalign can judge"
    else:
        raise TypeError(f"{prefix or 'output'!r}: cannot judge a {type(obj).__name__} "
                        "(expected tensors, arrays, or dict / list / tuple / dataclass of them)")
