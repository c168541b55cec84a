"""test_map.py: map= (Python) and --map (CLI) pair two implementations whose names and layouts
differ, through the one pairing in the core: the same reports from a dict, a file and the
CLI; pieces of a fused tensor judged under their ref names; fail-closed errors."""
import json

import pytest
import torch

import numalign
from numalign import Trace

MAP = {"map": [
    {"test": "blocks.*.attention.qkv.out",
     "ref": ["model.layers.{1}.self_attn.q_proj.out", "model.layers.{1}.self_attn.k_proj.out",
             "model.layers.{1}.self_attn.v_proj.out"], "cat_dim": -1},
    {"test": "blocks.*.attention.out", "ref": "model.layers.{1}.self_attn.o_proj.out"}],
    "ignore": [{"ref": "model.rotary_emb.*", "reason": "the fused kernel applies rotary inside"}]}


def _projections(dtype, bug_layer=None, layers=2):
    """q, k, v and o of `layers` layers computed in `dtype` from the same inputs and weights,
    as HF names them (separate) and as a fused kernel does (one qkv matmul); the fused one
    scales k of `bug_layer` by 1 + 2e-2."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 24, 32, dtype=torch.float64, generator=g)
    separate, fused = {"model.rotary_emb.out": torch.randn(24, 8, dtype=torch.float64, generator=g)}, {}
    for i in range(layers):
        w = {p: torch.randn(16, 32, dtype=torch.float64, generator=g) / 6 for p in "qkvo"}
        xs = x.to(dtype)
        for p in "qkv":
            separate[f"model.layers.{i}.self_attn.{p}_proj.out"] = xs @ w[p].to(dtype).T
        qkv = xs @ torch.cat([w["q"], w["k"], w["v"]]).to(dtype).T
        if i == bug_layer:
            qkv[..., 16:32] *= 1 + 2e-2
        fused[f"blocks.{i}.attention.qkv.out"] = qkv
        o_in = torch.randn(2, 24, 32, dtype=torch.float64, generator=g).to(dtype)
        separate[f"model.layers.{i}.self_attn.o_proj.out"] = o_in @ w["o"].to(dtype).T
        fused[f"blocks.{i}.attention.out"] = o_in @ w["o"].to(dtype).T
    return separate, fused


def test_only_the_planted_piece_fails_and_is_named_by_ref():
    truth, _ = _projections(torch.float64)
    ref, _ = _projections(torch.float32)
    _, test = _projections(torch.float32, bug_layer=1)
    report = numalign.judge(test, ref, truth, map=MAP)
    failing = [t["name"] for t in report.tensors if t["verdict"] != "pass"]
    assert failing == ["model.layers.1.self_attn.k_proj.out"], str(report)
    k = next(t for t in report.tensors if t["name"] == failing[0])
    assert k["test_source"] == "blocks.1.attention.qkv.out[:, :, 16:32]"
    assert "test: blocks.1.attention.qkv.out[:, :, 16:32]" in str(report)
    assert "(test: blocks.1.attention.qkv.out[:, :, 16:32])" in report.to_html()
    assert any("leaves out 1 tensor(s) of ref matching \"model.rotary_emb.*\"" in w
               for w in report.warnings), report.warnings
    clean = numalign.judge(_projections(torch.float32)[1], ref, truth, map=MAP)
    assert clean.aligned, str(clean)
    assert len(clean.tensors) == 8  # q, k, v and o of two layers, rotary left out


def test_a_dict_a_file_and_the_cli_give_the_same_report(tmp_path, cli):
    truth, _ = _projections(torch.float64)
    ref, _ = _projections(torch.float32)
    _, test = _projections(torch.float32, bug_layer=0)
    paths = {}
    for role, tensors in (("test", test), ("ref", ref), ("truth", truth)):
        paths[role] = tmp_path / f"{role}.safetensors"
        Trace(tensors).save(paths[role])
    map_path = tmp_path / "map.json"
    map_path.write_text(json.dumps(MAP))
    from_dict = numalign.judge(paths["test"], paths["ref"], paths["truth"], map=MAP)
    from_file = numalign.judge(paths["test"], paths["ref"], paths["truth"], map=map_path)
    assert from_dict.to_json() == from_file.to_json()
    proc = cli("judge", paths["test"], paths["ref"], paths["truth"], "--map", map_path,
               "--format", "json")
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["tensors"] == json.loads(from_file.to_json())["tensors"]


@pytest.mark.parametrize("bad, message", [
    ({"map": [], "ignore": [{"ref": "model.rotary_emb.*"}]},
     'map: ignore 1 (ref "model.rotary_emb.*") needs a written reason'),
    ({"map": [{"test": "blocks.*.x", "ref": "m.{2}.x"}]},
     'map: map entry 1: ref "m.{2}.x" inserts capture {2}, but test glob "blocks.*.x" has only 1 *'),
    ({"map": [{"test": "a.**", "ref": "{1}"}]},
     'map: map entry 1: test glob "a.**" has two * side by side'),
])
def test_a_bad_map_is_refused_before_judging(bad, message):
    with pytest.raises(ValueError) as e:
        numalign.judge({"x": torch.ones(3)}, {"x": torch.ones(3)}, map=bad)
    assert str(e.value).startswith(message), str(e.value)


def test_a_ref_tensor_nobody_maps_cannot_be_judged():
    truth, _ = _projections(torch.float64, layers=1)
    ref, _ = _projections(torch.float32, layers=1)
    _, test = _projections(torch.float32, layers=1)
    ref["model.norm.out"] = torch.ones(3)
    truth["model.norm.out"] = torch.ones(3, dtype=torch.float64)
    report = numalign.judge(test, ref, truth, map=MAP)
    assert report.exit_code == 2
    norm = next(t for t in report.tensors if t["name"] == "model.norm.out")
    assert norm["reason"] == ("not mapped: no entry of map maps it, no ignore covers it, and "
                              "test has no tensor of that name")
    with pytest.raises(AssertionError, match="not mapped"):
        numalign.assert_aligned(test, ref, truth, map=MAP)
