// metrics_simd.cpp: the fused pass on SIMD vectors of float64 lanes, compiled once per
// instruction set by Highway (foreach_target) and dispatched at run time to the best one
// this CPU supports. One loop per block of kBlock elements decodes test and ref in
// registers (a codec per dtype, chosen once per chunk), takes their ULP distance and folds
// every test-vs-ref and truth metric. The loop assumes finite inputs, so it needs no NaN
// or Inf handling: a block whose sums come out non-finite is redone by the scalar
// reference path, as are allclose verdicts too close to the boundary to decide here.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "metrics_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Include order matters: foreach_target re-includes this file once per target.
#include <hwy/highway.h>

#include <algorithm>
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

// One vector of test and ref: values as doubles, and their ULP distance (finite lanes).
struct Lanes {
  VD test, ref;
  VU distance;
};

// Sign-magnitude ordinals of 64-bit patterns and their distance, exact with wrap-around.
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

// bf16 and f16, their patterns sign-extended into 32-bit lanes.
template <DType kType>
class HalfCodec {
 public:
  static constexpr bool kFloating = true;
  explicit HalfCodec(DType) {}
  void Start(const std::byte* t, const std::byte* r, std::size_t) {
    t_ = reinterpret_cast<const std::int16_t*>(t);
    r_ = reinterpret_cast<const std::int16_t*>(r);
  }
  Lanes Load(std::size_t i) const {
    const auto a = hn::PromoteTo(d32_, hn::LoadU(d16_, t_ + i));
    const auto b = hn::PromoteTo(d32_, hn::LoadU(d16_, r_ + i));
    const auto distance = hn::Abs(hn::Sub(Ordinal(a), Ordinal(b)));  // < 2^16: no overflow
    return {Value(a, t_ + i), Value(b, r_ + i),
            hn::PromoteTo(DU(), hn::BitCast(hn::RebindToUnsigned<decltype(d32_)>(), distance))};
  }

 private:
  using D32 = hn::Rebind<std::int32_t, D>;
  // sign ? -magnitude : magnitude, with s = 0 or -1 from the sign-extended top bit.
  static hn::Vec<D32> Ordinal(hn::Vec<D32> bits) {
    const auto s = hn::ShiftRight<31>(bits);
    return hn::Sub(hn::Xor(hn::And(bits, hn::Set(D32(), 0x7FFF)), s), s);
  }
  static VD Value(hn::Vec<D32> bits, const std::int16_t* p) {
    const D d;
    const hn::Rebind<float, D> df;
    if constexpr (kType == DType::BF16) {  // bf16 is the top half of a float32
      (void)p;
      return hn::PromoteTo(d, hn::BitCast(df, hn::ShiftLeft<16>(bits)));
    } else {
      (void)bits;
      const hn::Rebind<hwy::float16_t, D> dh;
      return hn::PromoteTo(
          d, hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
    }
  }
  D32 d32_;
  hn::Rebind<std::int16_t, D> d16_;
  const std::int16_t* t_ = nullptr;
  const std::int16_t* r_ = nullptr;
};

class F32Codec {
 public:
  static constexpr bool kFloating = true;
  explicit F32Codec(DType) {}
  void Start(const std::byte* t, const std::byte* r, std::size_t) {
    t_ = reinterpret_cast<const std::uint32_t*>(t);
    r_ = reinterpret_cast<const std::uint32_t*>(r);
  }
  Lanes Load(std::size_t i) const {
    const D d;
    const DU du;
    const auto a = hn::LoadU(d32_, t_ + i), b = hn::LoadU(d32_, r_ + i);
    // Moved into the top half of 64-bit lanes, a float32's sign-magnitude order is a
    // float64's: the distance scales by 2^32 exactly.
    const VU wide_a = hn::ShiftLeft<32>(hn::PromoteTo(du, a));
    const VU wide_b = hn::ShiftLeft<32>(hn::PromoteTo(du, b));
    return {hn::PromoteTo(d, hn::BitCast(df_, a)), hn::PromoteTo(d, hn::BitCast(df_, b)),
            hn::ShiftRight<32>(Distance64(wide_a, wide_b))};
  }

 private:
  hn::Rebind<std::uint32_t, D> d32_;
  hn::Rebind<float, D> df_;
  const std::uint32_t* t_ = nullptr;
  const std::uint32_t* r_ = nullptr;
};

class F64Codec {
 public:
  static constexpr bool kFloating = true;
  explicit F64Codec(DType) {}
  void Start(const std::byte* t, const std::byte* r, std::size_t) {
    t_ = reinterpret_cast<const std::uint64_t*>(t);
    r_ = reinterpret_cast<const std::uint64_t*>(r);
  }
  Lanes Load(std::size_t i) const {
    const D d;
    const DU du;
    const VU a = hn::LoadU(du, t_ + i), b = hn::LoadU(du, r_ + i);
    return {hn::BitCast(d, a), hn::BitCast(d, b), Distance64(a, b)};
  }

 private:
  const std::uint64_t* t_ = nullptr;
  const std::uint64_t* r_ = nullptr;
};

// Every other dtype (fp8, integers, f16 without hardware conversion): the scalar block
// decoders fill buffers once per block, and the vectors are read from them.
template <bool kIsFloating>
class BufferedCodec {
 public:
  static constexpr bool kFloating = kIsFloating;
  explicit BufferedCodec(DType dtype) : dtype_(dtype) {}
  void Start(const std::byte* t, const std::byte* r, std::size_t n) {
    decode_block(dtype_, t, n, test_);
    decode_block(dtype_, r, n, ref_);
    if constexpr (kIsFloating) {
      std::int64_t ot[kBlock], orf[kBlock];
      bool nan_t[kBlock], nan_r[kBlock];  // NaN blocks are redone by the scalar path
      ordinal_block(dtype_, t, n, ot, nan_t);
      ordinal_block(dtype_, r, n, orf, nan_r);
      for (std::size_t i = 0; i < n; ++i) distance_[i] = ordinal_distance(ot[i], orf[i]);
    }
  }
  Lanes Load(std::size_t i) const {
    const D d;
    return {hn::Load(d, test_ + i), hn::Load(d, ref_ + i),
            kIsFloating ? hn::Load(DU(), distance_ + i) : hn::Zero(DU())};
  }

 private:
  DType dtype_;
  HWY_ALIGN double test_[kBlock];
  HWY_ALIGN double ref_[kBlock];
  HWY_ALIGN std::uint64_t distance_[kIsFloating ? kBlock : 1];
};

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

std::uint64_t SumLanes(VU v) { return hn::GetLane(hn::SumOfLanes(DU(), v)); }
double SumLanes(VD v) { return hn::GetLane(hn::SumOfLanes(D(), v)); }

// Adds one to the counter lanes where mask is set.
template <class M>
HWY_INLINE VU CountIn(VU counter, M mask) {
  const DU du;
#if HWY_TARGET <= HWY_AVX3
  // One masked add, where the portable form takes a mask-to-vector move and a subtract.
  return VU{_mm512_mask_sub_epi64(counter.raw, hn::RebindMask(du, mask).raw, counter.raw,
                                  hn::Set(du, ~std::uint64_t{0}).raw)};
#else
  return hn::Sub(counter, hn::VecFromMask(du, hn::RebindMask(du, mask)));
#endif
}

// Histogram of n ULP distances whose largest is `largest`. Bin k >= 1 holds (2^(k-2),
// 2^(k-1)]. A block's distances usually span a few bins:
// - up to kMostCompares bins: each bin below the top is a count of distances at or below
//   its upper end, one compare per vector and bin;
// - otherwise, below 2^52: each distance's bin from the exponent of (d - 1) as a double
//   (exact there), narrowed to bytes, then one byte compare per bin over whole vectors;
// - otherwise element by element.
void AddToHistogram(const std::uint64_t* dist, std::size_t n, std::uint64_t largest,
                    UlpStats& ulp) {
  constexpr int kMostCompares = 3;
  const D d;
  const DU du;
  const std::size_t N = hn::Lanes(du);
  const int top = ulp_bin(largest);
  if (top <= kMostCompares) {
    std::uint64_t below_previous = 0;
    for (int k = 0; k < top; ++k) {
      const auto limit = hn::Set(du, (k == 0 ? 0 : std::uint64_t{1} << (k - 1)) + 1);
      VU count = hn::Zero(du);
      for (std::size_t i = 0; i < n; i += N)
        count = CountIn(count, hn::Lt(hn::Load(du, dist + i), limit));
      const std::uint64_t below = SumLanes(count);
      ulp.hist[k] += below - below_previous;
      below_previous = below;
    }
    ulp.hist[top] += n - below_previous;
    return;
  }
  if (largest < (std::uint64_t{1} << 52)) {
    const DI di;
    const hn::Rebind<std::uint8_t, D> d8;
    const hn::ScalableTag<std::uint8_t> bytes;
    const std::size_t B = hn::Lanes(bytes);
    HWY_ALIGN std::uint8_t bins[kBlock];
    for (std::size_t i = 0; i < n; i += N) {
      const VU v = hn::Load(du, dist + i);
      // 1 + bit_width(d - 1) = biased exponent of (d - 1) - 1021 for d >= 2; 1 for d = 1.
      const VD x = hn::ConvertTo(d, hn::BitCast(di, hn::Sub(v, hn::Set(du, 1))));
      const auto exponent = hn::BitCast(di, hn::ShiftRight<52>(hn::BitCast(du, x)));
      const auto bin = hn::Max(hn::Sub(exponent, hn::Set(di, 1021)), hn::Set(di, 1));
      const VU b = hn::IfThenZeroElse(hn::Eq(v, hn::Zero(du)), hn::BitCast(du, bin));
      hn::StoreU(hn::TruncateTo(d8, b), d8, bins + i);
    }
    std::size_t whole = n / B * B;
    for (int k = 0; k <= top; ++k) {
      const auto want = hn::Set(bytes, static_cast<std::uint8_t>(k));
      std::uint64_t count = 0;
      for (std::size_t i = 0; i < whole; i += B)
        count += hn::CountTrue(bytes, hn::Eq(hn::Load(bytes, bins + i), want));
      ulp.hist[k] += count;
    }
    for (std::size_t i = whole; i < n; ++i) ++ulp.hist[bins[i]];
    return;
  }
  std::uint32_t h[4][kUlpBins] = {};
  for (std::size_t i = 0; i < n; ++i) ++h[i & 3][ulp_bin(dist[i])];
  for (int b = 0; b < kUlpBins; ++b)
    ulp.hist[b] += std::uint64_t{h[0][b]} + h[1][b] + h[2][b] + h[3][b];
}

// The first lane index in [0, n) where f(i) (a mask for the vector at i) holds; the
// maximum it looks for is known to be there.
template <class F>
std::uint64_t FirstLaneWhere(std::size_t n, F f) {
  const std::size_t N = hn::Lanes(D());
  for (std::size_t i = 0; i < n; i += N) {
    const auto m = f(i);
    if (!hn::AllFalse(D(), m)) return i + static_cast<std::uint64_t>(hn::FindFirstTrue(D(), m));
  }
  return 0;
}

// Lanes of one vector whose allclose verdict is too close to the boundary to decide
// here: the exact emulation counts those that are not close.
std::uint64_t NotCloseAmong(hn::Mask<D> lanes, VD test, VD ref, DType dt,
                            const MetricOptions& opt) {
  const D d;
  const std::size_t N = hn::Lanes(d);
  HWY_ALIGN double t[HWY_MAX_BYTES / sizeof(double)], r[HWY_MAX_BYTES / sizeof(double)];
  std::uint8_t bits[(HWY_MAX_BYTES / sizeof(double) + 7) / 8];
  hn::Store(test, d, t);
  hn::Store(ref, d, r);
  hn::StoreMaskBits(d, lanes, bits);
  std::uint64_t not_close = 0;
  for (std::size_t j = 0; j < N; ++j) {
    if ((bits[j / 8] >> (j % 8)) & 1)
      not_close += !torch_isclose(dt, r[j], t[j], opt.tol, opt.tol, opt.equal_nan);
  }
  return not_close;
}

// The fused pass over [begin, end) (a whole number of vectors) with one codec.
template <class Codec, bool kTruth>
Partial AccumulateWith(const MetricsInput& in, const MetricOptions& opt, const CloseBand& band,
                       std::uint64_t begin, std::uint64_t end) {
  const D d;
  const DU du;
  const std::size_t N = hn::Lanes(d);
  static_assert(kBlock % (HWY_MAX_BYTES / sizeof(double)) == 0, "blocks hold whole vectors");
  const DType dt = in.test->dtype;
  const std::size_t es = element_size(dt);
  const TensorView* truth = in.truth;
  Codec codec(dt);
  HWY_ALIGN double truth_buffer[kBlock];
  HWY_ALIGN std::uint64_t dist[kBlock];

  const VD tol = hn::Set(d, opt.tol);
  const VD lo_k = hn::Set(d, band.lo_scale), lo_c = hn::Set(d, band.lo_offset);
  const VD hi_k = hn::Set(d, band.hi_scale), hi_c = hn::Set(d, band.hi_offset);
  const VU zero = hn::Zero(du);

  Partial p, redone;  // redone: the blocks the scalar path took over, merged in order
  std::uint64_t fast_n = 0, undecided_not_close = 0;
  VU far = zero, values_differ = zero, t_equal = zero, r_equal = zero;
  VU t_over = zero, t_under = zero, r_over = zero, r_under = zero;

  for (std::uint64_t base = begin; base < end; base += kBlock) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, end - base));
    const std::byte* tp = in.test->data + base * es;
    const std::byte* rp = in.ref->data + base * es;
    codec.Start(tp, rp, n);
    const double* u = nullptr;
    if constexpr (kTruth) {
      const std::byte* up = truth->data + base * element_size(truth->dtype);
      if (truth->dtype == DType::F64) {
        u = reinterpret_cast<const double*>(up);
      } else {
        decode_block(truth->dtype, up, n, truth_buffer);
        u = truth_buffer;
      }
    }
    VU b_far = zero, b_values_differ = zero, b_t_equal = zero, b_r_equal = zero;
    VU b_t_over = zero, b_t_under = zero, b_r_over = zero, b_r_under = zero, b_largest = zero;
    VD max_ref = hn::Zero(d), max_truth = hn::Zero(d);
    VD sq_err_test = hn::Zero(d), sq_err_ref = hn::Zero(d), sq_truth = hn::Zero(d);
    VD sq_test = hn::Zero(d), test_dot_truth = hn::Zero(d), err_sum = hn::Zero(d);
    VD probe = hn::Zero(d);  // sum of |t - r|: non-finite iff some input lane is (or huge)
    std::uint64_t b_undecided_not_close = 0;
    for (std::size_t i = 0; i < n; i += N) {
      const Lanes v = codec.Load(i);
      const VD diff = hn::Abs(hn::Sub(v.test, v.ref));
      max_ref = hn::Max(max_ref, diff);
      const VD at = hn::Abs(v.test);
      const VD allowed = hn::Add(tol, hn::Mul(tol, at));  // as the emulation rounds it
      const VD hi = hn::MulAdd(allowed, hi_k, hi_c);
      b_far = CountIn(b_far, hn::Ge(diff, hi));
      const auto undecided =
          hn::And(hn::Gt(diff, hn::MulAdd(allowed, lo_k, lo_c)), hn::Lt(diff, hi));
      if (HWY_UNLIKELY(!hn::AllFalse(d, undecided)))
        b_undecided_not_close += NotCloseAmong(undecided, v.test, v.ref, dt, opt);
      if constexpr (Codec::kFloating) {
        b_values_differ = CountIn(b_values_differ, hn::Ne(v.distance, zero));
        b_largest = hn::Max(b_largest, v.distance);
        hn::Store(v.distance, du, dist + i);
      } else {
        b_values_differ = CountIn(b_values_differ, hn::Ne(v.test, v.ref));
      }
      if constexpr (kTruth) {
        const VD vu = hn::LoadU(d, u + i);
        const VD e = hn::Sub(v.test, vu), er = hn::Sub(v.ref, vu);
        sq_err_test = hn::MulAdd(e, e, sq_err_test);
        sq_err_ref = hn::MulAdd(er, er, sq_err_ref);
        sq_truth = hn::MulAdd(vu, vu, sq_truth);
        sq_test = hn::MulAdd(v.test, v.test, sq_test);
        test_dot_truth = hn::MulAdd(v.test, vu, test_dot_truth);
        err_sum = hn::Add(err_sum, e);
        max_truth = hn::Max(max_truth, hn::Abs(e));
        const VD au = hn::Abs(vu), ar = hn::Abs(v.ref);
        b_t_equal = CountIn(b_t_equal, hn::Eq(v.test, vu));
        b_r_equal = CountIn(b_r_equal, hn::Eq(v.ref, vu));
        b_t_over = CountIn(b_t_over, hn::Gt(at, au));
        b_t_under = CountIn(b_t_under, hn::Lt(at, au));
        b_r_over = CountIn(b_r_over, hn::Gt(ar, au));
        b_r_under = CountIn(b_r_under, hn::Lt(ar, au));
      } else {
        probe = hn::Add(probe, diff);
      }
    }
    // Every input lane finite? A NaN or Inf in test or ref reaches e or er (or |t - r|),
    // one in truth reaches both. Otherwise the scalar path redoes the block.
    const double s_err_test = SumLanes(sq_err_test), s_err_ref = SumLanes(sq_err_ref);
    const bool finite = kTruth ? std::isfinite(s_err_test) && std::isfinite(s_err_ref)
                               : std::isfinite(SumLanes(probe));
    if (HWY_UNLIKELY(!finite)) {
      redone.merge(accumulate_scalar(in, opt, base, base + n));
      continue;
    }
    fast_n += n;
    undecided_not_close += b_undecided_not_close;
    far = hn::Add(far, b_far);
    values_differ = hn::Add(values_differ, b_values_differ);
    p.bits_differ += CountBitsDiffer(es, tp, rp, n);
    // A larger maximum than all before: find where it first occurs in this block.
    const double block_max_ref = hn::GetLane(hn::MaxOfLanes(d, max_ref));
    if (block_max_ref > p.max_abs_ref) {
      const VD m = hn::Set(d, block_max_ref);
      p.max_abs_ref = block_max_ref;
      p.max_abs_ref_index = base + FirstLaneWhere(n, [&](std::size_t i) {
                              const Lanes v = codec.Load(i);
                              return hn::Eq(hn::Abs(hn::Sub(v.test, v.ref)), m);
                            });
    }
    if constexpr (Codec::kFloating) {
      const std::uint64_t largest = hn::GetLane(hn::MaxOfLanes(du, b_largest));
      AddToHistogram(dist, n, largest, p.ulp);
      if (largest > p.ulp.max) {
        const VU m = hn::Set(du, largest);
        p.ulp.max = largest;
        p.ulp.max_index = base + FirstLaneWhere(n, [&](std::size_t i) {
                            return hn::RebindMask(d, hn::Eq(hn::Load(du, dist + i), m));
                          });
      }
    }
    if constexpr (kTruth) {
      p.sq_err_test.add(s_err_test);
      p.sq_err_ref.add(s_err_ref);
      p.sq_truth.add(SumLanes(sq_truth));
      p.sq_test.add(SumLanes(sq_test));
      p.test_dot_truth.add(SumLanes(test_dot_truth));
      p.err_sum.add(SumLanes(err_sum));
      t_equal = hn::Add(t_equal, b_t_equal);
      r_equal = hn::Add(r_equal, b_r_equal);
      t_over = hn::Add(t_over, b_t_over);
      t_under = hn::Add(t_under, b_t_under);
      r_over = hn::Add(r_over, b_r_over);
      r_under = hn::Add(r_under, b_r_under);
      const double block_max_truth = hn::GetLane(hn::MaxOfLanes(d, max_truth));
      if (block_max_truth > p.max_abs_truth) {
        const VD m = hn::Set(d, block_max_truth);
        p.max_abs_truth = block_max_truth;
        p.max_abs_truth_index =
            base + FirstLaneWhere(n, [&](std::size_t i) {
              return hn::Eq(hn::Abs(hn::Sub(codec.Load(i).test, hn::LoadU(d, u + i))), m);
            });
      }
    }
  }

  p.n = fast_n;
  p.not_close = SumLanes(far) + undecided_not_close;
  p.values_differ = SumLanes(values_differ);
  if constexpr (kTruth) {
    // Finite lanes: a value differs from the truth exactly when it is not equal to it.
    p.test_differs = fast_n - SumLanes(t_equal);
    p.ref_differs = fast_n - SumLanes(r_equal);
    p.test_over = SumLanes(t_over);
    p.test_under = SumLanes(t_under);
    p.ref_over = SumLanes(r_over);
    p.ref_under = SumLanes(r_under);
  }
  p.merge(redone);  // maxima on ties keep the smaller index, whatever the merge order
  return p;
}

template <bool kTruth>
Partial AccumulateDispatch(const MetricsInput& in, const MetricOptions& opt, const CloseBand& band,
                           std::uint64_t begin, std::uint64_t end) {
  switch (in.test->dtype) {
    case DType::BF16:
      return AccumulateWith<HalfCodec<DType::BF16>, kTruth>(in, opt, band, begin, end);
    case DType::F16:
      // Below AVX2 Highway emulates the conversion and maps Inf/NaN to finite values (the
      // every-pattern test caught it): there, and off x86, the exact table decode is used.
#if HWY_ARCH_X86 && HWY_TARGET < HWY_SSE4 && !defined(HWY_DISABLE_F16C)
      return AccumulateWith<HalfCodec<DType::F16>, kTruth>(in, opt, band, begin, end);
#else
      return AccumulateWith<BufferedCodec<true>, kTruth>(in, opt, band, begin, end);
#endif
    case DType::F32:
      return AccumulateWith<F32Codec, kTruth>(in, opt, band, begin, end);
    case DType::F64:
      return AccumulateWith<F64Codec, kTruth>(in, opt, band, begin, end);
    default:
      return is_floating(in.test->dtype)
                 ? AccumulateWith<BufferedCodec<true>, kTruth>(in, opt, band, begin, end)
                 : AccumulateWith<BufferedCodec<false>, kTruth>(in, opt, band, begin, end);
  }
}

Partial Accumulate(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                   std::uint64_t end) {
  // The allclose bands above assume a non-negative tolerance; anything else is exotic.
  if (!(opt.tol >= 0)) return accumulate_scalar(in, opt, begin, end);
  const std::uint64_t simd_end = begin + (end - begin) / hn::Lanes(D()) * hn::Lanes(D());
  const CloseBand band = close_band(in.test->dtype, opt.tol);
  Partial p = in.truth ? AccumulateDispatch<true>(in, opt, band, begin, simd_end)
                       : AccumulateDispatch<false>(in, opt, band, begin, simd_end);
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
