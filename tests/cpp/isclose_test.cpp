// isclose_test.cpp: the emulation of torch.isclose in the tensors' dtype (its roundings,
// verdicts that differ from double arithmetic at the boundary, NaN) and the band outside
// which double arithmetic gives its verdict (what the SIMD kernel relies on).
#include "isclose.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "numalign/dtype.hpp"
#include "numalign/metrics.hpp"

namespace numalign {
namespace {

using detail::close_band;
using detail::torch_isclose;

TEST(IscloseTest, EqualValuesAndNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType d : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::F8_E4M3}) {
    EXPECT_TRUE(torch_isclose(d, 1.5, 1.5, 0, 0, false)) << name(d);
    EXPECT_TRUE(torch_isclose(d, inf, inf, 0, 0, false)) << name(d);
    EXPECT_FALSE(torch_isclose(d, inf, -inf, 1, 1, false)) << name(d);
    EXPECT_FALSE(torch_isclose(d, nan, nan, 1, 1, false)) << name(d);
    EXPECT_TRUE(torch_isclose(d, nan, nan, 0, 0, true)) << name(d);
    EXPECT_FALSE(torch_isclose(d, nan, 1.0, 1, 1, true)) << name(d);
    EXPECT_FALSE(torch_isclose(d, 1.0, inf, 1, 1, false)) << name(d);
  }
}

// |self - other| <= atol + rtol * |other|: the allowance scales with the other (the test,
// as same() calls allclose(ref, test)), not with self.
TEST(IscloseTest, TheAllowanceScalesWithOther) {
  EXPECT_TRUE(torch_isclose(DType::F64, 0.0, 1.0, 0, 1, false));
  EXPECT_FALSE(torch_isclose(DType::F64, 1.0, 0.0, 0, 1, false));
  EXPECT_TRUE(torch_isclose(DType::F64, 10.0, 11.0, 0, 0.1, false));
  EXPECT_FALSE(torch_isclose(DType::F64, 10.0, 11.0, 0, 0.09, false));
}

// At the boundary the dtype's roundings decide, as in ATen, where double arithmetic would
// give the other verdict.
TEST(IscloseTest, TheBoundaryIsWhereTheDtypeRoundsIt) {
  // bf16: the allowance atol = 0.01 rounds up to 0.010009765625 (a bf16 value), and so a
  // difference of exactly that much is close in bf16, though not in double.
  const double bf16_tol = float_from_bits(DType::BF16, round_to_bits(DType::BF16, 0.01));
  ASSERT_EQ(bf16_tol, 0.010009765625);
  EXPECT_TRUE(torch_isclose(DType::BF16, bf16_tol, 0.0, 0.01, 0.01, false));
  EXPECT_FALSE(torch_isclose(DType::F64, bf16_tol, 0.0, 0.01, 0.01, false));
  // The next bf16 value up is not close in bf16 either.
  const double above = float_from_bits(DType::BF16, round_to_bits(DType::BF16, 0.01) + 1);
  EXPECT_FALSE(torch_isclose(DType::BF16, above, 0.0, 0.01, 0.01, false));
  // f32: float(0.1) is above 0.1, so a difference of float(0.1) is close in float only.
  const double f32_tenth = static_cast<float>(0.1);
  ASSERT_GT(f32_tenth, 0.1);
  EXPECT_TRUE(torch_isclose(DType::F32, f32_tenth, 0.0, 0.1, 0.1, false));
  EXPECT_FALSE(torch_isclose(DType::F64, f32_tenth, 0.0, 0.1, 0.1, false));
  // f16: 1 + 2^-10 (the next half after 1) against 1 with tol 2^-11: the allowance
  // 2^-11 + 2^-11 * 1 = 2^-10 is exact, and so is the difference: close in every dtype.
  EXPECT_TRUE(torch_isclose(DType::F16, 1 + 0x1p-10, 1.0, 0x1p-11, 0x1p-11, false));
  EXPECT_TRUE(torch_isclose(DType::F64, 1 + 0x1p-10, 1.0, 0x1p-11, 0x1p-11, false));
}

// ATen casts atol, a wrapped number, to the tensors' dtype before the add (double to float
// to half), while rtol enters the mul as a float: issue 19's repros, where that rounding of
// atol decides.
TEST(IscloseTest, HalfTypesRoundAtolToTheDtype) {
  // bf16 at 0.02: atol is 0.02001953125; 0.02001953125 + 0.0150146484375 = 0.0350341796875 is
  // a tie between bf16 values that goes up to 0.03515625 = |0.71484375 - 0.75|: close.
  EXPECT_TRUE(torch_isclose(DType::BF16, 0.71484375, 0.75, 0.02, 0.02, false));
  // fp16 at 0.03: atol is 0.029998779296875, and the allowance rounds down to
  // 0.03009033203125, below |ref - test| = 0.0301055908203125: not close.
  EXPECT_FALSE(
      torch_isclose(DType::F16, 0.026824951171875, -0.003276824951171875, 0.03, 0.03, false));
  // fp16, the NaN escape's 4e-2 at test 1.3427734375: the allowance 0.0937109375 rounds to a
  // tie that goes up to 0.09375, the difference to 1.4365234375.
  EXPECT_TRUE(torch_isclose(DType::F16, 1.4365234375, 1.3427734375, 4e-2, 4e-2, false));
}

// The band's contract: a difference at or below its lower line is close, one at or above
// its upper line is not, whatever the emulation's roundings; checked on differences that
// straddle the boundary of every dtype the band handles, for tolerances inside the
// narrow band's range and outside it (the factor-2 shortcut).
TEST(IscloseTest, TheBandHoldsEveryVerdictTheEmulationCanFlip) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> exponent(-12, 12), unit(-1, 1);
  std::uniform_int_distribution<int> spread(2, 12);
  std::uint64_t decided_close = 0, decided_far = 0;
  for (DType d : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    for (double tol : {1e-4, 1e-2, 0.15, 0.5, 1e-35}) {
      const detail::CloseBand band = close_band(d, tol);
      EXPECT_LE(band.lo_scale, 1.0) << name(d) << " " << tol;
      EXPECT_GE(band.hi_scale, 1.0) << name(d) << " " << tol;
      for (int i = 0; i < 20000; ++i) {
        const double other = round_to(d, std::ldexp(unit(rng), static_cast<int>(exponent(rng))));
        const double allowed = tol + tol * std::fabs(other);
        // A self either side of other + allowed, by 2^-2 to 2^-12 of it, in the dtype.
        const double self =
            round_to(d, other + allowed * (1 + std::ldexp(unit(rng), -spread(rng))));
        if (!std::isfinite(self)) continue;
        const double diff = std::fabs(self - other);
        const bool close = torch_isclose(d, self, other, tol, tol, false);
        if (diff <= band.lo_scale * allowed + band.lo_offset) {
          EXPECT_TRUE(close) << name(d) << " tol " << tol << ": " << self << " vs " << other;
          ++decided_close;
        } else if (diff >= band.hi_scale * allowed + band.hi_offset) {
          EXPECT_FALSE(close) << name(d) << " tol " << tol << ": " << self << " vs " << other;
          ++decided_far;
        }
      }
    }
  }
  EXPECT_GT(decided_close, 10000u);
  EXPECT_GT(decided_far, 10000u);
}

// allclose(truth.to(dtype), test, 4e-2, 4e-2): the truth is rounded to the test's dtype
// first. At test 1 the allowance is about 0.08 (0.080078125 in bf16): a truth of 1.0805 is
// beyond it but rounds to 1.078125, within; 1.0825 rounds to 1.0859375, beyond.
TEST(IscloseTest, LooselyCloseToTruthRoundsTheTruthToTheTestDtype) {
  const std::uint16_t test_bits[2] = {0x3F80, 0x4000};  // bf16 1, 2
  const double near[2] = {1.0805, 2.0}, far[2] = {1.0825, 2.0};
  const TensorView test{DType::BF16, {2}, reinterpret_cast<const std::byte*>(test_bits)};
  const TensorView truth_near{DType::F64, {2}, reinterpret_cast<const std::byte*>(near)};
  const TensorView truth_far{DType::F64, {2}, reinterpret_cast<const std::byte*>(far)};
  EXPECT_TRUE(loosely_close_to_truth(test, truth_near, false));
  EXPECT_FALSE(loosely_close_to_truth(test, truth_far, false));
}

// The float-to-half roundings of the allclose emulation against the exact double
// rounding of dtype.hpp: every value of each type, the floats on both sides of each
// midpoint to its neighbour (the ties), and random floats of every exponent.
TEST(IscloseTest, FloatRoundingToHalvesMatchesTheExactRounding) {
  std::mt19937_64 rng(13);
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<float> xs;
    for (std::uint32_t b = 0; b < 0x8000; ++b) {
      const double v = float_from_bits(dt, b), next = float_from_bits(dt, b + 1);
      if (!std::isfinite(v)) continue;
      // Past the largest value the tie is half a step above it, where rounding overflows.
      const double step = std::isfinite(next) ? next - v : v - float_from_bits(dt, b - 1);
      const auto mid = static_cast<float>(v + step / 2);
      for (float x : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    for (int i = 0; i < 1 << 20; ++i) {
      const auto bits = static_cast<std::uint32_t>(rng());
      float x;
      std::memcpy(&x, &bits, 4);
      xs.push_back(x);
    }
    for (float x : xs) {
      const float got = detail::round_float_to(dt, x);
      const auto want = static_cast<float>(round_to(dt, x));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << name(dt) << " " << x;
      } else {
        ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
            << name(dt) << " " << x << ": " << got << " vs " << want;
      }
    }
  }
}

}  // namespace
}  // namespace numalign
