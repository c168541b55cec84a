"""trace.py: a run as {name: tensor} plus metadata, saved as one safetensors file."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

from . import _core
from ._tensors import flatten, to_core, torch_dtype

METADATA_KEY = _core.METADATA_KEY  # our JSON's key inside the header's __metadata__


class Trace(Mapping):
    """A mapping name -> tensor with ``metadata`` (role, dtype_recipe, device, versions, tf32,
    seed, order, tags, fingerprints). ``Trace.load`` maps the file and builds each tensor when
    first asked for, as a copy of its data (as safetensors' ``get_tensor`` copies): a file that
    shrinks afterwards cannot fault in the caller's code, and reading one that shrank raises
    ValueError naming it. Judging or saving a loaded trace reads the mapping itself."""

    def __init__(self, tensors=None, metadata=None, extra_metadata=None):
        self._tensors = dict(flatten(tensors)) if tensors is not None else {}
        self._lazy = {}
        self._file = None      # the core's mapped file, for a loaded trace
        self._file_json = None  # its metadata JSON, parsed only when asked for
        self._changed = False   # tensors set after loading
        self._metadata = dict(metadata or {})
        self.extra_metadata = dict(extra_metadata or {})  # other __metadata__ keys

    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            self._metadata = json.loads(self._file_json)
        return self._metadata

    @metadata.setter
    def metadata(self, value):
        self._metadata = dict(value)

    @classmethod
    def load(cls, path) -> "Trace":
        trace = cls()
        trace._file = _core.Trace.open(os.fspath(path))
        for name, code, shape, data in trace._file.entries():
            trace._lazy[name] = (code, shape, data)
        raw = dict(trace._file.raw_metadata)
        if METADATA_KEY in raw:
            trace._file_json = raw.pop(METADATA_KEY)
            trace._metadata = None
        trace.extra_metadata = raw
        return trace

    def _materialize(self, name):
        """A tensor of its own, copied from the mapping as safetensors' get_tensor copies: a
        view would fault (SIGBUS, the interpreter gone) wherever it is read once the file
        shrinks; the copy raises ValueError naming the file instead."""
        code, shape, _ = self._lazy[name]
        import torch

        raw = torch.from_numpy(self._file.copy(name))
        return raw.view(torch_dtype(code)).reshape(shape)

    def __getitem__(self, name):
        if name in self._tensors:
            return self._tensors[name]
        if name in self._lazy:
            t = self._materialize(name)
            self._tensors[name] = t
            return t
        raise KeyError(name)

    def __contains__(self, name):  # without building the tensor, as Mapping's default would
        return name in self._tensors or name in self._lazy

    def __iter__(self):
        seen = set()
        for name in list(self._lazy) + list(self._tensors):
            if name not in seen:
                seen.add(name)
                yield name

    def __len__(self):
        return len(set(self._lazy) | set(self._tensors))

    def __setitem__(self, name, tensor):
        self._tensors[name] = tensor
        self._changed = True

    def core_tensor(self, name):
        """(dtype, shape, bytes) for the core, zero copy for entries of a loaded file."""
        if name in self._lazy and name not in self._tensors:
            return self._lazy[name]
        return to_core(self[name], name)

    def _raw_metadata(self) -> dict:
        metadata = dict(self.extra_metadata)
        if self.metadata:
            metadata[METADATA_KEY] = json.dumps(self.metadata, separators=(",", ":"))
        return metadata

    def _is_the_file(self) -> bool:
        """Loaded and unchanged: the core can judge the mapped file itself."""
        if self._file is None or self._changed:
            return False
        raw = dict(self._file.raw_metadata)
        file_json = raw.pop(METADATA_KEY, None)
        if self.extra_metadata != raw:
            return False
        if self._metadata is None:  # never read, so never changed
            return True
        return self._metadata == (json.loads(file_json) if file_json is not None else {})

    def core_trace(self):
        """The run for the core: the mapped file when loaded and unchanged (its path then
        titles the report, as in the CLI), else the tensors in memory, zero copy."""
        if self._is_the_file():
            return self._file
        return _core.Trace.from_tensors("", [(n, self.core_tensor(n)) for n in self],
                                        self._raw_metadata())

    def save(self, path) -> None:
        """Writes atomically; the layout (and bytes) are those of safetensors' save_file."""
        metadata = self._raw_metadata()
        items = [(name, self.core_tensor(name)) for name in self]
        _core.write_trace(os.fspath(path), items, metadata or None)

    def __repr__(self):
        role = self.metadata.get("role", "?")
        return f"<numalign.Trace role={role} tensors={len(self)}>"


def as_core_trace(obj):
    """A path, a Trace, or tensors / nested outputs as the core's run."""
    if isinstance(obj, (str, bytes, os.PathLike)):
        return _core.Trace.open(os.fspath(obj))
    if isinstance(obj, Trace):
        return obj.core_trace()
    return _core.Trace.from_tensors("", [(n, to_core(t, n)) for n, t in flatten(obj).items()])
