"""test_dtypes.py: numalign's decoding of every 8- and 16-bit float pattern against ml_dtypes."""
import json
import math
import struct

import ml_dtypes
import numpy as np
import pytest

FORMATS = {
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
}


def write_raw(path, name, dtype_name, data: bytes, count):
    """A minimal safetensors file written by hand (no numalign, no safetensors package)."""
    header = json.dumps({name: {"dtype": dtype_name, "shape": [count], "data_offsets": [0, len(data)]}})
    header += " " * ((8 - len(header) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + data)


@pytest.mark.parametrize("dtype_name", list(FORMATS))
def test_every_pattern_decodes_like_ml_dtypes(cli, tmp_path, dtype_name):
    np_type = FORMATS[dtype_name]
    width = np.dtype(np_type).itemsize
    patterns = np.arange(256 ** width, dtype=np.uint16 if width == 2 else np.uint8)
    path = tmp_path / f"{dtype_name}.safetensors"
    write_raw(path, "all", dtype_name, patterns.tobytes(), patterns.size)
    proc = cli("dump", path, "all", "-n", patterns.size)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == patterns.size
    with np.errstate(invalid="ignore"):  # NaN patterns of bf16 warn on the cast
        expected = patterns.view(np_type).astype(np.float64)
    for line, want in zip(lines, expected):
        index, bits, value = line.split()
        got = float(value)
        assert int(bits, 16) == int(index)
        if math.isnan(want):
            assert math.isnan(got), line
        else:
            assert got == want and math.copysign(1, got) == math.copysign(1, want), line
