// dtype_test.cpp: every bit pattern of every 8- and 16-bit type against an independent
// derivation, rounding from double, and the ULP ordinals.
#include "numalign/dtype.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace numalign {
namespace {

struct Fp8Spec {  // written out from the OCP / Graphcore FNUZ definitions
  DType dtype;
  int exp_bits, man_bits, bias;
  bool fnuz;   // 0x80 is the only NaN, no -0
  bool ieee;   // all-ones exponent is inf / NaN
  double max;  // the largest finite value, from the spec tables
};

const Fp8Spec kFp8[] = {
    {DType::F8_E4M3, 4, 3, 7, false, false, 448.0},
    {DType::F8_E5M2, 5, 2, 15, false, true, 57344.0},
    {DType::F8_E4M3FNUZ, 4, 3, 8, true, false, 240.0},
    {DType::F8_E5M2FNUZ, 5, 2, 16, true, false, 57344.0},
};

// Value from the spec formula: (-1)^s * 2^(e - bias) * (1 + m / 2^M), subnormals at e = 0.
double spec_value(const Fp8Spec& s, unsigned b) {
  const unsigned sign = b >> 7, e = (b >> s.man_bits) & ((1u << s.exp_bits) - 1),
                 m = b & ((1u << s.man_bits) - 1);
  const double frac = static_cast<double>(m) / static_cast<double>(1u << s.man_bits);
  if (s.fnuz && b == 0x80) return NAN;
  if (!s.fnuz && !s.ieee && (b & 0x7F) == 0x7F) return NAN;
  if (s.ieee && e == (1u << s.exp_bits) - 1) return m ? NAN : (sign ? -INFINITY : INFINITY);
  const double mag = e == 0 ? std::pow(2.0, 1 - s.bias) * frac
                            : std::pow(2.0, static_cast<int>(e) - s.bias) * (1 + frac);
  return sign ? -mag : mag;
}

bool same_double(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

TEST(DTypeTest, EveryFp8PatternMatchesTheSpecFormula) {
  for (const auto& s : kFp8) {
    double max_seen = 0;
    for (unsigned b = 0; b < 256; ++b) {
      const auto byte = static_cast<std::byte>(b);
      const double expected = spec_value(s, b);
      const double got = to_double(s.dtype, &byte);
      double block;
      decode_block(s.dtype, &byte, 1, &block);
      ASSERT_TRUE(same_double(got, expected))
          << name(s.dtype) << " pattern " << b << ": " << got << " vs " << expected;
      ASSERT_TRUE(same_double(block, expected)) << name(s.dtype) << " block decode, pattern " << b;
      EXPECT_EQ(is_nan_bits(s.dtype, b), std::isnan(expected));
      if (std::isfinite(expected)) max_seen = std::max(max_seen, std::fabs(expected));
    }
    EXPECT_EQ(max_seen, s.max) << name(s.dtype);
  }
  // FNUZ: 0x00 is the only zero and it is positive.
  const std::byte zero{0};
  EXPECT_FALSE(std::signbit(to_double(DType::F8_E4M3FNUZ, &zero)));
}

TEST(DTypeTest, EveryE8M0PatternIsAPowerOfTwo) {
  for (unsigned b = 0; b < 256; ++b) {
    const auto byte = static_cast<std::byte>(b);
    const double v = to_double(DType::F8_E8M0, &byte);
    if (b == 0xFF) {
      EXPECT_TRUE(std::isnan(v));
    } else {
      EXPECT_EQ(v, std::ldexp(1.0, static_cast<int>(b) - 127)) << b;
    }
  }
}

// Both decoders (the scalar one and the block one) give `expected(bits)` for all 65536 patterns.
template <class Expected>
void expect_every_16bit_pattern(DType dtype, Expected expected) {
  for (unsigned b = 0; b < 65536; ++b) {
    const auto bits16 = static_cast<std::uint16_t>(b);
    std::byte raw[2];
    std::memcpy(raw, &bits16, 2);
    double block;
    decode_block(dtype, raw, 1, &block);
    const double want = expected(bits16);
    ASSERT_TRUE(same_double(to_double(dtype, raw), want)) << name(dtype) << " " << b;
    ASSERT_TRUE(same_double(block, want)) << name(dtype) << " block " << b;
  }
}

TEST(DTypeTest, EveryF16PatternMatchesTheCompilersHalf) {
  expect_every_16bit_pattern(DType::F16, [](std::uint16_t bits16) {
    _Float16 h;
    std::memcpy(&h, &bits16, 2);
    return static_cast<double>(h);
  });
}

TEST(DTypeTest, EveryBf16PatternIsTheTopHalfOfAFloat) {
  expect_every_16bit_pattern(DType::BF16, [](std::uint16_t bits16) {
    const std::uint32_t word = static_cast<std::uint32_t>(bits16) << 16;
    float f;
    std::memcpy(&f, &word, 4);
    return static_cast<double>(f);
  });
}

std::vector<DType> narrow_floats() {
  return {DType::F16,         DType::BF16,        DType::F8_E4M3, DType::F8_E5M2,
          DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ, DType::F8_E8M0};
}

TEST(DTypeTest, RoundingReproducesEveryPattern) {
  for (DType d : narrow_floats()) {
    const unsigned count = bits(d) == 8 ? 256 : 65536;
    for (unsigned b = 0; b < count; ++b) {
      if (is_nan_bits(d, b)) {
        EXPECT_TRUE(is_nan_bits(d, round_to_bits(d, float_from_bits(d, b))));
        continue;
      }
      ASSERT_EQ(round_to_bits(d, float_from_bits(d, b)), b) << name(d) << " pattern " << b;
    }
  }
}

// Between two neighbours: the midpoint goes to the even pattern, anything off it to the
// nearer neighbour.
TEST(DTypeTest, RoundingIsToNearestTiesToEven) {
  for (DType d : narrow_floats()) {
    if (d == DType::F8_E8M0) continue;  // no mantissa: checked below
    const unsigned count = bits(d) == 8 ? 128 : 32768;
    for (unsigned b = 0; b + 1 < count; ++b) {
      const double lo = float_from_bits(d, b), hi = float_from_bits(d, b + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const double mid = lo + (hi - lo) / 2;
      const unsigned even = (b % 2 == 0) ? b : b + 1;
      ASSERT_EQ(round_to_bits(d, mid), even) << name(d) << " between " << lo << " and " << hi;
      ASSERT_EQ(round_to_bits(d, std::nextafter(mid, lo)), b) << name(d);
      ASSERT_EQ(round_to_bits(d, std::nextafter(mid, hi)), b + 1) << name(d);
    }
  }
  EXPECT_EQ(round_to_bits(DType::F8_E8M0, 1.4), 127u);
  EXPECT_EQ(round_to_bits(DType::F8_E8M0, 1.6), 128u);
}

TEST(DTypeTest, OverflowGivesInfWhereThereIsOneElseNaN) {
  EXPECT_TRUE(std::isinf(round_to(DType::F16, 65520.0)));  // the midpoint above 65504 ties up
  EXPECT_EQ(round_to(DType::F16, 65519.0), 65504.0);
  EXPECT_EQ(round_to(DType::F8_E4M3, 464.0), 448.0);  // tie to the even 448
  EXPECT_TRUE(std::isnan(round_to(DType::F8_E4M3, 465.0)));
  EXPECT_TRUE(std::isnan(round_to(DType::F8_E4M3FNUZ, 1e6)));
  EXPECT_TRUE(std::isinf(round_to(DType::F8_E5M2, 1e6)));
  EXPECT_EQ(round_to_bits(DType::F8_E4M3FNUZ, -0.0), 0u);  // no negative zero
  EXPECT_TRUE(std::isnan(round_to(DType::F8_E8M0, -1.0)));
}

TEST(DTypeTest, F16RoundingMatchesTheCompilerOnRandomDoubles) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> exponent(-30, 17);
  for (int i = 0; i < 200000; ++i) {
    const double x = std::ldexp(std::uniform_real_distribution<double>(-2, 2)(rng),
                                static_cast<int>(exponent(rng)));
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t expected;
    std::memcpy(&expected, &h, 2);
    ASSERT_EQ(round_to_bits(DType::F16, x), expected) << x;
  }
}

TEST(DTypeTest, OrdinalsAreMonotonicAndZerosCoincide) {
  for (DType d : narrow_floats()) {
    const unsigned count = bits(d) == 8 ? 256 : 65536;
    std::vector<std::pair<double, std::int64_t>> v;
    for (unsigned b = 0; b < count; ++b) {
      if (!is_nan_bits(d, b)) v.emplace_back(float_from_bits(d, b), ulp_ordinal(d, b));
    }
    std::sort(v.begin(), v.end());
    for (std::size_t i = 1; i < v.size(); ++i) {
      if (v[i].first == v[i - 1].first) {
        ASSERT_EQ(v[i].second, v[i - 1].second) << name(d) << " +0/-0";
      } else {
        ASSERT_EQ(v[i].second, v[i - 1].second + 1) << name(d) << " at " << v[i].first;
      }
    }
  }
  EXPECT_EQ(ordinal_distance(ulp_ordinal(DType::F32, 0x80000000u), ulp_ordinal(DType::F32, 0)), 0u);
  // Extremes of F64 do not overflow the distance.
  const std::int64_t lo = ulp_ordinal(DType::F64, std::bit_cast<std::uint64_t>(-1.7e308));
  const std::int64_t hi = ulp_ordinal(DType::F64, std::bit_cast<std::uint64_t>(1.7e308));
  EXPECT_EQ(ordinal_distance(lo, hi), static_cast<std::uint64_t>(hi) * 2);
}

TEST(DTypeTest, NamesRoundTripAndSizes) {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(name(d)), d);
  }
  EXPECT_FALSE(dtype_from_name("F128"));
  EXPECT_EQ(bits(DType::F4), 4);
  EXPECT_EQ(element_size(DType::BF16), 2u);
  EXPECT_FALSE(is_judgeable(DType::C64));
  EXPECT_TRUE(is_low_precision(DType::F8_E5M2));
  EXPECT_FALSE(is_low_precision(DType::F32));
}

}  // namespace
}  // namespace numalign
