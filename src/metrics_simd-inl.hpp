// metrics_simd-inl.hpp: the fused pass's per-target code, on SIMD vectors of float64 lanes:
// the codecs that decode test and ref in registers, and the block loop that folds every
// test-vs-ref and truth metric. metrics_simd.cpp includes it once per instruction set
// (foreach_target), so it has no #pragma once: its guard toggles with HWY_TARGET_TOGGLE, as
// Highway's -inl.h convention asks. The loop assumes finite inputs, so it needs no NaN or
// Inf handling: a block whose sums come out non-finite is redone by the scalar reference
// path, and allclose verdicts too close to the boundary to decide here go to its exact
// emulation of torch.isclose.
#if defined(NUMALIGN_METRICS_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NUMALIGN_METRICS_SIMD_INL_H_
#undef NUMALIGN_METRICS_SIMD_INL_H_
#else
#define NUMALIGN_METRICS_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "isclose.hpp"
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
HWY_INLINE VU Distance64(VU a, VU b) {
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

// A floating codec that reads the block's test and ref elements in place, as T, and by
// default gives each vector's ULP distances with its values (HalfCodec overrides that).
template <class T>
class InPlace {
 public:
  static constexpr bool kBlockDistances = false;
  explicit InPlace(DType) {}
  void Start(const std::byte* t, const std::byte* r, std::size_t) {
    t_ = reinterpret_cast<const T*>(t);
    r_ = reinterpret_cast<const T*>(r);
  }
  // Whether the block holds a pattern the codec decodes to a finite stand-in (a NaN or
  // Inf the loop's finite check would not see), so that the scalar path must redo it.
  bool special() const { return false; }

 protected:
  const T* t_ = nullptr;
  const T* r_ = nullptr;
};

// The ULP distances of a block of n elements whose ordinals fit 16-bit lanes, into dist;
// returns the largest. ordinals(i) gives both inputs' ordinals at i as vectors of
// `Tag`'s 16-bit lanes, scalar(i) as ints for the elements after the last whole vector.
template <class Tag, class VectorOrdinals, class ScalarOrdinals>
std::uint64_t Distances16(std::size_t n, VectorOrdinals ordinals, ScalarOrdinals scalar,
                          std::uint16_t* dist) {
  const Tag d16;
  const hn::RebindToUnsigned<Tag> du16;
  const std::size_t L = hn::Lanes(d16);
  auto largest = hn::Zero(du16);
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto [oa, ob] = ordinals(i);
    // The difference of two ordinals fits 16 unsigned bits (at most 2 * 0x7FFF).
    const auto d = hn::Sub(hn::BitCast(du16, hn::Max(oa, ob)), hn::BitCast(du16, hn::Min(oa, ob)));
    largest = hn::Max(largest, d);
    hn::Store(d, du16, dist + i);
  }
  std::uint64_t most = hn::GetLane(hn::MaxOfLanes(du16, largest));
  for (; i < n; ++i) {
    const auto [a, b] = scalar(i);
    dist[i] = static_cast<std::uint16_t>(a > b ? a - b : b - a);
    most = std::max<std::uint64_t>(most, dist[i]);
  }
  return most;
}

// bf16 and f16. Start takes the block's ULP distances on full vectors of 16-bit lanes
// (four times the lanes of the float64 loop), so the loop only decodes values.
template <DType kType>
class HalfCodec : public InPlace<std::int16_t> {
 public:
  static constexpr bool kBlockDistances = true;
  using InPlace::InPlace;
  void Start(const std::byte* t, const std::byte* r, std::size_t n) {
    InPlace::Start(t, r, n);
    using Tag = hn::ScalableTag<std::int16_t>;
    largest_ = Distances16<Tag>(
        n,
        [&](std::size_t i) {
          const Tag d16;
          return std::pair{Ordinal(hn::LoadU(d16, t_ + i)), Ordinal(hn::LoadU(d16, r_ + i))};
        },
        [&](std::size_t i) {
          // Element by element through memcpy: a tensor's data need not be aligned (a
          // header of odd length puts every tensor of the file at an odd address).
          std::uint16_t ta, rb;
          std::memcpy(&ta, t_ + i, sizeof ta);
          std::memcpy(&rb, r_ + i, sizeof rb);
          return std::pair{ulp_ordinal(kType, ta), ulp_ordinal(kType, rb)};
        },
        distances_);
  }
  Lanes Load(std::size_t i) const {
    const D d;
    const hn::Rebind<float, D> df;
    if constexpr (kType == DType::BF16) {  // bf16 is the top half of a float32
      const hn::Rebind<std::uint16_t, D> d16;
      const hn::Rebind<std::uint32_t, D> d32;
      auto value = [&](const std::int16_t* p) {
        const auto bits =
            hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p)));
        return hn::PromoteTo(d, hn::BitCast(df, hn::ShiftLeft<16>(bits)));
      };
      return {value(t_ + i), value(r_ + i), hn::Zero(DU())};
    } else {
      const hn::Rebind<hwy::float16_t, D> dh;
      auto value = [&](const std::int16_t* p) {
        return hn::PromoteTo(
            d, hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
      };
      return {value(t_ + i), value(r_ + i), hn::Zero(DU())};
    }
  }
  const std::uint16_t* distances() const { return distances_; }
  std::uint64_t largest() const { return largest_; }

 private:
  // sign ? -magnitude : magnitude, with s = 0 or -1 from the sign bit.
  template <class V>
  static V Ordinal(V bits) {
    const auto s = hn::ShiftRight<15>(bits);
    return hn::Sub(hn::Xor(hn::And(bits, hn::Set(hn::DFromV<V>(), 0x7FFF)), s), s);
  }
  std::uint64_t largest_ = 0;
  HWY_ALIGN std::uint16_t distances_[kBlock];
};

class F32Codec : public InPlace<std::uint32_t> {
 public:
  using InPlace::InPlace;
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
};

class F64Codec : public InPlace<std::uint64_t> {
 public:
  using InPlace::InPlace;
  Lanes Load(std::size_t i) const {
    const D d;
    const DU du;
    const VU a = hn::LoadU(du, t_ + i), b = hn::LoadU(du, r_ + i);
    return {hn::BitCast(d, a), hn::BitCast(d, b), Distance64(a, b)};
  }
};

// The 8-bit floats, decoded with integer operations (gathers from 256-entry tables were a
// third as fast). A pattern's magnitude bits, shifted into a float64's exponent and
// mantissa fields and rebiased, are its value when its exponent is not 0; when it is 0
// (zeros and subnormals), that reads as 2^-bias (1 + f) and the value is 2^(1-bias) f, so
// 2 w - 2^(1-bias), exact in one FMA or in a multiply by 2 and a subtraction. E8M0 has no
// sign and no mantissa: its byte is the exponent. NaN and Inf patterns would decode to
// finite numbers: Start flags a block that holds one, for the scalar path. ULP distances
// on 16-bit lanes in Start, as HalfCodec takes them.
//
// kViaHalf (the formats with a sign and a mantissa, where the CPU converts float16): Start
// also rewrites the block's patterns as float16 patterns, 16-bit lanes at a time: the
// magnitude bits shifted up to meet float16's mantissa field, the sign moved to bit 15.
// Read as a float16, that is the value times 2^(float16's bias - the format's bias), for
// subnormals too (both formats' subnormals have exponent field 0), so the loop converts it
// in hardware and multiplies by a power of 2, exactly: fewer operations than the integer
// decode.
template <bool kViaHalf>
class Fp8Codec : public InPlace<std::uint8_t> {
 public:
  static constexpr bool kBlockDistances = true;
  explicit Fp8Codec(DType dtype) : InPlace(dtype), dtype_(dtype) {
    // A pattern b is NaN or Inf when (b & special_mask_) >= special_from_ or b == nan_byte_
    // (which repeats a pattern the first test covers where the format has no lone NaN).
    int mantissa_bits = 3, bias = 7;
    switch (dtype) {
      case DType::F8_E5M2:  // IEEE: exponent 31 is Inf and NaN
        mantissa_bits = 2;
        bias = 15;
        special_from_ = nan_byte_ = 0x7C;
        break;
      case DType::F8_E4M3:  // FN: S.1111.111 is NaN, no Inf
        special_from_ = nan_byte_ = 0x7F;
        break;
      case DType::F8_E4M3FNUZ:  // FNUZ: the negative zero pattern is the one NaN
      case DType::F8_E5M2FNUZ:
        mantissa_bits = dtype == DType::F8_E4M3FNUZ ? 3 : 2;
        bias = dtype == DType::F8_E4M3FNUZ ? 8 : 16;
        special_mask_ = 0;
        nan_byte_ = 0x80;
        break;
      default:  // F8_E8M0: the byte is a biased exponent (no sign, no zero); 0xFF is NaN
        mantissa_bits = 0;
        bias = 127;
        magnitude_mask_ = special_mask_ = special_from_ = nan_byte_ = 0xFF;
        sign_mask_ = 0;
        break;
    }
    shift_ = 52 - mantissa_bits;
    half_shift_ = 10 - mantissa_bits;
    half_scale_ = std::ldexp(1.0, 15 - bias);
    rebias_ = static_cast<std::uint64_t>(1023 - bias) << 52;
    exponent_zero_below_ = mantissa_bits > 0 ? 1 << mantissa_bits : 0;  // E8M0's 0 is 2^-127
    subnormal_offset_ = std::ldexp(1.0, 1 - bias);
  }
  void Start(const std::byte* t, const std::byte* r, std::size_t n) {
    InPlace::Start(t, r, n);
    using Tag = hn::ScalableTag<std::int16_t>;
    const Tag d16;
    const hn::Rebind<std::uint8_t, Tag> d8;
    auto ordinals = [&](auto bits) {  // sign ? -magnitude : magnitude
      const auto s = hn::Neg(hn::ShiftRight<7>(hn::And(bits, hn::Set(d16, sign_mask_))));
      return hn::Sub(hn::Xor(hn::And(bits, hn::Set(d16, magnitude_mask_)), s), s);
    };
    auto widen = [&](const std::uint8_t* p) {
      return hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<Tag>(), hn::LoadU(d8, p)));
    };
    largest_ = Distances16<Tag>(
        n,
        [&](std::size_t i) {
          return std::pair{ordinals(widen(t_ + i)), ordinals(widen(r_ + i))};
        },
        [&](std::size_t i) {
          return std::pair{ulp_ordinal(dtype_, t_[i]), ulp_ordinal(dtype_, r_[i])};
        },
        distances_);
    special_ = HasSpecial(t_, n) || HasSpecial(r_, n);
    if constexpr (kViaHalf) {
      HalfPatterns(t_, n, halves_t_);
      HalfPatterns(r_, n, halves_r_);
    }
  }
  Lanes Load(std::size_t i) const {
    if constexpr (kViaHalf) {
      return {ValueOfHalf(halves_t_ + i), ValueOfHalf(halves_r_ + i), hn::Zero(DU())};
    } else {
      return {Value(t_ + i), Value(r_ + i), hn::Zero(DU())};
    }
  }
  const std::uint16_t* distances() const { return distances_; }
  std::uint64_t largest() const { return largest_; }
  bool special() const { return special_; }

 private:
  // The float16 pattern of each of n bytes (see the class comment).
  void HalfPatterns(const std::uint8_t* p, std::size_t n, std::uint16_t* out) const {
    const hn::ScalableTag<std::uint16_t> d16;
    const hn::Rebind<std::uint8_t, decltype(d16)> d8;
    const std::size_t L = hn::Lanes(d16);
    const auto magnitude = hn::Set(d16, magnitude_mask_), sign = hn::Set(d16, sign_mask_);
    std::size_t i = 0;
    for (; i + L <= n; i += L) {
      const auto b = hn::PromoteTo(d16, hn::LoadU(d8, p + i));
      hn::Store(hn::Or(hn::ShiftLeftSame(hn::And(b, magnitude), half_shift_),
                       hn::ShiftLeft<8>(hn::And(b, sign))),
                d16, out + i);
    }
    for (; i < n; ++i) {
      out[i] = static_cast<std::uint16_t>(((p[i] & magnitude_mask_) << half_shift_) |
                                          ((p[i] & sign_mask_) << 8));
    }
  }
  VD ValueOfHalf(const std::uint16_t* h) const {
    const D d;
    const hn::Rebind<float, D> df;
    const hn::Rebind<hwy::float16_t, D> dh;
    const VD v = hn::PromoteTo(
        d, hn::PromoteTo(df, hn::Load(dh, reinterpret_cast<const hwy::float16_t*>(h))));
    return hn::Mul(v, hn::Set(d, half_scale_));
  }
  VD Value(const std::uint8_t* p) const {
    const D d;
    const DU du;
    const DI di;
    const VU bits = hn::PromoteTo(du, hn::PromoteTo(hn::Rebind<std::uint32_t, D>(),
                                                    hn::LoadU(hn::Rebind<std::uint8_t, D>(), p)));
    const VU magnitude = hn::And(bits, hn::Set(du, magnitude_mask_));
    const VD w =
        hn::BitCast(d, hn::Add(hn::ShiftLeftSame(magnitude, shift_), hn::Set(du, rebias_)));
    const auto exponent_zero =
        hn::RebindMask(d, hn::Lt(hn::BitCast(di, magnitude), hn::Set(di, exponent_zero_below_)));
    const VD v = hn::IfThenElse(exponent_zero,
                                hn::MulSub(w, hn::Set(d, 2.0), hn::Set(d, subnormal_offset_)), w);
    const VU sign = hn::And(hn::ShiftLeft<56>(bits), hn::Set(du, std::uint64_t{sign_mask_} << 56));
    return hn::BitCast(d, hn::Or(hn::BitCast(du, v), sign));
  }
  bool HasSpecial(const std::uint8_t* p, std::size_t n) const {
    const hn::ScalableTag<std::uint8_t> d8;
    const std::size_t L = hn::Lanes(d8);
    const auto mask = hn::Set(d8, special_mask_), from = hn::Set(d8, special_from_);
    const auto nan = hn::Set(d8, nan_byte_);
    std::size_t i = 0;
    for (; i + L <= n; i += L) {
      const auto b = hn::LoadU(d8, p + i);
      // (b & mask) >= from, as max(b & mask, from) == b & mask
      const auto masked = hn::And(b, mask);
      if (!hn::AllFalse(d8, hn::Or(hn::Eq(hn::Max(masked, from), masked), hn::Eq(b, nan))))
        return true;
    }
    for (; i < n; ++i) {
      if ((p[i] & special_mask_) >= special_from_ || p[i] == nan_byte_) return true;
    }
    return false;
  }
  DType dtype_;
  std::uint8_t magnitude_mask_ = 0x7F, sign_mask_ = 0x80;
  std::uint8_t special_mask_ = 0x7F, special_from_ = 0x7F, nan_byte_ = 0x7F;
  int shift_ = 0;
  int half_shift_ = 0;
  double half_scale_ = 1;
  std::uint64_t rebias_ = 0;
  std::int64_t exponent_zero_below_ = 0;
  double subnormal_offset_ = 0;
  bool special_ = false;
  std::uint64_t largest_ = 0;
  HWY_ALIGN std::uint16_t distances_[kBlock];
  // float16 patterns of test and ref (kViaHalf only; a byte each otherwise).
  HWY_ALIGN std::uint16_t halves_t_[kViaHalf ? kBlock : 1];
  HWY_ALIGN std::uint16_t halves_r_[kViaHalf ? kBlock : 1];
};

// Every other floating dtype (f16 without hardware conversion): the scalar block decoders
// fill buffers once per block, and the vectors are read from them. (Integers take the scalar
// path: their distances are exact 64-bit integers, which vectors of doubles are not.)
class BufferedCodec {
 public:
  static constexpr bool kBlockDistances = false;
  explicit BufferedCodec(DType dtype) : dtype_(dtype) {}
  bool special() const { return false; }  // NaN and Inf decode as such: the sums see them
  void Start(const std::byte* t, const std::byte* r, std::size_t n) {
    decode_block(dtype_, t, n, test_);
    decode_block(dtype_, r, n, ref_);
    std::int64_t ot[kBlock], orf[kBlock];
    bool nan_t[kBlock], nan_r[kBlock];  // NaN blocks are redone by the scalar path
    ordinal_block(dtype_, t, n, ot, nan_t);
    ordinal_block(dtype_, r, n, orf, nan_r);
    for (std::size_t i = 0; i < n; ++i) distance_[i] = ordinal_distance(ot[i], orf[i]);
  }
  Lanes Load(std::size_t i) const {
    const D d;
    return {hn::Load(d, test_ + i), hn::Load(d, ref_ + i), hn::Load(DU(), distance_ + i)};
  }

 private:
  DType dtype_;
  HWY_ALIGN double test_[kBlock];
  HWY_ALIGN double ref_[kBlock];
  HWY_ALIGN std::uint64_t distance_[kBlock];
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

HWY_INLINE double SumLanes(VD v) { return hn::GetLane(hn::SumOfLanes(D(), v)); }

// Adds the bins 0..top of n distances whose largest is in bin `top`: bin k >= 1 holds
// (2^(k-2), 2^(k-1)], so each bin below the top is the count of distances at or below its
// upper end less the bins before. One compare per vector and bin: cheap for the few
// bins a block usually spans.
template <class T>
void AddCumulativeBins(const T* dist, std::size_t n, int top, UlpAccumulator& ulp) {
  const hn::ScalableTag<T> dt;
  const std::size_t L = hn::Lanes(dt);
  const std::size_t whole = n / L * L;
  std::uint64_t below_previous = 0;
  for (int k = 0; k < top; ++k) {
    const std::uint64_t upper = k == 0 ? 0 : std::uint64_t{1} << (k - 1);
    const auto limit = hn::Set(dt, static_cast<T>(upper + 1));  // top <= 8 for 16 bits
    std::uint64_t below = 0;
    for (std::size_t i = 0; i < whole; i += L)
      below += hn::CountTrue(dt, hn::Lt(hn::Load(dt, dist + i), limit));
    for (std::size_t i = whole; i < n; ++i) below += dist[i] <= upper;
    ulp.hist[k] += below - below_previous;
    below_previous = below;
  }
  ulp.hist[top] += n - below_previous;
}

// Histogram of n ULP distances whose largest is `largest`:
// - a few bins: AddCumulativeBins;
// - otherwise, below 2^52: each distance's bin from the exponent of (d - 1) as a double
//   (exact there), narrowed to bytes, then one byte compare per bin over whole vectors;
// - otherwise element by element.
void AddToHistogram(const std::uint64_t* dist, std::size_t n, std::uint64_t largest,
                    UlpAccumulator& ulp) {
  const D d;
  const DU du;
  const std::size_t N = hn::Lanes(du);
  const int top = ulp_bin(largest);
  if (top <= 3) return AddCumulativeBins(dist, n, top, ulp);
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

// The same for the 16-bit distances of bf16 and f16: compares on 16-bit lanes up to 8
// bins, the float64 lanes' methods beyond.
void AddToHistogram(const std::uint16_t* dist, std::size_t n, std::uint64_t largest,
                    UlpAccumulator& ulp) {
  const int top = ulp_bin(largest);
  if (top <= 8) return AddCumulativeBins(dist, n, top, ulp);
  HWY_ALIGN std::uint64_t wide[kBlock];
  for (std::size_t i = 0; i < n; ++i) wide[i] = dist[i];
  AddToHistogram(wide, n, largest, ulp);
}

// The first lane index in [0, n) where f(i) (a mask for the vector at i) holds; the
// maximum it looks for is known to be there.
template <class F>
HWY_INLINE std::uint64_t FirstLaneWhere(std::size_t n, F f) {
  const std::size_t N = hn::Lanes(D());
  for (std::size_t i = 0; i < n; i += N) {
    const auto m = f(i);
    if (!hn::AllFalse(D(), m)) return i + static_cast<std::uint64_t>(hn::FindFirstTrue(D(), m));
  }
  return 0;
}

// Lanes of the vector at i whose allclose verdict is too close to the boundary to decide
// here: the exact emulation counts those that are not close. (Reloaded here, so that the
// hot loop keeps no copy of its lanes for this rare call.)
template <class Codec>
HWY_NOINLINE std::uint64_t NotCloseAmong(hn::Mask<D> lanes, const Codec& codec, std::size_t i,
                                         DType dt, const MetricOptions& opt) {
  const D d;
  const std::size_t N = hn::Lanes(d);
  HWY_ALIGN double t[HWY_MAX_BYTES / sizeof(double)], r[HWY_MAX_BYTES / sizeof(double)];
  std::uint8_t bits[(HWY_MAX_BYTES / sizeof(double) + 7) / 8];
  const Lanes v = codec.Load(i);
  hn::Store(v.test, d, t);
  hn::Store(v.ref, d, r);
  hn::StoreMaskBits(d, lanes, bits);
  std::uint64_t not_close = 0;
  for (std::size_t j = 0; j < N; ++j) {
    if ((bits[j / 8] >> (j % 8)) & 1)
      not_close += !torch_isclose(dt, r[j], t[j], opt.tol, opt.tol, opt.equal_nan);
  }
  return not_close;
}

// A finite block's ULP distances into the partial: histogram, values that differ (those
// not in bin 0), and the first index of a new largest distance.
template <class T>
void AddUlp(const T* dist, std::size_t n, std::uint64_t largest, std::uint64_t base, Partial& p) {
  const std::uint64_t zero_before = p.ulp.hist[0];
  AddToHistogram(dist, n, largest, p.ulp);
  p.values_differ += n - (p.ulp.hist[0] - zero_before);
  if (largest > p.ulp.max) {
    p.ulp.max = largest;
    p.ulp.max_index = base + static_cast<std::uint64_t>(std::find(dist, dist + n, largest) - dist);
  }
}

HWY_INLINE void PrefetchRange(const std::byte* p, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, 0, 3);
}

// The allclose band's two lines in |t|, as vectors: lo = lo_slope |t| + lo_intercept, hi
// likewise. A lane at or above hi is not close; one between lo and hi is undecided.
struct BandLines {
  BandLines(const CloseBand& band, double tol)
      : lo_slope(hn::Set(D(), tol * band.lo_scale)),
        lo_intercept(hn::Set(D(), tol * band.lo_scale + band.lo_offset)),
        hi_slope(hn::Set(D(), tol * band.hi_scale)),
        hi_intercept(hn::Set(D(), tol * band.hi_scale + band.hi_offset)) {}
  HWY_INLINE hn::Mask<D> Far(VD diff, VD at) const {
    return hn::Ge(diff, hn::MulAdd(at, hi_slope, hi_intercept));
  }
  HWY_INLINE hn::Mask<D> Undecided(VD diff, VD at, hn::Mask<D> far) const {
    return hn::AndNot(far, hn::Gt(diff, hn::MulAdd(at, lo_slope, lo_intercept)));
  }
  VD lo_slope, lo_intercept, hi_slope, hi_intercept;
};

// Asks for the block after the one at `base` while this one is computed: the hardware
// prefetcher stops at each 4 KiB page, and the truth streams a page every two blocks. test
// and ref at once; a float64 truth a line per vector inside the loop (the pointer returned,
// else null), since a burst of its 32 lines fills the core's miss buffers and stalls.
template <bool kTruth>
HWY_INLINE const double* PrefetchNextBlock(const MetricsInput& in, std::uint64_t base,
                                           std::uint64_t end, std::size_t es, std::size_t us) {
  const std::uint64_t ahead = base + kBlock;
  const double* u_ahead = nullptr;
  if (ahead < end) {
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, end - ahead));
    PrefetchRange(in.test->data + ahead * es, m * es);
    PrefetchRange(in.ref->data + ahead * es, m * es);
    if constexpr (kTruth) {
      if (in.truth->dtype == DType::F64 && m == kBlock) {
        u_ahead = reinterpret_cast<const double*>(in.truth->data) + ahead;
      } else {
        PrefetchRange(in.truth->data + ahead * us, m * us);
      }
    }
  }
  return u_ahead;
}

// The block's n truth values as doubles: in place for float64, else decoded into buffer.
HWY_INLINE const double* TruthOfBlock(const TensorView& truth, std::uint64_t base, std::size_t n,
                                      double* buffer) {
  const std::byte* up = truth.data + base * element_size(truth.dtype);
  if (truth.dtype == DType::F64) return reinterpret_cast<const double*>(up);
  decode_block(truth.dtype, up, n, buffer);
  return buffer;
}

// A block's metrics once its vectors are reduced to scalars.
struct BlockTotals {
  double sq_err_test = 0, sq_err_ref = 0, sq_truth = 0, sq_test = 0, test_dot_truth = 0;
  double err_sum = 0, probe = 0, max_ref = 0, max_truth = 0, max_ref_truth = 0;
  std::uint64_t largest = 0;  // ULP distance
  std::uint64_t far = 0, undecided = 0, t_equal = 0, r_equal = 0;
  std::uint64_t test_over = 0, test_under = 0, ref_over = 0, ref_under = 0;
};

// A block's accumulators, folded one vector at a time by Add. Each vector's mask is counted
// in a general register (mask to register, popcount, add: integer units the vector loop
// leaves idle) rather than added into vector counters, which competed with the loop's
// arithmetic: the bf16 pass ran 20% faster so (AMD EPYC, AVX3). The values that differ are
// counted here for the integer codec only (the floating ones count them from the
// histogram). Add is inlined into the loop and calls nothing: a call inside it would make
// the compiler keep every accumulator in memory (a call clobbers all vector registers), so
// the lanes inside the allclose band are only counted here and decided after the loop.
template <class Codec, bool kTruth>
struct BlockAccumulators {
  HWY_INLINE void Add(const Lanes& v, const double* u, std::size_t i, const BandLines& lines,
                      const double* u_ahead, std::uint64_t* dist) {
    const D d;
    const DU du;
    const VD diff = hn::Abs(hn::Sub(v.test, v.ref));
    max_ref = hn::Max(max_ref, diff);
    const VD at = hn::Abs(v.test);
    const auto far_lanes = lines.Far(diff, at);
    far += hn::CountTrue(d, far_lanes);
    undecided += hn::CountTrue(d, lines.Undecided(diff, at, far_lanes));
    if constexpr (Codec::kBlockDistances) {
      // taken by Start
    } else {  // values that differ: counted by the histogram
      largest = hn::Max(largest, v.distance);
      hn::Store(v.distance, du, dist + i);
    }
    if constexpr (kTruth) {
      if (u_ahead) __builtin_prefetch(u_ahead + i, 0, 3);
      const VD vu = hn::LoadU(d, u + i);
      const VD e = hn::Sub(v.test, vu), er = hn::Sub(v.ref, vu);
      sq_err_test = hn::MulAdd(e, e, sq_err_test);
      sq_err_ref = hn::MulAdd(er, er, sq_err_ref);
      sq_truth = hn::MulAdd(vu, vu, sq_truth);
      sq_test = hn::MulAdd(v.test, v.test, sq_test);
      test_dot_truth = hn::MulAdd(v.test, vu, test_dot_truth);
      err_sum = hn::Add(err_sum, e);
      max_truth = hn::Max(max_truth, hn::Abs(e));
      max_ref_truth = hn::Max(max_ref_truth, hn::Abs(er));
      const VD au = hn::Abs(vu), ar = hn::Abs(v.ref);
      t_equal += hn::CountTrue(d, hn::Eq(v.test, vu));
      r_equal += hn::CountTrue(d, hn::Eq(v.ref, vu));
      test_over += hn::CountTrue(d, hn::Gt(at, au));
      test_under += hn::CountTrue(d, hn::Lt(at, au));
      ref_over += hn::CountTrue(d, hn::Gt(ar, au));
      ref_under += hn::CountTrue(d, hn::Lt(ar, au));
    } else {
      probe = hn::Add(probe, diff);
    }
  }

  // The vectors reduced to scalars, before anything after the loop calls out: a vector that
  // lives across a call is kept in memory, and the compiler then keeps it there in the loop
  // too.
  HWY_INLINE BlockTotals Reduce(const Codec& codec) const {
    const D d;
    BlockTotals b;
    b.sq_err_test = kTruth ? SumLanes(sq_err_test) : 0;
    b.sq_err_ref = kTruth ? SumLanes(sq_err_ref) : 0;
    b.sq_truth = kTruth ? SumLanes(sq_truth) : 0;
    b.sq_test = kTruth ? SumLanes(sq_test) : 0;
    b.test_dot_truth = kTruth ? SumLanes(test_dot_truth) : 0;
    b.err_sum = kTruth ? SumLanes(err_sum) : 0;
    b.probe = kTruth ? 0 : SumLanes(probe);
    b.max_ref = hn::GetLane(hn::MaxOfLanes(d, max_ref));
    b.max_truth = kTruth ? hn::GetLane(hn::MaxOfLanes(d, max_truth)) : 0;
    b.max_ref_truth = kTruth ? hn::GetLane(hn::MaxOfLanes(d, max_ref_truth)) : 0;
    if constexpr (Codec::kBlockDistances) {
      b.largest = codec.largest();
    } else {
      b.largest = hn::GetLane(hn::MaxOfLanes(DU(), largest));
    }
    b.far = far;
    b.undecided = undecided;
    b.t_equal = t_equal;
    b.r_equal = r_equal;
    b.test_over = test_over;
    b.test_under = test_under;
    b.ref_over = ref_over;
    b.ref_under = ref_under;
    return b;
  }

  // Written out (not default member initializers): an implicit constructor would not be
  // compiled for this target, and could not inline Highway's Zero.
  BlockAccumulators()
      : largest(hn::Zero(DU())),
        max_ref(hn::Zero(D())),
        max_truth(hn::Zero(D())),
        max_ref_truth(hn::Zero(D())),
        sq_err_test(hn::Zero(D())),
        sq_err_ref(hn::Zero(D())),
        sq_truth(hn::Zero(D())),
        sq_test(hn::Zero(D())),
        test_dot_truth(hn::Zero(D())),
        err_sum(hn::Zero(D())),
        probe(hn::Zero(D())) {}

  std::uint64_t far = 0, undecided = 0, t_equal = 0, r_equal = 0;
  std::uint64_t test_over = 0, test_under = 0, ref_over = 0, ref_under = 0;
  VU largest;
  VD max_ref, max_truth, max_ref_truth, sq_err_test, sq_err_ref, sq_truth, sq_test, test_dot_truth,
      err_sum;
  VD probe;  // sum of |t - r|: non-finite iff some input lane is (or huge)
};

// Whether every input lane of the block was finite: a NaN or Inf in test or ref reaches
// e or er (or |t - r|), one in truth reaches both; an 8-bit NaN or Inf, which its codec
// decodes to a finite stand-in, is flagged by the codec.
template <bool kTruth, class Codec>
HWY_INLINE bool AllFinite(const BlockTotals& b, const Codec& codec) {
  return !codec.special() && (kTruth ? std::isfinite(b.sq_err_test) && std::isfinite(b.sq_err_ref)
                                     : std::isfinite(b.probe));
}

// A block with a NaN or Inf, redone by the scalar reference path (which does not add the
// magnitude profile again: the caller added it).
HWY_INLINE Partial RedoOnScalarPath(const MetricsInput& in, const MetricOptions& opt,
                                    std::uint64_t base, std::size_t n) {
  MetricOptions without_profile = opt;
  without_profile.magnitude_profile = false;
  return accumulate_scalar(in, without_profile, base, base + n);
}

// The not-close lanes among the block's undecided ones, decided exactly (the block is finite).
template <class Codec>
HWY_INLINE std::uint64_t NotCloseInBand(const Codec& codec, std::size_t n, const BandLines& lines,
                                        DType dt, const MetricOptions& opt) {
  const D d;
  const std::size_t N = hn::Lanes(d);
  std::uint64_t not_close = 0;
  for (std::size_t i = 0; i < n; i += N) {
    const Lanes v = codec.Load(i);
    const VD diff = hn::Abs(hn::Sub(v.test, v.ref)), at = hn::Abs(v.test);
    const auto undecided = lines.Undecided(diff, at, lines.Far(diff, at));
    if (!hn::AllFalse(d, undecided)) not_close += NotCloseAmong(undecided, codec, i, dt, opt);
  }
  return not_close;
}

// A finite block's test-vs-ref metrics into the partial: allclose, bits and values that
// differ, the largest |t - r| and its first index, ULP distances.
template <class Codec>
HWY_INLINE void AddTestVsRef(const BlockTotals& b, const Codec& codec, const std::uint64_t* dist,
                             const std::byte* tp, const std::byte* rp, std::uint64_t base,
                             std::size_t n, const BandLines& lines, DType dt,
                             const MetricOptions& opt, Partial& p) {
  const D d;
  if (HWY_UNLIKELY(b.undecided > 0)) p.not_close += NotCloseInBand(codec, n, lines, dt, opt);
  p.not_close += b.far;
  p.bits_differ += CountBitsDiffer(element_size(dt), tp, rp, n);
  // A larger maximum than all before: find where it first occurs in this block.
  if (b.max_ref > p.max_abs_ref) {
    p.max_abs_ref = b.max_ref;
    p.max_abs_ref_index = base + FirstLaneWhere(n, [&](std::size_t i) {
                            const Lanes v = codec.Load(i);
                            return hn::Eq(hn::Abs(hn::Sub(v.test, v.ref)), hn::Set(d, b.max_ref));
                          });
  }
  if constexpr (Codec::kBlockDistances) {
    AddUlp(codec.distances(), n, b.largest, base, p);
  } else {
    AddUlp(dist, n, b.largest, base, p);
  }
}

// A finite block's truth metrics into the partial: the sums, the magnitude balance, the
// largest |t - u| and its first index.
template <class Codec>
HWY_INLINE void AddTruth(const BlockTotals& b, const Codec& codec, const double* u,
                         std::uint64_t base, std::size_t n, Partial& p) {
  const D d;
  p.sq_err_test.add(b.sq_err_test);
  p.sq_err_ref.add(b.sq_err_ref);
  p.sq_truth.add(b.sq_truth);
  p.sq_test.add(b.sq_test);
  p.test_dot_truth.add(b.test_dot_truth);
  p.err_sum.add(b.err_sum);
  p.test_over += b.test_over;
  p.test_under += b.test_under;
  p.ref_over += b.ref_over;
  p.ref_under += b.ref_under;
  p.max_abs_ref_truth = std::max(p.max_abs_ref_truth, b.max_ref_truth);
  if (b.max_truth > p.max_abs_truth) {
    p.max_abs_truth = b.max_truth;
    p.max_abs_truth_index =
        base + FirstLaneWhere(n, [&](std::size_t i) {
          return hn::Eq(hn::Abs(hn::Sub(codec.Load(i).test, hn::LoadU(d, u + i))),
                        hn::Set(d, b.max_truth));
        });
  }
}

// The fused pass over [begin, end) (a whole number of vectors) with one codec, block by
// block: decode (Start), accumulate each vector in registers, reduce, then either redo the
// block on the scalar path (a NaN or Inf) or add it to the partial.
template <class Codec, bool kTruth>
Partial AccumulateWith(const MetricsInput& in, const MetricOptions& opt, const CloseBand& band,
                       std::uint64_t begin, std::uint64_t end) {
  const std::size_t N = hn::Lanes(D());
  static_assert(kBlock % (HWY_MAX_BYTES / sizeof(double)) == 0, "blocks hold whole vectors");
  const DType dt = in.test->dtype;
  const std::size_t es = element_size(dt);
  const std::size_t us = kTruth ? element_size(in.truth->dtype) : 0;
  Codec codec(dt);
  const BandLines lines(band, opt.tol);
  HWY_ALIGN double truth_buffer[kBlock];
  HWY_ALIGN std::uint64_t dist[kBlock];

  Partial p, redone;  // redone: the blocks the scalar path took over, merged in order
  std::uint64_t fast_n = 0, t_equal = 0, r_equal = 0;
  for (std::uint64_t base = begin; base < end; base += kBlock) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, end - base));
    const std::byte* tp = in.test->data + base * es;
    const std::byte* rp = in.ref->data + base * es;
    const double* u_ahead = PrefetchNextBlock<kTruth>(in, base, end, es, us);
    codec.Start(tp, rp, n);
    const double* u = nullptr;
    if constexpr (kTruth) u = TruthOfBlock(*in.truth, base, n, truth_buffer);

    BlockAccumulators<Codec, kTruth> acc;
    for (std::size_t i = 0; i < n; i += N) acc.Add(codec.Load(i), u, i, lines, u_ahead, dist);
    const BlockTotals b = acc.Reduce(codec);

    // The profile is added here, block by block in order, as the scalar path adds it.
    if constexpr (kTruth) {
      if (opt.magnitude_profile) add_magnitude_profile(in, base, base + n, p.magnitude);
    }
    if (HWY_UNLIKELY(!AllFinite<kTruth>(b, codec))) {
      redone.merge(RedoOnScalarPath(in, opt, base, n));
      continue;
    }
    fast_n += n;
    AddTestVsRef(b, codec, dist, tp, rp, base, n, lines, dt, opt, p);
    if constexpr (kTruth) {
      t_equal += b.t_equal;
      r_equal += b.r_equal;
      AddTruth(b, codec, u, base, n, p);
    }
  }

  p.n = fast_n;
  if constexpr (kTruth) {
    // Finite lanes: a value differs from the truth exactly when it is not equal to it.
    p.test_differs = fast_n - t_equal;
    p.ref_differs = fast_n - r_equal;
  }
  p.merge(redone);  // maxima on ties keep the smaller index, whatever the merge order
  return p;
}

}  // namespace HWY_NAMESPACE
}  // namespace numalign::detail
HWY_AFTER_NAMESPACE();

#endif  // NUMALIGN_METRICS_SIMD_INL_H_
