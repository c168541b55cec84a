// metrics_simd.cpp: the fused pass on SIMD vectors of float64 lanes, compiled once per
// instruction set by Highway (foreach_target) and dispatched at run time to the best one
// this CPU supports. Per block of kBlock elements: decode test and ref to doubles and their
// ULP distances (one dtype switch per block), fold test-vs-ref metrics, then truth metrics;
// lane accumulators keep counts and maxima with their first index. Rare lanes (NaN, Inf,
// allclose verdicts close to the boundary) are finished by the scalar code they must match.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "metrics_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Include order matters: foreach_target re-includes this file once per target.
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "metrics_internal.hpp"

HWY_BEFORE_NAMESPACE();
namespace numalign::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<double>;
using DU = hn::RebindToUnsigned<D>;
using DI = hn::RebindToSigned<D>;
using VD = hn::Vec<D>;
using VU = hn::Vec<DU>;

// The ULP distance of a lane whose NaN has no counterpart: above every real distance.
constexpr std::uint64_t kInfDistance = ~std::uint64_t{0};

// Decodes n elements (a multiple of the lane count) to doubles. F64 needs no copy.
const double* DecodeDoubles(DType dt, const std::byte* src, std::size_t n, double* out) {
  const D d;
  const std::size_t N = hn::Lanes(d);
  switch (dt) {
    case DType::F64:
      return reinterpret_cast<const double*>(src);
    case DType::F32: {
      const hn::Rebind<float, D> df;
      const auto* p = reinterpret_cast<const float*>(src);
      for (std::size_t i = 0; i < n; i += N)
        hn::Store(hn::PromoteTo(d, hn::LoadU(df, p + i)), d, out + i);
      return out;
    }
    case DType::BF16: {  // bf16 is the top half of a float32
      const hn::Rebind<std::uint16_t, D> d16;
      const hn::Rebind<std::uint32_t, D> d32;
      const hn::Rebind<float, D> df;
      const auto* p = reinterpret_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < n; i += N) {
        const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, p + i)));
        hn::Store(hn::PromoteTo(d, hn::BitCast(df, bits)), d, out + i);
      }
      return out;
    }
    case DType::F16: {
      // Below AVX2 Highway emulates the conversion and maps Inf/NaN to finite values (the
      // every-pattern test caught it): there, and off x86, the exact table decode is used.
#if HWY_ARCH_X86 && HWY_TARGET < HWY_SSE4 && !defined(HWY_DISABLE_F16C)
      const hn::Rebind<hwy::float16_t, D> dh;
      const hn::Rebind<float, D> df;
      const auto* p = reinterpret_cast<const hwy::float16_t*>(src);
      for (std::size_t i = 0; i < n; i += N) {
        hn::Store(hn::PromoteTo(d, hn::PromoteTo(df, hn::LoadU(dh, p + i))), d, out + i);
      }
#else
      decode_block(dt, src, n, out);
#endif
      return out;
    }
    default:  // fp8 (table lookups) and integers
      decode_block(dt, src, n, out);
      return out;
  }
}

// |ordinal(a) - ordinal(b)| of sign-magnitude patterns held in 32-bit lanes (16-bit types).
template <class V32>
VU Distance16(V32 a, V32 b, std::uint32_t sign) {
  const hn::Rebind<std::int32_t, D> di32;
  const auto vsign = hn::Set(di32, static_cast<std::int32_t>(sign));
  const auto mag_mask = hn::Set(di32, static_cast<std::int32_t>(sign - 1));
  const auto ia = hn::BitCast(di32, a), ib = hn::BitCast(di32, b);
  const auto ma = hn::And(ia, mag_mask), mb = hn::And(ib, mag_mask);
  const auto oa =
      hn::IfThenElse(hn::Eq(hn::And(ia, vsign), vsign), hn::Sub(hn::Zero(di32), ma), ma);
  const auto ob =
      hn::IfThenElse(hn::Eq(hn::And(ib, vsign), vsign), hn::Sub(hn::Zero(di32), mb), mb);
  const hn::Rebind<std::uint32_t, D> du32;
  return hn::PromoteTo(DU(), hn::BitCast(du32, hn::Abs(hn::Sub(oa, ob))));
}

// Sign-magnitude ordinals of 64-bit lanes, and their distance with wrap-around (exact).
VU Distance64(VU a, VU b) {
  const DI di;
  const DU du;
  const auto sign = hn::Set(du, std::uint64_t{1} << 63);
  auto ordinal = [&](VU v) {
    const auto mag = hn::BitCast(di, hn::AndNot(sign, v));
    return hn::IfThenElse(hn::RebindMask(di, hn::Eq(hn::And(v, sign), sign)),
                          hn::Sub(hn::Zero(di), mag), mag);
  };
  const auto oa = ordinal(a), ob = ordinal(b);
  return hn::Sub(hn::BitCast(du, hn::Max(oa, ob)), hn::BitCast(du, hn::Min(oa, ob)));
}

// ULP distances of n floating elements (NaN lanes give meaningless values; callers mask).
void UlpDistances(DType dt, const std::byte* a, const std::byte* b, std::size_t n,
                  std::uint64_t* out) {
  const DU du;
  const std::size_t N = hn::Lanes(du);
  switch (dt) {
    case DType::BF16:
    case DType::F16: {
      const hn::Rebind<std::uint16_t, D> d16;
      const hn::Rebind<std::uint32_t, D> d32;
      const auto* pa = reinterpret_cast<const std::uint16_t*>(a);
      const auto* pb = reinterpret_cast<const std::uint16_t*>(b);
      for (std::size_t i = 0; i < n; i += N) {
        const auto va = hn::PromoteTo(d32, hn::LoadU(d16, pa + i));
        const auto vb = hn::PromoteTo(d32, hn::LoadU(d16, pb + i));
        hn::Store(Distance16(va, vb, 0x8000u), du, out + i);
      }
      return;
    }
    case DType::F32: {
      const hn::Rebind<std::uint32_t, D> d32;
      const auto* pa = reinterpret_cast<const std::uint32_t*>(a);
      const auto* pb = reinterpret_cast<const std::uint32_t*>(b);
      for (std::size_t i = 0; i < n; i += N) {
        // Moved into the top half of 64-bit lanes, a float32's sign-magnitude order is a
        // float64's: the distance scales by 2^32 exactly.
        const auto va = hn::ShiftLeft<32>(hn::PromoteTo(du, hn::LoadU(d32, pa + i)));
        const auto vb = hn::ShiftLeft<32>(hn::PromoteTo(du, hn::LoadU(d32, pb + i)));
        hn::Store(hn::ShiftRight<32>(Distance64(va, vb)), du, out + i);
      }
      return;
    }
    case DType::F64: {
      const auto* pa = reinterpret_cast<const std::uint64_t*>(a);
      const auto* pb = reinterpret_cast<const std::uint64_t*>(b);
      for (std::size_t i = 0; i < n; i += N) {
        hn::Store(Distance64(hn::LoadU(du, pa + i), hn::LoadU(du, pb + i)), du, out + i);
      }
      return;
    }
    default: {  // the 8-bit formats: their ordinals from the scalar definition
      std::int64_t oa[kBlock], ob[kBlock];
      bool nan_a[kBlock], nan_b[kBlock];
      ordinal_block(dt, a, n, oa, nan_a);
      ordinal_block(dt, b, n, ob, nan_b);
      for (std::size_t i = 0; i < n; ++i) out[i] = ordinal_distance(oa[i], ob[i]);
      return;
    }
  }
}

// Elements whose bit patterns differ, for element sizes 1, 2, 4 and 8.
template <class T>
std::uint64_t CountDifferentAs(const std::byte* a, const std::byte* b, std::size_t n) {
  const hn::ScalableTag<T> dt;
  const std::size_t N = hn::Lanes(dt);
  const auto* pa = reinterpret_cast<const T*>(a);
  const auto* pb = reinterpret_cast<const T*>(b);
  std::uint64_t count = 0;
  std::size_t i = 0;
  for (; i + N <= n; i += N)
    count += hn::CountTrue(dt, hn::Ne(hn::LoadU(dt, pa + i), hn::LoadU(dt, pb + i)));
  for (; i < n; ++i) count += std::memcmp(pa + i, pb + i, sizeof(T)) != 0;
  return count;
}

std::uint64_t CountBitsDiffer(std::size_t element_size, const std::byte* a, const std::byte* b,
                              std::size_t n) {
  switch (element_size) {
    case 1:
      return CountDifferentAs<std::uint8_t>(a, b, n);
    case 2:
      return CountDifferentAs<std::uint16_t>(a, b, n);
    case 4:
      return CountDifferentAs<std::uint32_t>(a, b, n);
    default:
      return CountDifferentAs<std::uint64_t>(a, b, n);
  }
}

// Histogram of ULP distances. Four interleaved copies keep consecutive increments of the
// same bin (the common case) from waiting on each other's stores.
void AddToHistogram(const std::uint64_t* dist, std::size_t n, UlpStats& ulp) {
  std::uint32_t h[4][kUlpBins] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t x = dist[i];
    const int bin = x == kInfDistance ? kUlpInfBin : ulp_bin(x);
    ++h[i & 3][bin];
  }
  for (int b = 0; b < kUlpBins; ++b)
    ulp.hist[b] += std::uint64_t{h[0][b]} + h[1][b] + h[2][b] + h[3][b];
}

// A lane maximum with the index where it first occurred.
struct LaneMax {
  VD value;
  VU index;
  void update(DU du, VD v, VU idx) {
    const auto better = hn::Gt(v, value);  // strict: the earlier index stays on ties
    value = hn::IfThenElse(better, v, value);
    index = hn::IfThenElse(hn::RebindMask(du, better), idx, index);
  }
};

// Folds lane maxima into one (value, first index); lanes only ever hold values > `floor`
// or `floor` itself, like the scalar path's running maximum.
template <class T, class Index>
void ReduceMax(const T* values, const Index* indices, std::size_t lanes, T& value,
               std::uint64_t& index) {
  for (std::size_t j = 0; j < lanes; ++j) {
    if (values[j] > value || (values[j] == value && indices[j] < index)) {
      value = values[j];
      index = indices[j];
    }
  }
}

std::uint64_t SumLanes(DU du, VU v) { return hn::GetLane(hn::SumOfLanes(du, v)); }

// Subtracting an all-ones mask lane adds one to a counter lane.
template <class M>
VU CountIn(VU counter, M mask) {
  return hn::Sub(counter, hn::VecFromMask(DU(), hn::RebindMask(DU(), mask)));
}

Partial Accumulate(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                   std::uint64_t end) {
  const D d;
  const DU du;
  const std::size_t N = hn::Lanes(d);
  static_assert(kBlock % (HWY_MAX_BYTES / sizeof(double)) == 0, "blocks hold whole vectors");
  const std::uint64_t simd_end = begin + (end - begin) / N * N;

  Partial p;
  const DType dt = in.test->dtype;
  const bool floating = is_floating(dt);
  const std::size_t es = element_size(dt);
  const TensorView* truth = in.truth;
  HWY_ALIGN double tbuf[kBlock], rbuf[kBlock], ubuf[kBlock];
  HWY_ALIGN std::uint64_t dist[kBlock];

  const auto tol = hn::Set(d, opt.tol), half = hn::Set(d, 0.5), two = hn::Set(d, 2.0);
  const auto tiny = hn::Set(d, 1e-300);
  const auto no_lanes = hn::FirstN(d, 0);
  const auto lanes_step = hn::Set(du, N);
  LaneMax max_ref{hn::Set(d, -1.0), hn::Zero(du)}, max_truth{hn::Set(d, -1.0), hn::Zero(du)};
  VU max_ulp = hn::Zero(du), max_ulp_index = hn::Zero(du);
  VU far = hn::Zero(du), values_differ = hn::Zero(du), inf_distance = hn::Zero(du);
  VU t_differs = hn::Zero(du), t_over = hn::Zero(du), t_under = hn::Zero(du);
  VU r_differs = hn::Zero(du), r_over = hn::Zero(du), r_under = hn::Zero(du);
  std::uint64_t undecided_not_close = 0;

  for (std::uint64_t base = begin; base < simd_end; base += kBlock) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, simd_end - base));
    const std::byte* tp = in.test->data + base * es;
    const std::byte* rp = in.ref->data + base * es;
    const double* t = DecodeDoubles(dt, tp, n, tbuf);
    const double* r = DecodeDoubles(dt, rp, n, rbuf);
    p.bits_differ += CountBitsDiffer(es, tp, rp, n);
    if (floating) UlpDistances(dt, tp, rp, n, dist);

    // Test against ref: max |test - ref|, allclose(ref, test), ULP distances.
    VU nonfinite = hn::Zero(du);
    VU idx = hn::Iota(du, base);
    for (std::size_t i = 0; i < n; i += N, idx = hn::Add(idx, lanes_step)) {
      const VD vt = hn::LoadU(d, t + i), vr = hn::LoadU(d, r + i);
      const VD diff = hn::Abs(hn::Sub(vt, vr));
      max_ref.update(du, diff, idx);
      const auto nan_t = hn::IsNaN(vt), nan_r = hn::IsNaN(vr);
      const auto any_nan = hn::Or(nan_t, nan_r);
      const auto nan_equal = opt.equal_nan ? hn::And(nan_t, nan_r) : no_lanes;
      nonfinite = CountIn(nonfinite, hn::Not(hn::And(hn::IsFinite(vt), hn::IsFinite(vr))));
      // Decided here as torch_isclose decides far from the boundary; the rest goes to it.
      const VD allowed = hn::Add(tol, hn::Mul(tol, hn::Abs(vt)));
      const auto close = hn::Or(hn::Or(hn::Eq(vt, vr), nan_equal),
                                hn::And(hn::IsFinite(diff), hn::Le(diff, hn::Mul(half, allowed))));
      const auto not_close =
          hn::AndNot(close, hn::Or(any_nan, hn::Ge(diff, hn::Add(hn::Mul(two, allowed), tiny))));
      far = CountIn(far, not_close);
      const auto undecided = hn::Not(hn::Or(close, not_close));
      if (HWY_UNLIKELY(!hn::AllFalse(d, undecided))) {
        std::uint8_t lanes[(HWY_MAX_BYTES / sizeof(double) + 7) / 8];
        hn::StoreMaskBits(d, undecided, lanes);
        for (std::size_t j = 0; j < N; ++j) {
          if ((lanes[j / 8] >> (j % 8)) & 1) {
            undecided_not_close +=
                !torch_isclose(dt, r[i + j], t[i + j], opt.tol, opt.tol, opt.equal_nan);
          }
        }
      }
      if (!floating) {
        values_differ = CountIn(values_differ, hn::Ne(vt, vr));
        continue;
      }
      const auto inf_lane = hn::RebindMask(du, hn::AndNot(nan_equal, any_nan));
      const VU dv = hn::IfThenZeroElse(hn::RebindMask(du, any_nan), hn::Load(du, dist + i));
      values_differ = CountIn(values_differ, hn::Or(hn::Ne(dv, hn::Zero(du)), inf_lane));
      inf_distance = CountIn(inf_distance, inf_lane);
      const auto better = hn::Gt(dv, max_ulp);
      max_ulp = hn::IfThenElse(better, dv, max_ulp);
      max_ulp_index = hn::IfThenElse(better, idx, max_ulp_index);
      hn::Store(hn::IfThenElse(inf_lane, hn::Set(du, kInfDistance), dv), du, dist + i);
    }
    if (floating) AddToHistogram(dist, n, p.ulp);
    if (HWY_UNLIKELY(SumLanes(du, nonfinite) != 0)) {
      count_nonfinite(t, n, p.nf_test);
      count_nonfinite(r, n, p.nf_ref);
    }
    if (truth == nullptr) continue;

    // Test and ref against truth: the float64 sums, max |test - truth|, error balance.
    const double* u =
        DecodeDoubles(truth->dtype, truth->data + base * element_size(truth->dtype), n, ubuf);
    VD sq_err_test = hn::Zero(d), sq_err_ref = hn::Zero(d), sq_truth = hn::Zero(d);
    VD sq_test = hn::Zero(d), test_dot_truth = hn::Zero(d), err_sum = hn::Zero(d);
    VU truth_nonfinite = hn::Zero(du);
    idx = hn::Iota(du, base);
    for (std::size_t i = 0; i < n; i += N, idx = hn::Add(idx, lanes_step)) {
      const VD vt = hn::LoadU(d, t + i), vr = hn::LoadU(d, r + i), vu = hn::LoadU(d, u + i);
      const VD e = hn::Sub(vt, vu), er = hn::Sub(vr, vu);
      sq_err_test = hn::MulAdd(e, e, sq_err_test);
      sq_err_ref = hn::MulAdd(er, er, sq_err_ref);
      sq_truth = hn::MulAdd(vu, vu, sq_truth);
      sq_test = hn::MulAdd(vt, vt, sq_test);
      test_dot_truth = hn::MulAdd(vt, vu, test_dot_truth);
      err_sum = hn::Add(err_sum, e);
      max_truth.update(du, hn::Abs(e), idx);
      const auto nan_u = hn::IsNaN(vu);
      const VD au = hn::Abs(vu), at = hn::Abs(vt), ar = hn::Abs(vr);
      t_differs =
          CountIn(t_differs, hn::Not(hn::Or(hn::Eq(vt, vu), hn::And(hn::IsNaN(vt), nan_u))));
      r_differs =
          CountIn(r_differs, hn::Not(hn::Or(hn::Eq(vr, vu), hn::And(hn::IsNaN(vr), nan_u))));
      t_over = CountIn(t_over, hn::Gt(at, au));
      t_under = CountIn(t_under, hn::Lt(at, au));
      r_over = CountIn(r_over, hn::Gt(ar, au));
      r_under = CountIn(r_under, hn::Lt(ar, au));
      truth_nonfinite = CountIn(truth_nonfinite, hn::Not(hn::IsFinite(vu)));
    }
    p.sq_err_test.add(hn::GetLane(hn::SumOfLanes(d, sq_err_test)));
    p.sq_err_ref.add(hn::GetLane(hn::SumOfLanes(d, sq_err_ref)));
    p.sq_truth.add(hn::GetLane(hn::SumOfLanes(d, sq_truth)));
    p.sq_test.add(hn::GetLane(hn::SumOfLanes(d, sq_test)));
    p.test_dot_truth.add(hn::GetLane(hn::SumOfLanes(d, test_dot_truth)));
    p.err_sum.add(hn::GetLane(hn::SumOfLanes(d, err_sum)));
    if (HWY_UNLIKELY(SumLanes(du, truth_nonfinite) != 0)) count_nonfinite(u, n, p.nf_truth);
  }

  // Lane accumulators into the partial.
  HWY_ALIGN double values[HWY_MAX_BYTES / sizeof(double)];
  HWY_ALIGN std::uint64_t indices[HWY_MAX_BYTES / sizeof(double)];
  hn::Store(max_ref.value, d, values);
  hn::Store(max_ref.index, du, indices);
  ReduceMax(values, indices, N, p.max_abs_ref, p.max_abs_ref_index);
  hn::Store(max_truth.value, d, values);
  hn::Store(max_truth.index, du, indices);
  ReduceMax(values, indices, N, p.max_abs_truth, p.max_abs_truth_index);
  HWY_ALIGN std::uint64_t ulp_values[HWY_MAX_BYTES / sizeof(double)];
  hn::Store(max_ulp, du, ulp_values);
  hn::Store(max_ulp_index, du, indices);
  ReduceMax(ulp_values, indices, N, p.ulp.max, p.ulp.max_index);
  p.not_close = SumLanes(du, far) + undecided_not_close;
  p.values_differ = SumLanes(du, values_differ);
  p.ulp.any_inf = SumLanes(du, inf_distance) != 0;
  p.test_differs = SumLanes(du, t_differs);
  p.test_over = SumLanes(du, t_over);
  p.test_under = SumLanes(du, t_under);
  p.ref_differs = SumLanes(du, r_differs);
  p.ref_over = SumLanes(du, r_over);
  p.ref_under = SumLanes(du, r_under);
  p.n = simd_end - begin;
  // The last elements short of a whole vector: the scalar path.
  if (simd_end < end) p.merge(accumulate_scalar(in, opt, simd_end, end));
  return p;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace numalign::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace numalign {
namespace detail {

HWY_EXPORT(Accumulate);
HWY_EXPORT(TargetName);

Partial accumulate_simd(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                        std::uint64_t end) {
  return HWY_DYNAMIC_DISPATCH(Accumulate)(in, opt, begin, end);
}

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace detail

std::string simd_target() { return detail::simd_target_name(); }

}  // namespace numalign
#endif  // HWY_ONCE
