"""test_same_parity.py: the same rule's verdicts equal torch._dynamo.utils.same()'s on random
cases around the pass boundary, for every multiplier branch and option; on issue 19's repros;
and on a boundary hunt, where same()'s own float64 rounding decides the rmse inequality,
equal exact rational arithmetic instead."""
import math
import random
import struct
from decimal import Decimal, getcontext
from fractions import Fraction

import pytest
import torch
from safetensors.torch import save_file
from torch._dynamo.utils import same

import numalign

SHAPES = [(7,), (300,), (999,), (1000,), (4096,), (3, 700, 1, 1), (2, 2, 300)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


def make_cases(seed, count, spread):
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for i in range(count):
        dtype = DTYPES[i % len(DTYPES)]
        shape = SHAPES[(i // len(DTYPES)) % len(SHAPES)]
        truth = torch.randn(shape, dtype=torch.float64, generator=g)
        noise = 10 ** float(torch.empty(1).uniform_(-6, -1, generator=g))
        ref = (truth + noise * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
        # Errors spread around the boundary (0.5x to `spread` x the reference's), or within tol.
        if i % 5 == 4:
            test = (ref.double() + 1e-4 * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
        else:
            factor = float(torch.empty(1).uniform_(0.5, spread, generator=g))
            test = (truth + factor * noise * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
        if i % 17 == 3:  # same()'s NaN escape: a NaN in ref only
            ref = ref.clone()
            ref.view(-1)[0] = float("nan")
        cases[f"case{i:03d}"] = (test, ref, truth)
    return cases


@pytest.mark.parametrize("options", [
    {"tol": 1e-4},
    {"tol": 2e-2},
    {"tol": 1e-4, "use_larger_multiplier_for_smaller_tensor": True},
    {"tol": 1e-4, "force_max_multiplier": True},
    {"tol": 1e-3, "equal_nan": True},
], ids=["default", "tol2e-2", "larger-small", "force-max", "equal-nan"])
def test_verdicts_match_same(cli, judge_json, tmp_path, options):
    spread = 15.0 if options.get("force_max_multiplier") else 5.0
    cases = make_cases(seed=len(tmp_path.name), count=140, spread=spread)
    for k, role in enumerate(("test", "ref", "truth")):
        save_file({n: c[k].contiguous() for n, c in cases.items()}, tmp_path / f"{role}.safetensors")
    flags = ["--rule", "same", "--tol", repr(options["tol"])]
    if options.get("use_larger_multiplier_for_smaller_tensor"):
        flags.append("--larger-multiplier-for-small")
    if options.get("force_max_multiplier"):
        flags.append("--force-max-multiplier")
    if options.get("equal_nan"):
        flags.append("--equal-nan")
    report = judge_json(tmp_path / "test.safetensors", tmp_path / "ref.safetensors",
                        tmp_path / "truth.safetensors", *flags)
    ours = {t["name"]: t for t in report["tensors"]}
    outcomes = {"pass": 0, "fail": 0}
    for name, (test, ref, truth) in cases.items():
        expected = same(ref, test, fp64_ref=truth, log_error=lambda *a: None, **options)
        got = ours[name]["verdict"]
        assert got in ("pass", "fail"), ours[name]
        assert (got == "pass") == expected, (name, test.dtype, tuple(test.shape), ours[name]["reason"])
        outcomes[got] += 1
        if ours[name]["error"] is not None and ours[name]["ratio"] is not None and not math.isnan(ours[name]["error"]):
            res_error = torch.sqrt(torch.mean(torch.square(truth - test))).item()
            assert ours[name]["error"] == pytest.approx(res_error, rel=1e-12, abs=1e-300)
    # The cases straddle the boundary: both outcomes occur, so the comparison means something.
    assert outcomes["pass"] >= 10 and outcomes["fail"] >= 10, outcomes


def tensors(dtype, test, ref, truth):
    return (torch.tensor(test, dtype=dtype), torch.tensor(ref, dtype=dtype),
            torch.tensor(truth, dtype=torch.float64))


# The issue's repros (numel 1; same() with torch 2.13 gives the expected verdicts).
REPROS = {
    # bf16 at tol 0.02: atol rounds to 0.02001953125 in bf16, and allowed = 0.0350146...
    # rounds to a tie that goes up to 0.03515625 = |ref - test|: allclose passes.
    "bf16-allclose": (torch.bfloat16, 0.02, 0.75, 0.71484375, 0.7181009319334107, True),
    # fp16 at tol 0.03: atol is 0.029998779296875 in fp16, allowed rounds down to
    # 0.03009033203125 < |ref - test| = 0.0301055908203125: not close, and the rmse fails.
    "fp16-allclose": (torch.float16, 0.03, -0.003276824951171875, 0.026824951171875,
                      0.026824951171875, False),
    # fp16 NaN escape: truth.to(fp16) = 1.4365234375 against test 1.3427734375 at 4e-2: the
    # allowance 0.04 + 0.04 * 1.34 rounds to 0.09375 with atol in fp16, = |difference|.
    "fp16-nan-escape": (torch.float16, 1e-4, 1.3427734375, math.nan, 1.4365234375, True),
}


@pytest.mark.parametrize("name", list(REPROS))
def test_issue_repros(name):
    dtype, tol, test, ref, truth, verdict = REPROS[name]
    t, r, u = tensors(dtype, [test], [ref], [truth])
    assert same(r, t, fp64_ref=u, tol=tol, log_error=lambda *a: None) is verdict
    report = numalign.judge({"x": t}, {"x": r}, {"x": u}, tol=tol, rules=["same"])
    assert (report["x"]["verdict"] == "pass") is verdict, report["x"]["reason"]


# ---------------------------------------------------------------------------------------------
# Boundary hunt: cases placed on the dtype grid within a few steps of each of same()'s
# decision boundaries (allclose's atol/rtol line, the NaN escape's allclose at 4e-2, the rmse
# inequality res_error <= multiplier * ref_error + tol / 10 and its multiplier tiers), for every
# dtype, a range of tols and every option. allclose boundaries are judged against same()
# itself. The rmse inequality is judged against exact rational arithmetic (fractions), and
# against same() wherever same()'s own float64 rounding does not decide it.


HUNT_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
WIDTH = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32, torch.float64: 64}
PACK = {torch.float16: ("<e", "<H"), torch.float32: ("<f", "<I"), torch.float64: ("<d", "<Q")}
KW = {"use_larger_multiplier_for_smaller_tensor": "larger_multiplier_for_small",
      "force_max_multiplier": "force_max_multiplier", "equal_nan": "equal_nan"}
PLAIN, LARGER, FORCE, EQUAL_NAN = ((), (("use_larger_multiplier_for_smaller_tensor", True),),
                                   (("force_max_multiplier", True),), (("equal_nan", True),))
getcontext().prec = 60


def to_bits(x, dtype):
    if dtype is torch.bfloat16:
        return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
    f, i = PACK[dtype]
    return struct.unpack(i, struct.pack(f, x))[0]


def from_bits(b, dtype):
    if dtype is torch.bfloat16:
        return struct.unpack("<f", struct.pack("<I", b << 16))[0]
    f, i = PACK[dtype]
    return struct.unpack(f, struct.pack(i, b))[0]


def grid(x, dtype):
    """x rounded to dtype as torch rounds a float64 (for the half types: through float)."""
    return torch.tensor(x, dtype=torch.float64).to(dtype).item()


def step(x, dtype, k):
    """The value k representable steps of dtype away from x (on dtype's grid), through zero;
    None past the finite range."""
    sign = 1 << (WIDTH[dtype] - 1)
    b = to_bits(x, dtype)
    o = (-(b & (sign - 1)) if b & sign else b) + k
    v = from_bits(o if o >= 0 else sign | -o, dtype)
    return v if math.isfinite(v) else None


def same_multiplier(dtype, shape, tol, options):
    """same()'s get_multiplier, in its order (the oracle needs it to place the boundary)."""
    o = dict(options)
    numel = math.prod(shape)
    if o.get("force_max_multiplier"):
        return 10.0
    m = 3.0 if dtype in (torch.float16, torch.bfloat16) else 2.0
    larger = o.get("use_larger_multiplier_for_smaller_tensor")
    if larger and numel <= 10:
        return 10.0
    if larger and numel <= 500:
        return 8.0
    if numel < 1000 or (len(shape) == 4 and shape[-1] == shape[-2] == 1) or tol >= 2 * 1e-2:
        return 3.0
    return m


class Case:
    def __init__(self, kind, test, ref, truth, tol, options):
        self.kind, self.test, self.ref, self.truth = kind, test, ref, truth
        self.tol, self.options = tol, options


def random_value(rng, dtype, lo=-8, hi=8):
    return grid(rng.choice((-1, 1)) * 2.0 ** rng.uniform(lo, hi), dtype)


def allclose_cases(dtype, rng, tols, bases, reach=3):
    """ref a few steps either side of test +- (tol + tol * |test|); truth = ref, so the rmse
    inequality fails (|test - ref| is far above tol / 10) and allclose alone decides."""
    specials = {torch.float16: [0.0, 2.0 ** -20, 3e4], torch.bfloat16: [0.0, 2.0 ** -130, 1e30],
                torch.float32: [0.0, 2.0 ** -140, 1e30], torch.float64: [0.0, 2.0 ** -1060, 1e300]}
    for tol in tols:
        values = specials[dtype] + [random_value(rng, dtype) for _ in range(bases)]
        for t in values:
            t = grid(t, dtype) * rng.choice((-1, 1))
            for s in (1, -1):
                r0 = grid(t + s * (tol + tol * abs(t)), dtype)
                for k in range(-reach, reach + 1):
                    r = step(r0, dtype, k)
                    if r is not None and r != t:
                        yield Case("allclose", *tensors(dtype, [t], [r], [r]), tol, PLAIN)


def escape_cases(dtype, rng, bases, reach=3):
    """same()'s NaN escape: ref NaN, test finite; passes iff allclose(truth.to(dtype), test,
    4e-2, 4e-2). The truth lies a few dtype steps either side of that line, and at the float64
    midpoints between dtype values (and a hair either side) where the conversion's rounding
    decides."""
    for i in range(bases):
        t = random_value(rng, dtype, -6, 6)
        options = EQUAL_NAN if i % 4 == 3 else PLAIN
        for s in (1, -1):
            u0 = grid(t + s * (0.04 + 0.04 * abs(t)), dtype)
            for k in range(-reach, reach + 1):
                u = step(u0, dtype, k)
                if u is None:
                    continue
                truths = [u]
                nxt = step(u, dtype, 1)
                if dtype is not torch.float64 and nxt is not None:
                    mid = (Fraction(u) + Fraction(nxt)) / 2
                    truths += [float(mid), math.nextafter(float(mid), -math.inf),
                               math.nextafter(float(mid), math.inf)]
                for v in truths:
                    yield Case("escape", *tensors(dtype, [t], [math.nan], [v]), 1e-4, options)


def rmse_scalar_cases(dtype, rng, tols, option_sets, bases, reach=6):
    """numel 1: test and ref on the grid, allclose clearly failing; the truth u solves
    |u - test| = m |u - ref| + tol / 10 (between ref and test, or beyond ref), and the cases
    walk u over float64 steps around it."""
    for tol in tols:
        for options in option_sets:
            m = Fraction(same_multiplier(dtype, (1,), tol, options))
            c = Fraction(tol) / 10
            for _ in range(bases):
                t = random_value(rng, dtype, -4, 4)
                r = grid(t - rng.choice((-1, 1)) * rng.uniform(1.5, 40) * tol * (1 + abs(t)), dtype)
                if not abs(t - r) > 1.01 * tol * (1 + abs(t)):
                    continue
                s = 1 if t > r else -1
                for u_star in ((Fraction(t) + m * Fraction(r) - s * c) / (1 + m),
                               (m * Fraction(r) + s * c - Fraction(t)) / (m - 1)):
                    u = float(u_star)
                    for _ in range(reach):
                        u = math.nextafter(u, -math.inf)
                    for _ in range(2 * reach + 1):
                        yield Case("rmse", *tensors(dtype, [t], [r], [u]), tol, options)
                        u = math.nextafter(u, math.inf)


def exact_errors(test, ref, truth):
    """Sums of squares of test - truth and ref - truth, exactly, and the element count."""
    u = [Fraction(x) for x in truth.reshape(-1).tolist()]
    se = sum((Fraction(x) - v) ** 2 for x, v in zip(test.double().reshape(-1).tolist(), u))
    sb = sum((Fraction(x) - v) ** 2 for x, v in zip(ref.double().reshape(-1).tolist(), u))
    return se, sb, len(u)


def exact_pass(se, sb, n, m, tol):
    """sqrt(se / n) <= m * sqrt(sb / n) + tol / 10 in exact arithmetic: with
    K = se - m^2 sb - n c^2, it holds iff K <= 0 or K^2 <= 4 m^2 c^2 n sb."""
    m, c = Fraction(m), Fraction(tol) / 10
    k = se - m * m * sb - n * c * c
    return k <= 0 or k * k <= 4 * m * m * c * c * n * sb


def boundary_gap(se, sb, n, m, tol):
    """(error - (m * baseline + tol / 10)) / that bound, to 60 digits: how far from the line."""
    e = (Decimal(se.numerator) / Decimal(se.denominator) / n).sqrt()
    b = (Decimal(sb.numerator) / Decimal(sb.denominator) / n).sqrt()
    bound = Decimal(m) * b + Decimal(Fraction(tol).numerator) / Decimal(Fraction(tol).denominator) / 10
    return (e - bound) / bound


def rmse_tensor_cases(dtype, rng, shapes, option_sets, reach=8):
    """numel > 1, every multiplier tier: random ref and test around a float64 truth, then the
    tol that puts the inequality on its boundary (tol* = 10 (error - m baseline), from the
    exact sums), and the float64 steps of tol around it."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for shape in shapes:
        for options in option_sets:
            m0 = same_multiplier(dtype, shape, 1e-3, options)
            for _attempt in range(6):  # small tensors' draws can miss the window: draw again
                sigma = 10 ** rng.uniform(-4.5, -2.5)
                truth = torch.randn(shape, dtype=torch.float64, generator=g)
                ref = (truth + sigma * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
                b = torch.sqrt(torch.mean(torch.square(truth - ref))).item()
                noise = torch.randn(shape, dtype=torch.float64, generator=g)
                noise *= (m0 + 0.4) * b / torch.sqrt(torch.mean(noise * noise))
                test = (truth + noise).to(dtype)
                se, sb, n = exact_errors(test, ref, truth)
                e = float((Decimal(se.numerator) / Decimal(se.denominator) / n).sqrt())
                b = float((Decimal(sb.numerator) / Decimal(sb.denominator) / n).sqrt())
                tol = 10 * (e - m0 * b)
                if (1e-6 < tol < 1.9e-2 and same_multiplier(dtype, shape, tol, options) == m0
                        and not torch.allclose(ref, test, atol=2 * tol, rtol=2 * tol)):
                    break  # else allclose, not the rmse inequality, would decide
            else:
                continue
            for _ in range(reach):
                tol = math.nextafter(tol, -math.inf)
            for _ in range(2 * reach + 1):
                yield Case("rmse", test, ref, truth, tol, options)
                tol = math.nextafter(tol, math.inf)


def tier_cases(dtype, rng):
    """The multiplier's tiers at their edges (numel 10/11, 500/501, 999/1000, 4-D with the
    last two dims 1 or not, tol just below 2e-2 or at it), with error / baseline between the
    tiers' multipliers so that the tier decides."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    layouts = [((10,), LARGER, 9.0), ((11,), LARGER, 9.0), ((500,), LARGER, 5.0), ((501,), LARGER, 5.0),
               ((999,), PLAIN, 2.5), ((1000,), PLAIN, 2.5), ((2, 500, 1, 1), PLAIN, 2.5),
               ((2, 500, 1, 2), PLAIN, 2.5), ((1000,), FORCE, 9.0), ((10,), FORCE, 11.0)]
    for shape, options, ratio in layouts:
        for tol in (1e-3, math.nextafter(2e-2, 0), 2e-2):
            truth = torch.randn(shape, dtype=torch.float64, generator=g)
            noise = torch.randn(shape, dtype=torch.float64, generator=g)
            ref = (truth + 0.05 * noise).to(dtype)
            b = torch.sqrt(torch.mean(torch.square(truth - ref))).item()
            noise = torch.randn(shape, dtype=torch.float64, generator=g)
            test = (truth + ratio * b * noise / torch.sqrt(torch.mean(noise * noise)))
            yield Case("rmse", test.to(dtype), ref, truth, tol, options)


def judge_all(cases):
    """numalign.judge on every case, grouped by (tol, options): verdict per case index."""
    groups = {}
    for i, c in enumerate(cases):
        groups.setdefault((c.tol, c.options), []).append(i)
    verdicts = {}
    for (tol, options), members in groups.items():
        report = numalign.judge({f"c{i}": cases[i].test for i in members},
                                {f"c{i}": cases[i].ref for i in members},
                                {f"c{i}": cases[i].truth for i in members}, tol=tol,
                                rules=["same"], **{KW[k]: v for k, v in options})
        for t in report.tensors:
            assert t["verdict"] in ("pass", "fail"), t
            verdicts[int(t["name"][1:])] = t["verdict"] == "pass"
    return verdicts


def hunt(dtype, seed):
    rng = random.Random(seed)
    tols = [1e-5, 1e-4, 3e-4, 1e-3, 5e-3, 1e-2, math.nextafter(2e-2, 0), 2e-2, 3e-2, 4e-2, 0.1,
            rng.uniform(1e-4, 5e-2)]
    cases = list(allclose_cases(dtype, rng, tols, bases=10))
    cases += escape_cases(dtype, rng, bases=40)
    cases += rmse_scalar_cases(dtype, rng, [1e-4, 1e-3, 1.5e-2, 3e-2],
                               [PLAIN, LARGER, FORCE, EQUAL_NAN], bases=4)
    shapes = [(2,), (10,), (11,), (500,), (501,), (999,), (1000,), (1024,), (3, 400, 1, 1),
              (3, 400, 1, 2), (4, 8, 40)]
    cases += rmse_tensor_cases(dtype, rng, shapes, [PLAIN, LARGER, FORCE])
    cases += tier_cases(dtype, rng)
    return cases


def check_hunt(dtype, seed):
    cases = hunt(dtype, seed)
    ours = judge_all(cases)
    counts = {"allclose": 0, "escape": 0, "rmse": 0, "pass": 0, "fail": 0, "rounding": 0}
    exact_cache = {}
    for i, c in enumerate(cases):
        expected = same(c.ref, c.test, fp64_ref=c.truth, tol=c.tol, log_error=lambda *a: None,
                        **dict(c.options))
        counts[c.kind] += 1
        counts["pass" if expected else "fail"] += 1
        where = (c.kind, dtype, c.tol, c.options, c.test.tolist()[:2], c.ref.tolist()[:2],
                 c.truth.tolist()[:2])
        if c.kind != "rmse":
            assert ours[i] == expected, where
            continue
        # The rmse cases fail allclose by construction (checked against torch itself).
        assert not torch.allclose(c.ref, c.test, atol=c.tol, rtol=c.tol), where
        key = id(c.test), id(c.ref), id(c.truth)
        if key not in exact_cache:
            exact_cache[key] = exact_errors(c.test, c.ref, c.truth)
        se, sb, n = exact_cache[key]
        m = same_multiplier(dtype, tuple(c.test.shape), c.tol, c.options)
        exact = exact_pass(se, sb, n, m, c.tol)
        assert ours[i] == exact, ("numalign differs from exact arithmetic", where)
        if exact != expected:
            # same()'s float64 rounding decided it: the case sits on the line to the last bits.
            assert abs(boundary_gap(se, sb, n, m, c.tol)) < Decimal("1e-12"), where
            counts["rounding"] += 1
    print(f"\n{dtype}: {len(cases)} boundary cases {counts}")
    return counts


@pytest.mark.parametrize("dtype", HUNT_DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_boundary_hunt(dtype):
    counts = check_hunt(dtype, seed=19 + WIDTH[dtype] + (dtype is torch.bfloat16))
    # Thousands of cases per dtype, each boundary hunted, both verdicts well represented.
    assert counts["allclose"] >= 2000 and counts["escape"] >= 400 and counts["rmse"] >= 1500, counts
    assert counts["pass"] >= 500 and counts["fail"] >= 500, counts
