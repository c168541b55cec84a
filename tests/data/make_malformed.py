#!/usr/bin/env python3
"""make_malformed.py: writes the malformed-file corpus (tests/data/malformed/*.safetensors) and
expected.json, the exact problem numalign reports for each, and the same for map and policy
files (tests/data/malformed_settings/). Run it after changing a message:
    python3 tests/data/make_malformed.py
Both the C++ and the Python tests read the corpus; the trace fuzzer seeds from it."""
import json
import struct
from pathlib import Path

OUT = Path(__file__).resolve().parent / "malformed"
SETTINGS_OUT = Path(__file__).resolve().parent / "malformed_settings"
F32X2 = '"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


def image(header: str | bytes, data: bytes = b"") -> bytes:
    raw = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(raw)) + raw + data


def entry(name, dtype, shape, begin, end):
    return json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}})[1:-1]


CASES = {
    "too_short": (b"\0" * 5, "file is 5 bytes, too short for the 8-byte header length (not a safetensors file)"),
    "header_over_cap": (struct.pack("<Q", 100_000_001) + b"{}",
                        "the header length (first 8 bytes) exceeds the 100000000-byte limit: not a safetensors file"),
    "header_past_end": (struct.pack("<Q", 100) + b"{}",
                        "the header length (first 8 bytes) runs past the end of the file (10 bytes): truncated, or not a safetensors file"),
    "not_utf8": (image(b'{"\xff":1}'), "header is not valid UTF-8"),
    "not_json": (image("{nope}"), None),  # simdjson's wording: checked by prefix below
    "not_object": (image("[1,2]"), "header is not a JSON object"),
    "nul_padding": (image(b"{}\0\0"), "header has a NUL byte at offset 10 (headers are padded with spaces, not NUL)"),
    "no_dtype": (image('{"x":{"shape":[1],"data_offsets":[0,4]}}', b"a" * 4), 'tensor "x": entry has no "dtype"'),
    "no_shape": (image('{"x":{"dtype":"F32","data_offsets":[0,4]}}', b"a" * 4), 'tensor "x": entry has no "shape"'),
    "no_offsets": (image('{"x":{"dtype":"F32","shape":[1]}}', b"a" * 4), 'tensor "x": entry has no "data_offsets"'),
    "entry_not_object": (image('{"x":3}'), 'tensor "x": entry is not an object'),
    "unknown_dtype": (image("{" + entry("x", "F128", [1], 0, 16) + "}", b"a" * 16), 'tensor "x": unknown dtype "F128"'),
    "negative_dim": (image("{" + entry("x", "F32", [-1], 0, 4) + "}", b"a" * 4),
                     'tensor "x": shape must hold non-negative integers'),
    "negative_zero_dim": (image('{"x":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}'),
                          'tensor "x": shape must hold non-negative integers'),
    "integral_float_dim": (image('{"x":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', b"a" * 4),
                           'tensor "x": shape must hold non-negative integers'),
    "negative_zero_offset": (image('{"x":{"dtype":"F32","shape":[0],"data_offsets":[-0,0]}}'),
                             'tensor "x": data_offsets must hold non-negative integers'),
    "fractional_dim": (image("{" + entry("x", "F32", [1.5], 0, 4) + "}", b"a" * 4),
                       'tensor "x": shape must hold non-negative integers'),
    "shape_overflow": (image("{" + entry("x", "F32", [2 ** 32, 2 ** 32, 2], 0, 0) + "}"), 'tensor "x": shape product overflows'),
    "bytes_overflow": (image("{" + entry("x", "F64", [2 ** 62], 0, 0) + "}"), 'tensor "x": byte size overflows'),
    "end_before_begin": (image("{" + entry("x", "F32", [0], 0, 0) + "," + entry("y", "F32", [1], 8, 4) + "}", b"a" * 8),
                         'tensor "y": data_offsets [8, 4] end before they begin'),
    "offsets_past_buffer": (image("{" + F32X2 + "}", b"a" * 4),
                            'tensor "x": data_offsets end at 8, past the data section (4 bytes)'),
    "overlap": (image("{" + F32X2 + "," + entry("y", "F32", [1], 4, 8) + "}", b"a" * 8),
                'tensor "y": data starts at 4 but the previous tensor ends at 8 (an overlap)'),
    "hole": (image("{" + entry("x", "F32", [1], 4, 8) + "}", b"a" * 8),
             'tensor "x": data starts at 4 but the previous tensor ends at 0 (a hole)'),
    "size_mismatch": (image("{" + entry("x", "F32", [3], 0, 8) + "}", b"a" * 8),
                      'tensor "x": F32 [3] needs 12 bytes but data_offsets span 8'),
    "packed_partial_byte": (image("{" + entry("x", "F4", [3], 0, 2) + "}", b"a" * 2),
                            'tensor "x": 3 elements of F4 do not fill whole bytes'),
    "trailing_bytes": (image("{" + F32X2 + "}", b"a" * 12), None),
    "duplicate_name": (image("{" + F32X2 + "," + F32X2 + "}", b"a" * 8),
                       'tensor "x" appears twice in the header (names must be unique)'),
    "metadata_twice": (image('{"__metadata__":{},"__metadata__":{}}'), "header has __metadata__ twice"),
    "entry_key_twice": (image('{"x":{"dtype":"BF16","dtype":"F16","shape":[2],"data_offsets":[0,4]}}', b"a" * 4),
                        'tensor "x": entry has the key "dtype" twice'),
    "our_metadata_key_twice": (image('{"__metadata__":{"numalign":"{\\"seed\\":1,\\"seed\\":2}"}}'),
                               '__metadata__["numalign"]: the key "seed" is given twice (each key once: which one was meant?)'),
    "our_metadata_nested_key_twice": (image('{"__metadata__":{"numalign":"{\\"versions\\":{\\"torch\\":\\"2.5\\",\\"torch\\":\\"2.13\\"}}"}}'),
                                      '__metadata__["numalign"].versions: the key "torch" is given twice (each key once: which one was meant?)'),
    "metadata_value_not_string": (image('{"__metadata__":{"a":1}}'), '__metadata__ value of "a" is not a string'),
    "metadata_not_object": (image('{"__metadata__":[1]}'), "__metadata__ must be an object of strings (or null)"),
    "our_metadata_invalid_json": (image('{"__metadata__":{"numalign":"{oops"}}'), None),
    "our_metadata_wrong_type": (image('{"__metadata__":{"numalign":"{\\"seed\\":\\"x\\"}"}}'),
                                '__metadata__["numalign"]: seed must be an integer'),
    "name_with_nul": (image('{"a\\u0000b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'),
                      'tensor "a\\u0000b": name has a NUL byte'),
    "offsets_not_pair": (image('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}}', b"a" * 4),
                         'tensor "x": data_offsets must be [begin, end]'),
}
# Messages that embed a parser's own words or a computed size: the stable prefix is checked.
PREFIXES = {
    "not_json": "header is not valid JSON: ",
    "trailing_bytes": "tensor data ends at byte ",
    "our_metadata_invalid_json": '__metadata__["numalign"] is not valid JSON: ',
}

TWICE = " is given twice (each key once: which one was meant?)"
PAIR = '{"test": "fused", "ref": ["q", "k"], "cat_dim": 0}'
# Map (--map) and policy (--policy) files: (option, text, the problem named after the path).
SETTINGS = {
    "map_key_twice.json": ("--map", '{"map": [{"test": "fused", "ref": ["q", "k"], "cat_dim": 5, '
                           '"cat_dim": 0}]}', 'map entry 1: the key "cat_dim"' + TWICE),
    "map_escaped_key_twice.json": ("--map", '{"map": [{"test": "fused", "ref": ["q", "k"], '
                                   '"cat_dim": 0, "\\u0063at_dim": 1}]}',
                                   'map entry 1: the key "cat_dim"' + TWICE),
    "map_two_lists.json": ("--map", '{"map": [' + PAIR + '], "map": []}',
                           'the map: the key "map"' + TWICE),
    "map_ignore_reason_twice.json": ("--map", '{"map": [' + PAIR + '], "ignore": [{"ref": "x", '
                                     '"reason": "a", "reason": "b"}]}',
                                     'ignore 1: the key "reason"' + TWICE),
    "policy_key_twice.json": ("--policy", '{"tol": 0.001, "tol": 0.5}',
                              'the policy: the key "tol"' + TWICE),
    "policy_override_key_twice.json": ("--policy", '{"overrides": [{"glob": "q", "rule": "ulp:1", '
                                       '"rule": "exact", "reason": "r"}]}',
                                       '"overrides"[0]: the key "rule"' + TWICE),
}


def write_settings():
    SETTINGS_OUT.mkdir(parents=True, exist_ok=True)
    expected = {}
    for name, (option, text, message) in SETTINGS.items():
        (SETTINGS_OUT / name).write_text(text)
        expected[name] = {"option": option, "message": message}
    (SETTINGS_OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    expected = {}
    for name, (data, message) in CASES.items():
        (OUT / f"{name}.safetensors").write_bytes(data)
        expected[f"{name}.safetensors"] = {"message": message} if message else {"prefix": PREFIXES[name]}
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    write_settings()
    print(f"wrote {len(CASES)} malformed files to {OUT} and {len(SETTINGS)} to {SETTINGS_OUT}")


if __name__ == "__main__":
    main()
