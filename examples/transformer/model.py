"""model.py: a 2-layer pre-norm transformer in pure torch, with one bug that can be planted:
layer 1's MLP accumulating its matmuls in the activation dtype (bf16) instead of fp32."""
from __future__ import annotations

import math

import torch
from torch import nn


def matmul(x: torch.Tensor, w: torch.Tensor, accumulate_in_dtype: bool) -> torch.Tensor:
    """x @ w. With accumulate_in_dtype, the reduction adds one product at a time in x's
    dtype (each partial sum rounded to bf16), as a kernel with a bf16 accumulator would."""
    if not accumulate_in_dtype:
        return x @ w
    acc = torch.zeros(*x.shape[:-1], w.shape[-1], dtype=x.dtype)
    for k in range(w.shape[0]):
        acc = acc + x[..., k:k + 1] * w[k]
    return acc


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(dim, hidden) / math.sqrt(dim))
        self.w_out = nn.Parameter(torch.randn(hidden, dim) / math.sqrt(hidden))
        self.accumulate_in_dtype = False  # the planted bug

    def forward(self, x):
        h = nn.functional.gelu(matmul(x, self.w_in, self.accumulate_in_dtype))
        return matmul(h, self.w_out, self.accumulate_in_dtype)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1, self.attn = RMSNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = RMSNorm(dim), MLP(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 1024, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def make_models(seed: int = 0):
    """(reference, test): the same weights; the test's layer 1 MLP accumulates in bf16."""
    torch.manual_seed(seed)
    reference = Transformer()
    test = Transformer()
    test.load_state_dict(reference.state_dict())
    test.layers[1].mlp.accumulate_in_dtype = True
    return reference, test


def make_input(seed: int = 1, batch: int = 2, seq: int = 16, dim: int = 64):
    return torch.randn(batch, seq, dim, generator=torch.Generator().manual_seed(seed))
