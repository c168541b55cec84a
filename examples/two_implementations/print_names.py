"""print_names.py: the tensor names numalign's trace_model records for the two
implementations (HF's Llama, the reference; FusedLlama, the test), and how map.json pairs
them: which ref names it maps, which it ignores and why, and what is left over.

    python examples/two_implementations/print_names.py [--layers N] [--names]

The matching here is a stand-in written in Python for this example and its tests: ``*`` is
any run of characters (dots included) and captures, each ``*`` as short as the rest of the
name allows; ``?`` is one character. It follows the core's map semantics as
src/map.cpp states them (an entry's every match must name ref tensors that exist; a ref
tensor claimed by two entries is a conflict; an ignore leaves out only ref tensors no entry
claims, and test tensors no entry uses). The core's own matcher replaces it once
``numalign judge --map`` lands (issue 22)."""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fused_llama  # noqa: E402

MAP_PATH = HERE / "map.json"


def load_map(path=MAP_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def traces(layers: int = 2, dtype=torch.float64, bug=None):
    """(test, ref): trace_model of FusedLlama and of HF's Llama, every module recorded.
    ``bug``: (layer, part) to plant in the test model (fused_llama.plant_bug)."""
    from numalign.capture import trace_model

    ref_model = fused_llama.reference_llama(layers)
    test_model = fused_llama.from_hf(ref_model)
    if bug is not None:
        fused_llama.plant_bug(test_model, *bug)
    x = fused_llama.example_inputs()
    return trace_model(test_model, x, dtype), trace_model(ref_model, x, dtype)


def _regex(glob: str):
    parts = []
    for c in glob:
        parts.append("(.*?)" if c == "*" else "." if c == "?" else re.escape(c))
    return re.compile("".join(parts), re.DOTALL)


def glob_captures(glob: str, name: str):
    """What the ``*``s of ``glob`` matched in ``name`` (a list), or None: no match."""
    if not fnmatch.fnmatchcase(name, glob.replace("[", "[[]")):
        return None
    m = _regex(glob).fullmatch(name)
    return list(m.groups()) if m else None


def _expand(template: str, caps) -> str:
    return re.sub(r"\{(\d+)\}", lambda m: caps[int(m.group(1)) - 1], template)


def _sides(entry):
    test, ref = entry["test"], entry["ref"]
    test_list, ref_list = isinstance(test, list), isinstance(ref, list)
    tests, refs = (test if test_list else [test]), (ref if ref_list else [ref])
    ref_inserts = any("{" in r for r in refs)
    test_inserts = any("{" in t for t in tests)
    glob_on_test = ref_inserts or (not test_inserts and not test_list)
    return tests, refs, glob_on_test


def check_map(mapping: dict, test_names, ref_names) -> dict:
    """How ``mapping`` pairs the names: {"pairs": [(entry number, [test], [ref], cat_dim)],
    "missing": [(entry, test, ref the ref run lacks)], "conflicts": {ref: [entries]},
    "ignored": {glob: [ref names]}, "uncovered": [ref names neither mapped nor ignored],
    "by_name": [of those, the ones test holds by the same name, which the core pairs as
    namesakes], "unused_test": [test names no entry uses and no ignore covers],
    "ignored_test": {glob: [test names]}, "unmatched_entries": [entry numbers]}."""
    test_names, ref_names = list(test_names), list(ref_names)
    ref_set, test_set = set(ref_names), set(test_names)
    pairs, missing, unmatched = [], [], []
    claimed, used_test = {}, set()
    for number, entry in enumerate(mapping["map"], 1):
        tests, refs, glob_on_test = _sides(entry)
        glob = tests[0] if glob_on_test else refs[0]
        matches = 0
        for name in (test_names if glob_on_test else ref_names):
            caps = glob_captures(glob, name)
            if caps is None:
                continue
            matches += 1
            if glob_on_test:
                t, r = [name], [_expand(x, caps) for x in refs]
            else:
                t, r = [_expand(x, caps) for x in tests], [name]
            pairs.append((number, t, r, entry.get("cat_dim")))
            used_test.update(t)
            for x in r:
                claimed.setdefault(x, []).append(number)
                if x not in ref_set:
                    missing.append((number, t[0], x))
            for x in t:
                if x not in test_set:
                    missing.append((number, x, r[0]))
        if not matches:
            unmatched.append(number)
    conflicts = {r: ns for r, ns in claimed.items() if len(set(ns)) > 1}
    ignored, uncovered = {}, []
    for name in ref_names:
        if name in claimed:
            continue
        glob = next((ig["ref"] for ig in mapping.get("ignore", []) if "ref" in ig
                     and fnmatch.fnmatchcase(name, ig["ref"].replace("[", "[[]"))), None)
        if glob is not None:
            ignored.setdefault(glob, []).append(name)
        else:
            uncovered.append(name)
    ignored_test, unused_test = {}, []
    for name in test_names:
        if name in used_test:
            continue
        glob = next((ig["test"] for ig in mapping.get("ignore", []) if "test" in ig
                     and fnmatch.fnmatchcase(name, ig["test"].replace("[", "[[]"))), None)
        if glob is not None:
            ignored_test.setdefault(glob, []).append(name)
        elif name not in uncovered:
            unused_test.append(name)
    return {"pairs": pairs, "missing": missing, "conflicts": conflicts, "ignored": ignored,
            "uncovered": uncovered, "by_name": [n for n in uncovered if n in test_set],
            "unused_test": unused_test, "ignored_test": ignored_test,
            "unmatched_entries": unmatched}


def mapped_tensors(mapping: dict, test, ref):
    """{ref name: (test's tensor for it, where it was read)} for every ref tensor the map
    pairs: a piece of a test tensor for a ref list (along cat_dim, in the list's order), a
    concatenation of test tensors for a test list."""
    out = {}
    for number, t, r, cat_dim in check_map(mapping, test, ref)["pairs"]:
        if len(r) > 1 or isinstance(mapping["map"][number - 1]["ref"], list):
            x, at = test[t[0]], 0
            for name in r:
                n = ref[name].shape[cat_dim]
                out[name] = (x.narrow(cat_dim, at, n), f"{t[0]}[{at}:{at + n} on dim {cat_dim}]")
                at += n
        elif len(t) > 1:
            out[r[0]] = (torch.cat([test[n] for n in t], dim=cat_dim), f"cat({', '.join(t)})")
        else:
            out[r[0]] = (test[t[0]], t[0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--names", action="store_true", help="list every recorded name")
    ap.add_argument("--map", default=str(MAP_PATH))
    args = ap.parse_args(argv)
    test, ref = traces(args.layers)
    if args.names:
        for title, trace in (("reference (HF LlamaForCausalLM)", ref), ("test (FusedLlama)", test)):
            print(f"{title}: {len(trace)} tensors")
            for n in trace.metadata["order"]:
                print(f"  {n}  {tuple(trace[n].shape)}")
    result = check_map(load_map(args.map), test, ref)
    print(f"map: {len(result['pairs'])} matches pair "
          f"{sum(len(r) for _, _, r, _ in result['pairs'])} ref tensors")
    for glob, names in result["ignored"].items():
        print(f"ignored ref {glob}: {len(names)}")
    for glob, names in result["ignored_test"].items():
        print(f"ignored test {glob}: {len(names)}")
    problems = 0
    for key in ("missing", "conflicts", "uncovered", "unused_test", "unmatched_entries"):
        if result[key]:
            problems += 1
            print(f"{key}: {result[key]}")
    print("complete" if not problems else "INCOMPLETE")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
