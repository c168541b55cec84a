"""_stream.py: a safetensors file written one tensor at a time, so capturing a model holds
no tensor longer than it takes to write it.

The header (names, offsets, metadata) is only known at the end, so data goes to a side
file as tensors arrive; ``close`` writes header + data to a temporary file and renames it
over the target: a crash never leaves a half trace under the real name."""
from __future__ import annotations

import json
import os
import shutil

import torch

from ._tensors import _TORCH_NAMES

_COPY_CHUNK = 1 << 20


def _copy_file(src, dst) -> None:
    """Appends all of src to dst in the kernel (no buffer the size of the data here)."""
    try:
        while os.copy_file_range(src.fileno(), dst.fileno(), 1 << 30):
            pass
    except OSError:  # a file system without it: a small buffer
        shutil.copyfileobj(src, dst, _COPY_CHUNK)


class StreamingTraceWriter:
    def __init__(self, path):
        self.path = os.fspath(path)
        self._data_path = f"{self.path}.data.tmp-{os.getpid()}"
        self._data = open(self._data_path, "wb")
        self._header = {}
        self._offset = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._header or name == "__metadata__":
            raise ValueError(f"tensor {name!r}: already written (names must be unique)")
        code = _TORCH_NAMES.get(tensor.dtype)
        if code is None:
            raise TypeError(f"tensor {name!r}: dtype {tensor.dtype} is not supported")
        t = tensor.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else None
        size = t.numel() * t.element_size()
        if raw is not None:
            self._data.write(memoryview(raw))
        self._header[name] = {"dtype": code, "shape": list(t.shape),
                              "data_offsets": [self._offset, self._offset + size]}
        self._offset += size

    def close(self, metadata: dict | None = None) -> None:
        """Writes the file; ``metadata`` is the header's __metadata__ (string -> string)."""
        self._data.close()
        header = dict(self._header)
        if metadata:
            header["__metadata__"] = metadata
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the reference writes
        tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as out, open(self._data_path, "rb") as data:
                out.write(len(text).to_bytes(8, "little"))
                out.write(text)
                out.flush()
                _copy_file(data, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            os.unlink(self._data_path)

    def abort(self) -> None:
        """Drops what was written; the target path is left as it was."""
        self._data.close()
        if os.path.exists(self._data_path):
            os.unlink(self._data_path)
