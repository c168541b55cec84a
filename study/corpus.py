"""corpus.py: a labelled corpus of kernels, each run as a reference, as correct variants and as
buggy variants in bf16, fp16 and fp32, with its float64 truth on the values the runs hold.

Every kernel is written the way GPU kernels compute: operands stored in the run's dtype,
arithmetic in an accumulator (float32 for every run dtype; float64 for the truth), a rounding
to the run's dtype where a real kernel stores. A variant changes what a real implementation
changes: the order or blocking of a reduction, where it rounds (correct variants), or a bug
class seen in real trackers (docs/rule_study.md cites them).

Labels are fixed here, before any rule sees a case: a variant is correct or buggy by how it
is written. A buggy case is *effective* when its error against the truth lies outside what
every correct implementation of the same kernel gives on the same inputs (see `label`):
a bug whose effect stays inside rounding noise cannot be asked of any rule."""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch

F64 = torch.float64
F32 = torch.float32
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MAGNITUDES = (1e-3, 1.0, 1e3)
DISTRIBUTIONS = ("normal", "outliers", "offset")


def acc_of(dt):
    """The accumulator of a run: float32 for every run dtype, float64 for the truth."""
    return F64 if dt == F64 else F32


def rnd(x, dt):
    """Stores x in dt, rounding to nearest even (the truth keeps float64)."""
    return x.to(dt)


def trunc(x, dt):
    """Stores x in dt rounding toward zero (a conversion by bit shift: aiter #5151)."""
    if dt == F64:
        return x
    y = x.to(dt)
    over = y.to(F64).abs() > x.to(F64).abs()  # rounded away from zero: one step back
    return torch.where(over, torch.nextafter(y, torch.zeros((), dtype=dt)), y)


def lowacc_sum(x, dim, dt, tile=32):
    """A sum whose running total is stored in dt between tiles of `tile` terms (each tile summed
    in float32): the low-precision accumulator bug (pytorch #189581, cutlass #1188)."""
    x = x.movedim(dim, -1)
    total = torch.zeros(x.shape[:-1], dtype=dt)
    for s in range(0, x.shape[-1], tile):
        part = x[..., s:s + tile].to(F32).sum(-1)
        total = rnd(total.to(F32) + part, dt)
    return total.to(F32)


def lowacc_matmul(a, b, dt, tile=32):
    """a @ b with the running sum over k stored in dt between k-tiles."""
    out = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=dt)
    for s in range(0, a.shape[-1], tile):
        part = a[..., s:s + tile].to(F32) @ b[..., s:s + tile, :].to(F32)
        out = rnd(out.to(F32) + part, dt)
    return out.to(F32)


def tf32(x):
    """x rounded to TF32's 10-bit mantissa (TF32 left on in an fp32 run)."""
    bits = x.to(F32).view(torch.int32)
    rounded = (bits + 0x1000 + ((bits >> 13) & 1) - 1) & ~0x1FFF
    return rounded.view(F32)


# ---------------------------------------------------------------------------------------------
# Inputs


def draw(gen, shape, magnitude, distribution):
    """Activations as users see them: normal, with outliers (1% of values x30), or with an
    offset (a mean of 10 standard deviations, where one-pass variances cancel)."""
    x = torch.randn(shape, generator=gen, dtype=F64)
    if distribution == "outliers":
        mask = torch.rand(shape, generator=gen, dtype=F64) < 0.01
        x = torch.where(mask, x * 30, x)
    elif distribution == "offset":
        x = x + 10.0
    return x * magnitude


def weights(gen, shape, fan_in):
    return torch.randn(shape, generator=gen, dtype=F64) / math.sqrt(fan_in)


# ---------------------------------------------------------------------------------------------
# Kernels: make(gen, magnitude, distribution) -> inputs (float64); run(inputs, dt, variant) ->
# output. Inputs are first rounded to the run dtype (as the runs hold them) by the caller.


def _out(x, dt, variant):
    """The result stored in dt: rounded, truncated (the bug), or scaled by (1 + 2^-k) first
    (variant "bias:k", the probes of the smallest bias a rule detects)."""
    if variant.startswith("bias:"):
        x = x * (1 + 2.0 ** -int(variant[5:]))
    return trunc(x, dt) if variant == "trunc" else rnd(x, dt)


def _rows(x, frac, gen_seed=7):
    g = torch.Generator().manual_seed(gen_seed)
    n = x.shape[0]
    k = max(1, int(round(n * frac)))
    return torch.randperm(n, generator=g)[:k]


def _raced(x, frac):
    """A copy of x whose rows (a share `frac` of them, fixed) hold the previous row's values:
    a race, or a stale read of shared memory."""
    rows = _rows(x, frac)
    x = x.clone()
    x[rows] = x[rows - 1]
    return x


class Matmul:
    name = "matmul"
    correct = ("splitk", "reverse_k", "round_once")
    bugs = ("lowacc", "drop_k_tail", "trunc", "stale_rows", "tf32_on")

    def __init__(self, k):
        self.k = k
        self.name = f"matmul_k{k}"

    def make(self, gen, mag, dist):
        return {"a": draw(gen, (16, self.k), mag, dist), "b": weights(gen, (self.k, 32), self.k)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        a, b = x["a"], x["b"]
        if v == "splitk":
            parts = [a[:, s::4].to(acc) @ b[s::4].to(acc) for s in range(4)]
            y = (parts[0] + parts[1]) + (parts[2] + parts[3])
        elif v == "reverse_k":
            y = a.flip(1).to(acc) @ b.flip(0).to(acc)
        elif v == "round_once":
            y = a.to(F64) @ b.to(F64)
        elif v == "lowacc":
            y = lowacc_matmul(a, b, dt) if dt != F32 else lowacc_matmul(a, b, torch.bfloat16)
        elif v == "drop_k_tail":  # the last 8 of K skipped (tilelang #2381, triton #630)
            y = a[:, :-8].to(acc) @ b[:-8].to(acc)
        elif v == "tf32_on":
            y = tf32(a) @ tf32(b) if dt == F32 else (a.to(acc) @ b.to(acc))
        else:
            y = a.to(acc) @ b.to(acc)
        if v == "stale_rows":  # 2 of 16 rows hold the previous row's result (a race)
            y = _raced(y, 0.1)
        return _out(y, dt, v)


class Softmax:
    name = "softmax"
    correct = ("online", "exp2", "recip_mul")
    bugs = ("drop_one", "no_max", "lowacc", "trunc", "rows_off")

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (64, 512), mag, dist)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        z = x["x"].to(acc)
        if v == "online":  # flash-style: chunks of 64 with a running max and rescaled sum
            m = torch.full(z.shape[:1], -math.inf, dtype=acc)
            s = torch.zeros(z.shape[:1], dtype=acc)
            for c in range(0, z.shape[1], 64):
                blk = z[:, c:c + 64]
                m_new = torch.maximum(m, blk.max(1).values)
                s = s * torch.exp(m - m_new) + torch.exp(blk - m_new[:, None]).sum(1)
                m = m_new
            return _out(torch.exp(z - m[:, None]) / s[:, None], dt, v)
        m = z.max(1, keepdim=True).values if v != "no_max" else torch.zeros_like(z[:, :1])
        if v == "exp2":
            e = torch.exp2((z - m) * (1 / math.log(2)))
        else:
            e = torch.exp(z - m)
        if v == "drop_one":
            s = e[:, :-1].sum(1, keepdim=True)
        elif v == "lowacc":
            s = lowacc_sum(e, 1, dt if dt != F32 else torch.bfloat16)[:, None]
        else:
            s = e.sum(1, keepdim=True)
        if v == "rows_off":  # 1 row in 64 divided by its neighbour's sum (a race on shared memory)
            s = _raced(s, 1 / 64)
        y = e * (1 / s) if v == "recip_mul" else e / s
        return _out(y, dt, v)


class LayerNorm:
    name = "layernorm"
    correct = ("welford", "rsqrt", "round_then_affine")
    bugs = ("eps_x10", "onepass_var", "lowacc", "drop_one", "trunc")

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (64, 512), mag, dist),
                "w": 1 + 0.1 * torch.randn(512, generator=gen, dtype=F64),
                "b": 0.1 * torch.randn(512, generator=gen, dtype=F64)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        z, w, b = x["x"].to(acc), x["w"].to(acc), x["b"].to(acc)
        n = z.shape[1]
        eps = 1e-5 * (10 if v == "eps_x10" else 1)
        if v == "welford":  # per-chunk mean and M2, combined pairwise
            chunks = z.split(64, 1)
            means = [c.mean(1) for c in chunks]
            m2s = [((c - mu[:, None]) ** 2).sum(1) for c, mu in zip(chunks, means)]
            cnt = 64
            while len(means) > 1:
                nm, nm2 = [], []
                for i in range(0, len(means), 2):
                    d = means[i + 1] - means[i]
                    nm.append((means[i] + means[i + 1]) / 2)
                    nm2.append(m2s[i] + m2s[i + 1] + d * d * cnt / 2)
                means, m2s, cnt = nm, nm2, cnt * 2
            mean, var = means[0][:, None], (m2s[0] / n)[:, None]
        elif v == "onepass_var":  # E[x^2] - E[x]^2 in float32: cancels where the mean is large
            mean = z.mean(1, keepdim=True)
            var = ((z * z).mean(1, keepdim=True) - mean * mean).clamp_min(0)
        elif v == "lowacc":
            low = dt if dt != F32 else torch.bfloat16
            mean = (lowacc_sum(z, 1, low) / n)[:, None]
            var = (lowacc_sum((z - mean) ** 2, 1, low) / n)[:, None]
        elif v == "drop_one":  # the last column left out of the sums, still divided by n
            mean = z[:, :-1].sum(1, keepdim=True) / n
            var = ((z[:, :-1] - mean) ** 2).sum(1, keepdim=True) / n
        else:
            mean = z.mean(1, keepdim=True)
            var = ((z - mean) ** 2).mean(1, keepdim=True)
        r = torch.rsqrt(var + eps) if v == "rsqrt" else 1 / torch.sqrt(var + eps)
        h = (z - mean) * r
        if v == "round_then_affine":  # normalized value stored in dt, affine applied after
            h = rnd(h, dt).to(acc)
        return _out(h * w + b, dt, v)


class RMSNorm:
    name = "rmsnorm"
    correct = ("hf_order", "chunked", "rsqrt")
    bugs = ("eps_x10", "lowacc", "drop_one", "trunc", "weight_plus_one")

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (64, 512), mag, dist),
                "w": 1 + 0.1 * torch.randn(512, generator=gen, dtype=F64)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        z, w = x["x"].to(acc), x["w"].to(acc)
        n = z.shape[1]
        eps = 1e-6 * (10 if v == "eps_x10" else 1)
        if v == "chunked":
            ss = sum(c.pow(2).sum(1) for c in z.split(128, 1))[:, None]
        elif v == "lowacc":
            ss = lowacc_sum(z * z, 1, dt if dt != F32 else torch.bfloat16)[:, None]
        elif v == "drop_one":
            ss = z[:, :-1].pow(2).sum(1, keepdim=True)
        else:
            ss = z.pow(2).sum(1, keepdim=True)
        ms = ss / n
        r = torch.rsqrt(ms + eps) if v == "rsqrt" else 1 / torch.sqrt(ms + eps)
        h = z * r
        if v == "hf_order":  # HF: the normalized value stored in dt, then times the weight
            h = rnd(h, dt).to(acc)
        if v == "weight_plus_one":  # Gemma's (1 + w) convention applied to a plain weight
            return _out(h * (1 + w), dt, v)
        return _out(h * w, dt, v)


class Attention:
    name = "attention"
    correct = ("flash", "scale_on_q", "p_fp32")
    bugs = ("mask_off_by_one", "scale_in_dt", "drop_last_block", "lowacc_pv", "trunc")

    def make(self, gen, mag, dist):
        # q and k scaled so that scores stay of order 1 at every magnitude of v
        return {"q": draw(gen, (2, 64, 32), 1.0, dist), "k": draw(gen, (2, 64, 32), 1.0, dist),
                "v": draw(gen, (2, 64, 32), mag, dist)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        q, k, val = x["q"], x["k"], x["v"]
        scale = 1 / math.sqrt(q.shape[-1])
        t = q.shape[1]
        ks = torch.arange(t)
        if v == "mask_off_by_one":  # each query also sees the next key (TE #399, FA #1778)
            mask = ks[None, :] <= ks[:, None] + 1
        else:
            mask = ks[None, :] <= ks[:, None]
        if v == "scale_on_q":
            s = rnd(q.to(acc) * scale, dt).to(acc) @ k.to(acc).transpose(1, 2)
        elif v == "scale_in_dt":  # the softmax scale itself stored in dt (Megatron #848's class)
            sc = float(torch.tensor(scale, dtype=dt)) if dt != F32 else float(
                torch.tensor(scale, dtype=torch.bfloat16))
            s = (q.to(acc) @ k.to(acc).transpose(1, 2)) * sc
        else:
            s = (q.to(acc) @ k.to(acc).transpose(1, 2)) * scale
        s = s.masked_fill(~mask, -math.inf)
        if v == "drop_last_block":  # the last key block of 16 skipped (ragged tail: FA #2552)
            s[:, :, t - 16:] = -math.inf  # rows before the block never see it: causal
        if v == "flash":  # blocks of 16 keys: running max and sum, P stored in dt per block
            m = torch.full(s.shape[:2], -math.inf, dtype=acc)
            l_sum = torch.zeros(s.shape[:2], dtype=acc)
            o = torch.zeros(q.shape[:2] + val.shape[-1:], dtype=acc)
            for c in range(0, t, 16):
                blk = s[:, :, c:c + 16]
                m_new = torch.maximum(m, blk.max(-1).values)
                alpha = torch.exp(m - m_new)
                alpha = torch.where(torch.isnan(alpha), torch.zeros_like(alpha), alpha)
                p = torch.exp(blk - m_new[..., None])
                l_sum = l_sum * alpha + p.sum(-1)
                o = o * alpha[..., None] + rnd(p, dt).to(acc) @ val[:, c:c + 16].to(acc)
                m = m_new
            return _out(o / l_sum[..., None], dt, v)
        m = s.max(-1, keepdim=True).values
        p = torch.exp(s - m)
        l_sum = p.sum(-1, keepdim=True)
        if v == "p_fp32":  # P kept in float32 for the PV product
            o = p @ val.to(acc)
        elif v == "lowacc_pv":
            o = lowacc_matmul(rnd(p, dt if dt != F32 else torch.bfloat16),
                              val, dt if dt != F32 else torch.bfloat16, tile=16)
        else:
            o = rnd(p, dt).to(acc) @ val.to(acc)
        return _out(o / l_sum, dt, v)


def gelu_erf(h):
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


def gelu_tanh(h):
    return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


class GeluMLP:
    name = "gelu_mlp"
    correct = ("fused_act", "splitk")
    bugs = ("tanh_approx", "lowacc", "drop_k_tail", "trunc")

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (32, 128), mag, dist), "w1": weights(gen, (128, 256), 128),
                "w2": weights(gen, (256, 128), 256)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        a, w1, w2 = x["x"].to(acc), x["w1"].to(acc), x["w2"].to(acc)
        if v == "lowacc":
            low = dt if dt != F32 else torch.bfloat16
            h = lowacc_matmul(x["x"], x["w1"], low)
        elif v == "splitk":
            h = a[:, :64] @ w1[:64] + a[:, 64:] @ w1[64:]
        else:
            h = a @ w1
        if v != "fused_act":  # the pre-activation stored in dt; the fused kernel keeps float32
            h = rnd(h, dt).to(acc)
        g = gelu_tanh(h) if v == "tanh_approx" else gelu_erf(h)  # mistral.rs #1867
        g = rnd(g, dt).to(acc)
        y = g[:, :-8] @ w2[:-8] if v == "drop_k_tail" else g @ w2
        if v == "splitk":
            y = g[:, :128] @ w2[:128] + g[:, 128:] @ w2[128:]
        return _out(y, dt, v)


class SwiGLU:
    name = "swiglu_mlp"
    correct = ("fused_gate_up", "act_fp32")
    bugs = ("silu_in_dt", "lowacc", "trunc", "gate_up_swapped_rows")
    # In bf16 / fp16 the sigmoid stored in the run's dtype is one more rounding point, as
    # TransformerEngine#717's maintainers concluded of such a difference: correct there. In an
    # fp32 kernel it computes in bf16: a bug.
    relabel = {"silu_in_dt": {"bf16": "correct", "fp16": "correct"}}

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (32, 128), mag, dist), "wg": weights(gen, (128, 192), 128),
                "wu": weights(gen, (128, 192), 128), "wd": weights(gen, (192, 128), 192)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        a = x["x"].to(acc)
        wg, wu, wd = x["wg"].to(acc), x["wu"].to(acc), x["wd"].to(acc)
        if v == "fused_gate_up":
            gu = a @ torch.cat([wg, wu], 1)
            g, u = gu[:, :192], gu[:, 192:]
        elif v == "lowacc":
            low = dt if dt != F32 else torch.bfloat16
            g, u = lowacc_matmul(x["x"], x["wg"], low), lowacc_matmul(x["x"], x["wu"], low)
        else:
            g, u = a @ wg, a @ wu
        if v == "gate_up_swapped_rows":  # 1 row in 32 takes its neighbour's up projection
            u = _raced(u, 1 / 32)
        g, u = rnd(g, dt).to(acc), rnd(u, dt).to(acc)
        if v == "silu_in_dt":  # the sigmoid computed and stored in dt (TE #717's neighbour)
            sg = rnd(torch.sigmoid(g.to(dt if dt != F32 else torch.bfloat16)).to(acc), dt).to(acc)
            act = g * sg
        else:
            act = torch.nn.functional.silu(g)
        h = act * u
        if v != "act_fp32":
            h = rnd(h, dt).to(acc)
        return _out(h @ wd, dt, v)


class Allreduce:
    name = "allreduce"
    correct = ("tree", "reverse", "fp32_sum")
    bugs = ("chunk_missing_rank", "chunk_twice", "trunc")

    def __init__(self, ranks):
        self.ranks = ranks
        self.name = f"allreduce_{ranks}r"

    def make(self, gen, mag, dist):
        return {"p": draw(gen, (self.ranks, 4096), mag, dist)}

    def run(self, x, dt, v):
        p = x["p"]
        if dt == F64:
            return p.sum(0)
        acc = F32
        if v == "fp32_sum":
            return _out(p.to(acc).sum(0), dt, v)
        order = list(range(self.ranks))
        if v == "tree":
            parts = [p[i] for i in order]
            while len(parts) > 1:
                parts = [rnd(parts[i].to(acc) + parts[i + 1].to(acc), dt)
                         for i in range(0, len(parts), 2)]
            return parts[0]
        if v == "reverse":
            order.reverse()
        total = p[order[0]].to(dt)
        for r in order[1:]:  # a ring: each hop adds one rank and stores in dt
            nxt = total.to(acc) + p[r].to(acc)
            if v == "chunk_missing_rank" and r == order[-1]:  # the last 1/8 misses a rank
                nxt[-512:] = total[-512:].to(acc)
            if v == "chunk_twice" and r == order[-1]:
                nxt[-512:] += p[r, -512:].to(acc)
            total = _out(nxt, dt, v if r == order[-1] else "")
        return total


class FusedAllreduceResidualRMSNorm:
    """The inference engine's fused kernel, judged on one of its two outputs: the residual
    stream h (ar_residual) or the normalized y (ar_residual_rmsnorm). The reference rounds the
    allreduce to dt before adding the residual."""

    def __init__(self, output):
        self.output = output
        self.name = "ar_residual" if output == "h" else "ar_residual_rmsnorm"
        self.correct = ("fused_add",)
        self.bugs = (("trunc_residual", "residual_missing_chunk", "uninit_residual")
                     + (("eps_x10",) if output == "y" else ()))

    def make(self, gen, mag, dist):
        return {"p": draw(gen, (4, 32, 256), mag, dist), "res": draw(gen, (32, 256), mag, dist),
                "w": 1 + 0.1 * torch.randn(256, generator=gen, dtype=F64)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        ar = x["p"].to(acc).sum(0)
        res = x["res"].to(acc)
        if v != "fused_add":  # aiter PR #2586: the sum stored in dt before the residual
            ar = rnd(ar, dt).to(acc)
        hsum = ar + res
        if v == "residual_missing_chunk":
            hsum[-4:] = ar[-4:]
        if v == "uninit_residual":  # vllm PR #41972: garbage where zeros were meant, tiny here
            hsum[:, :8] = hsum[:, :8] + 1e-3 * hsum[:, :8].abs().mean()
        h = trunc(hsum, dt) if v == "trunc_residual" else _out(
            hsum, dt, v if self.output == "h" else "")  # a probe's bias once, on the output
        if self.output == "h":
            return h
        hz = h.to(acc)
        eps = 1e-6 * (10 if v == "eps_x10" else 1)
        y = hz * torch.rsqrt(hz.pow(2).mean(1, keepdim=True) + eps) * x["w"].to(acc)
        return _out(y, dt, v)


def scan(z):
    """Inclusive prefix sums along dim 1, one element after another in z's dtype (torch's CPU
    cumsum accumulates float32 in double: not the kernel a GPU runs)."""
    if z.dtype == F64:
        return z.cumsum(1)
    out = torch.empty_like(z)
    total = torch.zeros(z.shape[0], dtype=z.dtype)
    for i in range(z.shape[1]):
        total = total + z[:, i]
        out[:, i] = total
    return out


class Cumsum:
    name = "cumsum"
    correct = ("blocked",)
    bugs = ("carry_off_by_one", "carry_in_dt", "trunc")

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (16, 1024), mag, dist)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        z = x["x"].to(acc)
        if v in ("blocked", "carry_off_by_one", "carry_in_dt"):
            # blocks of 128 scanned in parallel (a tree within the block: torch's cumsum in
            # float64, rounded to the accumulator), each offset by the carry of those before
            out = []
            carry = torch.zeros(z.shape[0], dtype=acc)
            for c in range(0, z.shape[1], 128):
                blk = z[:, c:c + 128].to(F64).cumsum(1).to(acc) + carry[:, None]
                out.append(blk)
                if v == "carry_off_by_one":  # the block's last element left out of the carry
                    carry = blk[:, -2]
                elif v == "carry_in_dt":
                    carry = rnd(blk[:, -1], dt if dt != F32 else torch.bfloat16).to(acc)
                else:
                    carry = blk[:, -1]
            return _out(torch.cat(out, 1), dt, v)
        return _out(scan(z), dt, v)


class SoftmaxBackward:
    name = "softmax_bwd"
    correct = ("chunked", "expanded")
    bugs = ("lowacc", "drop_one", "trunc", "missing_term_rows")

    def make(self, gen, mag, dist):
        logits = draw(gen, (64, 256), 1.0, dist)
        return {"y": torch.softmax(logits, 1), "dy": draw(gen, (64, 256), mag, dist)}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        y, dy = x["y"].to(acc), x["dy"].to(acc)
        if v == "chunked":
            s = sum((y[:, c:c + 64] * dy[:, c:c + 64]).sum(1) for c in range(0, 256, 64))[:, None]
        elif v == "lowacc":
            s = lowacc_sum(y * dy, 1, dt if dt != F32 else torch.bfloat16)[:, None]
        elif v == "drop_one":
            s = (y[:, :-1] * dy[:, :-1]).sum(1, keepdim=True)
        else:
            s = (y * dy).sum(1, keepdim=True)
        if v == "missing_term_rows":  # 1 row in 64 misses the -sum term
            rows = _rows(s, 1 / 64)
            s = s.clone()
            s[rows] = 0
        dx = y * dy - y * s if v == "expanded" else y * (dy - s)
        return _out(dx, dt, v)


class RMSNormBackward:
    name = "rmsnorm_bwd"
    correct = ("chunked", "reordered")
    bugs = ("eps_x10", "lowacc", "drop_one", "trunc")

    def make(self, gen, mag, dist):
        return {"x": draw(gen, (64, 256), mag, dist),
                "w": 1 + 0.1 * torch.randn(256, generator=gen, dtype=F64),
                "dy": draw(gen, (64, 256), 1.0, "normal")}

    def run(self, x, dt, v):
        acc = acc_of(dt)
        z, w, dy = x["x"].to(acc), x["w"].to(acc), x["dy"].to(acc)
        n = z.shape[1]
        eps = 1e-6 * (10 if v == "eps_x10" else 1)
        low = dt if dt != F32 else torch.bfloat16
        if v == "lowacc":
            ms = (lowacc_sum(z * z, 1, low) / n)[:, None]
        elif v == "drop_one":
            ms = z[:, :-1].pow(2).sum(1, keepdim=True) / n
        elif v == "chunked":
            ms = sum(c.pow(2).sum(1) for c in z.split(64, 1))[:, None] / n
        else:
            ms = z.pow(2).mean(1, keepdim=True)
        r = torch.rsqrt(ms + eps)
        g = w * dy
        dot = (g * z).sum(1, keepdim=True) / n
        if v == "reordered":
            dx = r * g - z * (r * r * r) * dot
        else:
            dx = r * (g - z * r * r * dot)
        return _out(dx, dt, v)


KERNELS = [Matmul(512), Matmul(8192), Softmax(), LayerNorm(), RMSNorm(), Attention(), GeluMLP(),
           SwiGLU(), Allreduce(2), Allreduce(8), FusedAllreduceResidualRMSNorm("h"),
           FusedAllreduceResidualRMSNorm("y"), Cumsum(),
           SoftmaxBackward(), RMSNormBackward()]


# ---------------------------------------------------------------------------------------------
# Cases

# Variants that change nothing in that dtype, left out: a float32 accumulator stored in float32
# truncates nothing, and TF32 rounds only float32 operands.
NO_OPS = {("trunc", "fp32"), ("trunc_residual", "fp32"), ("tf32_on", "bf16"), ("tf32_on", "fp16")}


@dataclass
class Case:
    kernel: str
    dtype: str
    magnitude: float
    distribution: str
    seed: int
    variant: str
    label: str            # "correct" or "bug"
    effective: bool = False
    bias_only: bool = False   # effective by its sign bias alone (label)
    test: torch.Tensor = field(repr=False, default=None)
    ref: torch.Tensor = field(repr=False, default=None)
    truth: torch.Tensor = field(repr=False, default=None)
    error_ratio: float = 0.0  # RMSE(test, truth) / RMSE(ref, truth), for the 3x subset
    max_ratio: float = 0.0    # max|test - truth| / max|ref - truth|

    @property
    def key(self):
        return (f"{self.kernel}.{self.dtype}.m{self.magnitude:g}.{self.distribution}.s{self.seed}"
                f".{self.variant}")


def _as_runs_hold(inputs, dt):
    """The inputs as a run in dt holds them, widened to float64 exactly (what the truth sees)."""
    return {k: v.to(dt).to(F64) for k, v in inputs.items()}


def rows_of(x):
    """A tensor as rows: its last dimension, or blocks of 256 for a vector."""
    width = x.shape[-1] if x.dim() > 1 else min(256, x.numel())
    return x.reshape(-1, width)


def _rowwise_rmse(x, truth):
    return rows_of(x.to(F64) - truth).pow(2).mean(1).sqrt()


def _scale_rms(truth):
    return float(truth.pow(2).mean().sqrt())


def label(cases_of_config, truth):
    """Marks each bug of one configuration effective when, against the truth, its RMSE, the
    RMSE of its worst row or its largest element error exceeds twice the largest that the
    reference and every correct variant reach on the same inputs, when it is not finite, or
    when it is biased in sign where none of them is (error balance beyond +-0.5 where every
    correct one stays within +-0.25: a truncation); `bias_only` when only the last holds."""
    correct = [c for c in cases_of_config if c.label == "correct"]

    def measures(x):
        d = x.to(F64) - truth
        return (float(d.pow(2).mean().sqrt()), float(_rowwise_rmse(x, truth).max()),
                float(d.abs().max()))

    envelope = [max(m) for m in zip(*(measures(c.test) for c in correct))]
    env_eb = max(abs(error_balance(c.test, truth)[0]) for c in correct)
    for c in cases_of_config:
        if c.label != "bug":
            continue
        nonfinite = not bool(torch.isfinite(c.test.to(F64)).all())
        larger = nonfinite or any(m > 2 * e for m, e in zip(measures(c.test), envelope))
        biased = abs(error_balance(c.test, truth)[0]) > 0.5 and env_eb < 0.25
        c.effective = larger or biased
        c.bias_only = biased and not larger


def error_balance(x, truth):
    """(EB, #(x != truth)): (#(|x| > |truth|) - #(|x| < |truth|)) / #(x != truth)."""
    t = x.to(F64)
    differ = int((t != truth).sum())
    if differ == 0:
        return 0.0, 0
    over, under = int((t.abs() > truth.abs()).sum()), int((t.abs() < truth.abs()).sum())
    return (over - under) / differ, differ


def _ratio(num, den):
    if den == 0:
        return math.inf if num > 0 else 0.0
    return num / den


def build(seeds=(0, 1, 2), dtypes=tuple(DTYPES), magnitudes=MAGNITUDES,
          distributions=DISTRIBUTIONS, kernels=None, progress=None):
    """Every case of the corpus: per kernel, dtype, magnitude, distribution and seed, the
    reference (kept as each case's ref), each correct variant and each bug, with the truth on
    the inputs as the runs hold them."""
    cases, skipped = [], []
    kernels = KERNELS if kernels is None else kernels
    configs = [(k, d, m, di, s) for k in kernels for d in dtypes for m in magnitudes
               for di in distributions for s in seeds]
    for i, (kern, dname, mag, dist, seed) in enumerate(configs):
        dt = DTYPES[dname]
        gen = torch.Generator().manual_seed(zlib.crc32(f"{kern.name}:{mag}:{dist}:{seed}".encode()))
        inputs = kern.make(gen, mag, dist)
        held = _as_runs_hold(inputs, dt)
        truth = kern.run(held, F64, "ref")
        ref = kern.run(held, dt, "ref")
        if not bool(torch.isfinite(ref.to(F64)).all()):  # overflowed in dt: nothing to judge
            skipped.append(f"{kern.name} {dname} magnitude {mag:g} {dist} seed {seed}")
            continue
        group = []
        for variant, lab in [(v, "correct") for v in kern.correct] + \
                            [(v, "bug") for v in kern.bugs]:
            if (variant, dname) in NO_OPS:
                continue
            lab = getattr(kern, "relabel", {}).get(variant, {}).get(dname, lab)
            test = kern.run(held, dt, variant)
            group.append(Case(kern.name, dname, mag, dist, seed, variant, lab,
                              test=test, ref=ref, truth=truth))
        # the reference itself counts among the correct implementations for the envelope
        group_with_ref = group + [Case(kern.name, dname, mag, dist, seed, "ref", "correct",
                                       test=ref, ref=ref, truth=truth)]
        label(group_with_ref, truth)
        base_rmse = float((ref.to(F64) - truth).pow(2).mean().sqrt())
        base_max = float((ref.to(F64) - truth).abs().max())
        for c in group:
            d = c.test.to(F64) - truth
            c.error_ratio = _ratio(float(d.pow(2).mean().sqrt()), base_rmse)
            c.max_ratio = _ratio(float(d.abs().max()), base_max)
        cases.extend(group)
        if progress:
            progress(i + 1, len(configs))
    return cases, skipped


def bias_probes(dtypes=tuple(DTYPES), ks=range(4, 27), kernels=None):
    """Each kernel's reference against itself with its result scaled by (1 + 2^-k) before the
    final store, at magnitude 1, normal inputs, seed 0: {(dtype, k): [Case, ...]}."""
    probes = {}
    for kern in KERNELS if kernels is None else kernels:
        gen = torch.Generator().manual_seed(zlib.crc32(f"{kern.name}:probe".encode()))
        inputs = kern.make(gen, 1.0, "normal")
        for dname in dtypes:
            dt = DTYPES[dname]
            held = _as_runs_hold(inputs, dt)
            truth, ref = kern.run(held, F64, "ref"), kern.run(held, dt, "ref")
            for k in ks:
                test = kern.run(held, dt, f"bias:{k}")
                probes.setdefault((dname, k), []).append(
                    Case(kern.name, dname, 1.0, "normal", 0, f"bias:{k}", "bug", True,
                         test=test, ref=ref, truth=truth))
    return probes
