"""fused_llama.py: a second implementation of Hugging Face's Llama, as a port would write it,
for judging one implementation against another whose tensors are named and laid out
differently (a map file pairs them: map.json beside this file).

The reference is ``transformers.LlamaForCausalLM`` built from a small config (nothing is
downloaded). The re-implementation, ``FusedLlama``, computes the same function with

- a FUSED QKV projection: one Linear whose output is q, k and v concatenated on the last
  dim, in that order (its weight is HF's q_proj, k_proj and v_proj weights stacked on dim 0);
- a FUSED gate/up projection: one Linear whose output is gate and up concatenated on the
  last dim (HF's gate_proj and up_proj weights stacked on dim 0);
- rotary embeddings computed and applied inside attention (HF computes the tables once, in
  ``model.rotary_emb``, and hands them to every layer);
- the causal mask built inside attention, grouped-query attention when the config has fewer
  key/value heads than query heads, RMSNorm and a SiLU-gated MLP, as HF's eager path.

Its module tree (names chosen to differ from HF's, so that a map is needed)::

    embed                         HF model.embed_tokens
    blocks.N                      HF model.layers.N
    blocks.N.norm1                HF model.layers.N.input_layernorm
    blocks.N.attention            HF model.layers.N.self_attn
    blocks.N.attention.qkv        HF q_proj, k_proj, v_proj (fused)
    blocks.N.attention.out_proj   HF o_proj
    blocks.N.norm2                HF model.layers.N.post_attention_layernorm
    blocks.N.mlp                  HF model.layers.N.mlp
    blocks.N.mlp.gate_up          HF gate_proj, up_proj (fused)
    blocks.N.mlp.down             HF down_proj
    norm                          HF model.norm
    lm_head                       HF lm_head

A block is called with a keyword and returns a dict, ``block(hidden_states=h)
["hidden_states"]``, so numalign records its tensors as ``blocks.N.in.hidden_states``,
``blocks.N.out.hidden_states`` (and ``.grad.hidden_states``, ``.grad_out.hidden_states``).
Were they ``blocks.N.out``, no glob of a map could name them alone: a map's ``*`` matches any
run of characters, dots included, so ``blocks.*.out`` would also match
``blocks.0.mlp.out`` (capturing ``0.mlp``) and send it to a ref tensor that does not exist.

The model is called as HF's is, ``model(input_ids=ids)``, and returns a named tuple whose
``logits`` field is the logits: numalign records it as ``out.logits``, HF's name, and the
upstream gradient of each output is drawn from its name, so both runs' backward passes
start from the same gradient. Build the reference with ``use_cache=False`` (as
``reference_llama`` does): a returned cache's tensors would each receive an upstream
gradient of their own, and HF's backward pass would then differ from a model that returns
the logits alone.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import transformers
from torch import nn
from torch.nn import functional as F

# The example's small config: hidden 64, 2 layers, 4 query heads over 2 key/value heads
# (grouped-query attention), intermediate 128, vocabulary 97, 64 positions.
CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def reference_llama(layers: int = 2, seed: int = 0) -> transformers.LlamaForCausalLM:
    """HF's Llama from the small config, eager attention, no cache returned, in eval mode
    (HF builds models in training mode). Its norms' weights are drawn around 1 rather than
    left at HF's initial ones, so that a norm weight copied wrongly would show."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**CONFIG, "num_hidden_layers": layers},
                                      attn_implementation="eager", use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def example_inputs(vocab: int = CONFIG["vocab_size"], batch: int = 2, tokens: int = 16) -> dict:
    """A batch of token ids as both models take them: ``{"input_ids": (2, 16) int64}``."""
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, vocab, (batch, tokens), generator=g)}


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the mean computed in float32 (as HF does) and the
    result cast back to the input's dtype before the weight."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FusedAttention(nn.Module):
    """Causal self-attention with one fused QKV projection; rotary embeddings and the causal
    mask are computed here, from the sequence length."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope_theta: float):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.qkv = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=False)
        self.out_proj = nn.Linear(self.q_size, hidden, bias=False)
        # The rotary frequencies in float32, by HF's formula, so both implementations hold the
        # same ones (a float64 run holds them in float64, as numalign casts floating buffers).
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim
        inv_freq = 1.0 / (rope_theta ** exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotary(self, x, tokens: int):
        """cos and sin tables (tokens, head_dim) in x's dtype, computed in float32."""
        positions = torch.arange(tokens, device=x.device).float()
        freqs = positions[:, None] * self.inv_freq.to(device=x.device, dtype=torch.float)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self._rotary(x, t)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:  # each key/value head serves heads / kv_heads queries
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.head_dim ** -0.5
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.q_size)
        return self.out_proj(out)


class FusedMLP(nn.Module):
    """down(silu(gate) * up), gate and up from one fused Linear."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm residual block: h + attention(norm1(h)), then h + mlp(norm2(h)). Called as
    ``block(hidden_states=h)``; returns ``{"hidden_states": h}`` (see the module's notes)."""

    def __init__(self, hidden, intermediate, heads, kv_heads, head_dim, rope_theta, eps):
        super().__init__()
        self.norm1 = RMSNorm(hidden, eps)
        self.attention = FusedAttention(hidden, heads, kv_heads, head_dim, rope_theta)
        self.norm2 = RMSNorm(hidden, eps)
        self.mlp = FusedMLP(hidden, intermediate)

    def forward(self, hidden_states):
        h = hidden_states + self.attention(self.norm1(hidden_states))
        return {"hidden_states": h + self.mlp(self.norm2(h))}


class FusedLlamaOutput(NamedTuple):
    logits: torch.Tensor


class FusedLlama(nn.Module):
    def __init__(self, config: transformers.LlamaConfig):
        super().__init__()
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"rope_type {rope['rope_type']!r}: only the default RoPE "
                                      "is written here")
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise NotImplementedError("biases in attention or MLP are not written here")
        if getattr(config, "tie_word_embeddings", False):
            raise NotImplementedError("tied embeddings are not written here")
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = config.num_key_value_heads or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        self.embed = nn.Embedding(config.vocab_size, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, config.intermediate_size, heads, kv_heads, head_dim, theta,
                  config.rms_norm_eps) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        for block in self.blocks:
            h = block(hidden_states=h)["hidden_states"]
        return FusedLlamaOutput(logits=self.lm_head(self.norm(h)))


def from_hf(hf_model: transformers.LlamaForCausalLM) -> FusedLlama:
    """A FusedLlama computing what ``hf_model`` computes, with its weights: q, k and v
    stacked on dim 0 into the fused qkv weight, gate and up likewise into gate_up. In eval
    mode, on the HF model's device and dtype."""
    hf = hf_model.model
    p = next(hf_model.parameters())
    model = FusedLlama(hf_model.config).to(device=p.device, dtype=p.dtype)
    with torch.no_grad():
        model.embed.weight.copy_(hf.embed_tokens.weight)
        for block, layer in zip(model.blocks, hf.layers, strict=True):
            a, m = layer.self_attn, layer.mlp
            block.norm1.weight.copy_(layer.input_layernorm.weight)
            block.attention.qkv.weight.copy_(
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dim=0))
            block.attention.out_proj.weight.copy_(a.o_proj.weight)
            block.norm2.weight.copy_(layer.post_attention_layernorm.weight)
            block.mlp.gate_up.weight.copy_(torch.cat([m.gate_proj.weight, m.up_proj.weight], dim=0))
            block.mlp.down.weight.copy_(m.down_proj.weight)
        model.norm.weight.copy_(hf.norm.weight)
        model.lm_head.weight.copy_(hf_model.lm_head.weight)
    return model.train(hf_model.training)


def plant_bug(model: FusedLlama, layer: int, part: str = "k", scale: float = 1 + 3e-2) -> None:
    """Plants a bug in one layer's fused QKV projection: the ``part`` ("q", "k" or "v")
    third of its output is multiplied by ``scale``; the other two thirds are multiplied by
    exactly 1, so they stay bit for bit what they were, and so does every earlier layer.
    The wrong slice is the projection's output (``blocks.N.attention.qkv.out``), as a fused
    kernel that scaled one of its outputs wrongly would make it; its weight is untouched.
    Backward, the gradients it passes upstream and its weight's gradient follow from the
    scaled slice, as they would for such a kernel.

    Planted, as in examples/hf/hf_models.py, by giving the Linear a subclass of its own
    class, not by a hook or a patched method: numalign's runs copy the model, and a copy
    keeps its class."""
    attention = model.blocks[layer].attention
    slices = {"q": (0, attention.q_size),
              "k": (attention.q_size, attention.q_size + attention.kv_size),
              "v": (attention.q_size + attention.kv_size, attention.q_size + 2 * attention.kv_size)}
    start, end = slices[part]
    linear = attention.qkv

    class ScaledSlice(type(linear)):
        def forward(self, x):
            y = super().forward(x)
            factor = torch.ones(y.shape[-1], dtype=y.dtype, device=y.device)
            factor[start:end] = scale
            return y * factor

    linear.__class__ = ScaledSlice
