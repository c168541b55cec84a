// upstream_gradient_test.cpp: the fixed upstream gradient's values are k / 128 with |k| <= 222,
// exact in bf16 and fp16, centred with unit variance, element i a function of (key, i) alone;
// keys draw apart.
// (tests/python/test_capture_claims.py checks the bits against an independent Python oracle.)
#include "numalign/upstream_gradient.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace numalign {
namespace {

// x rounded to bf16 (to nearest even) and back: its top 16 bits, rounded.
float bf16_round_trip(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

std::vector<float> draw(std::uint64_t key, std::size_t n) {
  std::vector<float> v(n);
  fill_upstream_gradient(key, v.data(), n);
  return v;
}

TEST(UpstreamGradientTest, ValuesLieOnTheGridCentredWithUnitVariance) {
  const std::vector<float> v = draw(12345, 1 << 16);
  double sum = 0, sum_sq = 0;
  bool low_end = false, high_end = false;
  for (const float x : v) {
    const float k = x * 128.0f;
    ASSERT_EQ(k, std::round(k)) << x;  // on the grid of 1/128
    ASSERT_LE(std::fabs(k), 222.0f);
    low_end |= k == -222.0f;
    high_end |= k == 222.0f;
    EXPECT_EQ(static_cast<float>(bf16_round_trip(x)), x) << "exact in bf16";
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  EXPECT_TRUE(low_end && high_end) << "both ends drawn";
  const double n = static_cast<double>(v.size());
  EXPECT_LT(std::abs(sum / n), 0.02);  // mean 0 (sd of the mean: 0.004)
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);  // unit variance, as torch.randn's
}

TEST(UpstreamGradientTest, ElementsDependOnKeyAndIndexAlone) {
  const std::vector<float> long_draw = draw(7, 1000);
  const std::vector<float> short_draw = draw(7, 10);
  for (std::size_t i = 0; i < short_draw.size(); ++i) EXPECT_EQ(short_draw[i], long_draw[i]) << i;
  EXPECT_EQ(draw(7, 1000), long_draw) << "the same every time";
  const std::vector<float> other = draw(8, 1000);
  std::size_t same = 0;
  for (std::size_t i = 0; i < other.size(); ++i) same += other[i] == long_draw[i];
  EXPECT_LT(same, 3u) << "neighbouring keys draw unrelated values";
}

}  // namespace
}  // namespace numalign
