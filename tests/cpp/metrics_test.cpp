// metrics_test.cpp: the fused pass against straightforward long-double formulas, its
// determinism across thread counts, ULP statistics and non-finite semantics.
#include "numalign/metrics.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "simulations.hpp"

namespace numalign {
namespace {

using examples::Buffer;
using examples::make_buffer;

struct Triple {
  Buffer test, ref, truth;
};

// Enough elements for several parallel chunks (1 Mi elements each).
Triple random_triple(std::size_t n, DType dtype) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> dist;
  std::vector<double> u(n), t(n), r(n);
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = dist(rng);
    t[i] = u[i] + 1e-3 * dist(rng);
    r[i] = u[i] + 1e-3 * dist(rng);
  }
  return {make_buffer(dtype, {n}, t), make_buffer(dtype, {n}, r), make_buffer(DType::F64, {n}, u)};
}

// A result's histogram keeps the bins up to the last one used; reading past them gives 0,
// and equal counts compare equal however they were set.
TEST(UlpHistogramTest, KeepsUsedBinsAndReadsZeroBeyond) {
  std::array<std::uint64_t, kUlpBins> dense{};
  dense[0] = 14;
  dense[3] = 2;
  const UlpHistogram h(dense);
  EXPECT_EQ(h[0], 14u);
  EXPECT_EQ(h[1], 0u);
  EXPECT_EQ(h[3], 2u);
  EXPECT_EQ(h[kUlpInfBin], 0u);
  UlpHistogram set;
  set.set(kUlpInfBin, 5);
  set.set(kUlpInfBin, 0);  // back to empty
  set.set(3, 2);
  set.set(0, 14);
  set.set(10, 0);
  EXPECT_EQ(set, h);
  set.set(1, 1);
  EXPECT_FALSE(set == h);
  EXPECT_EQ(UlpHistogram(std::array<std::uint64_t, kUlpBins>{}), UlpHistogram());
}

TEST(MetricsTest, MatchesLongDoubleFormulas) {
  const std::size_t n = 3'000'001;
  const Triple x = random_triple(n, DType::F32);
  const TensorView t = x.test.view(), r = x.ref.view(), u = x.truth.view();
  const Metrics m = compute_metrics(t, r, &u);
  long double se_t = 0, se_r = 0, su = 0, st = 0, stu = 0, sum_e = 0;
  double max_abs = 0, max_abs_ref = 0;
  std::uint64_t max_index = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const long double tv = to_double(DType::F32, t.data + 4 * i),
                      rv = to_double(DType::F32, r.data + 4 * i),
                      uv = to_double(DType::F64, u.data + 8 * i);
    se_t += (tv - uv) * (tv - uv);
    se_r += (rv - uv) * (rv - uv);
    su += uv * uv;
    st += tv * tv;
    stu += tv * uv;
    sum_e += tv - uv;
    if (std::fabs(static_cast<double>(tv - uv)) > max_abs) {
      max_abs = std::fabs(static_cast<double>(tv - uv));
      max_index = i;
    }
    max_abs_ref = std::max(max_abs_ref, std::fabs(static_cast<double>(rv - uv)));
  }
  const auto rel = [](double got, long double want) {
    return std::fabs(got - static_cast<double>(want)) / std::fabs(static_cast<double>(want));
  };
  EXPECT_LT(rel(m.error, std::sqrt(se_t / n)), 1e-13);
  EXPECT_LT(rel(m.baseline, std::sqrt(se_r / n)), 1e-13);
  EXPECT_LT(rel(m.rel_l2, std::sqrt(se_t) / std::sqrt(su)), 1e-13);
  EXPECT_LT(rel(m.cosine, stu / std::sqrt(st) / std::sqrt(su)), 1e-13);
  EXPECT_LT(std::fabs(m.mean_error - static_cast<double>(sum_e / n)), 1e-15);
  EXPECT_EQ(m.max_abs_truth, max_abs);
  EXPECT_EQ(m.max_abs_truth_index, max_index);
  EXPECT_EQ(m.max_abs_ref_truth, max_abs_ref);
  EXPECT_GT(max_abs_ref, 0);
  EXPECT_EQ(m.numel, n);
}

TEST(MetricsTest, SameResultOnOneAndTwoThreads) {
  const Triple x = random_triple(2'500'000, DType::BF16);
  const TensorView t = x.test.view(), r = x.ref.view(), u = x.truth.view();
  const MetricsInput in{&t, &r, &u};
  const Metrics one = compute_metrics(std::span(&in, 1), {}, 1)[0];
  const Metrics two = compute_metrics(std::span(&in, 1), {}, 2)[0];
  EXPECT_EQ(std::memcmp(&one.error, &two.error, sizeof(double)), 0);
  EXPECT_EQ(one.baseline, two.baseline);
  EXPECT_EQ(one.cosine, two.cosine);
  EXPECT_EQ(one.ulp.hist, two.ulp.hist);
  EXPECT_EQ(one.max_abs_ref_index, two.max_abs_ref_index);
  EXPECT_EQ(one.not_close, two.not_close);
}

TEST(MetricsTest, UlpStatisticsAndHistogram) {
  // bf16 values 1.0 + k ULP against 1.0: distances 0, 1, 2, 3, 5, 9, 100.
  std::vector<std::uint16_t> ref(7, 0x3F80),
      test{0x3F80, 0x3F81, 0x3F82, 0x3F83, 0x3F85, 0x3F89, 0x3F80 + 100};
  const TensorView t{DType::BF16, {7}, reinterpret_cast<const std::byte*>(test.data())};
  const TensorView r{DType::BF16, {7}, reinterpret_cast<const std::byte*>(ref.data())};
  const Metrics m = compute_metrics(t, r, nullptr);
  EXPECT_EQ(m.ulp.max, 100u);
  EXPECT_EQ(m.ulp.max_index, 6u);
  EXPECT_EQ(m.values_differ, 6u);
  EXPECT_EQ(m.bits_differ, 6u);
  EXPECT_EQ(m.ulp.hist[0], 1u);
  EXPECT_EQ(m.ulp.hist[1], 1u);
  EXPECT_EQ(m.ulp.hist[2], 1u);
  EXPECT_EQ(m.ulp.hist[3], 1u);  // 3-4
  EXPECT_EQ(m.ulp.hist[4], 1u);  // 5-8
  EXPECT_EQ(m.ulp.hist[5], 1u);  // 9-16
  EXPECT_EQ(m.ulp.hist[8], 1u);  // 65-128
  EXPECT_EQ(ulp_bin_label(3), "3-4");
  EXPECT_EQ(ulp_bin_label(8), "65-128");
  EXPECT_EQ(ulp_bin_label(kUlpInfBin), "inf");
  EXPECT_EQ(ulp_bin(~0ULL), kUlpInfBin - 1);
  EXPECT_FALSE(m.has_truth);
}

// The last finite bin, (2^63, 2^64): float64 values of opposite signs far from zero. Its
// label once shifted by 64 (found by fuzz_report).
TEST(MetricsTest, TheWidestUlpDistancesHaveABinAndALabel) {
  const std::vector<double> test{1e308}, ref{-1e308};
  const TensorView t{DType::F64, {1}, reinterpret_cast<const std::byte*>(test.data())};
  const TensorView r{DType::F64, {1}, reinterpret_cast<const std::byte*>(ref.data())};
  const Metrics m = compute_metrics(t, r, nullptr);
  EXPECT_GT(m.ulp.max, std::uint64_t{1} << 63);
  EXPECT_EQ(m.ulp.hist[kUlpInfBin - 1], 1u);
  EXPECT_EQ(ulp_bin_label(kUlpInfBin - 1), "9223372036854775809-18446744073709551615");
  EXPECT_EQ(ulp_bin_label(kUlpInfBin - 2), "4611686018427387905-9223372036854775808");
}

TEST(MetricsTest, SignedZerosAreZeroUlpsApartButNotBitwiseEqual) {
  const float test[2] = {0.0f, -0.0f}, ref[2] = {-0.0f, 0.0f};
  const TensorView t{DType::F32, {2}, reinterpret_cast<const std::byte*>(test)};
  const TensorView r{DType::F32, {2}, reinterpret_cast<const std::byte*>(ref)};
  const Metrics m = compute_metrics(t, r, nullptr);
  EXPECT_EQ(m.ulp.max, 0u);
  EXPECT_EQ(m.values_differ, 0u);
  EXPECT_EQ(m.bits_differ, 2u);
  EXPECT_EQ(m.not_close, 0u);
}

TEST(MetricsTest, NanSemantics) {
  const float nan = NAN;
  const float test[3] = {nan, 1.0f, nan}, ref[3] = {nan, nan, 2.0f};
  const TensorView t{DType::F32, {3}, reinterpret_cast<const std::byte*>(test)};
  const TensorView r{DType::F32, {3}, reinterpret_cast<const std::byte*>(ref)};
  Metrics m = compute_metrics(t, r, nullptr, {1e-4, false});
  EXPECT_EQ(m.not_close, 3u);
  EXPECT_EQ(m.ulp.hist[kUlpInfBin], 3u);
  EXPECT_TRUE(m.ulp.any_inf);
  EXPECT_EQ(m.test_nonfinite.nan, 2u);
  m = compute_metrics(t, r, nullptr, {1e-4, true});
  EXPECT_EQ(m.not_close, 2u);  // NaN == NaN now
  EXPECT_EQ(m.ulp.hist[0], 1u);
  EXPECT_EQ(m.ulp.hist[kUlpInfBin], 2u);
}

TEST(MetricsTest, InfinitiesAndErrorBalance) {
  const double inf = INFINITY;
  const float test[4] = {1.5f, -2.5f, 0.5f, static_cast<float>(inf)},
              ref[4] = {1.5f, -2.0f, 1.0f, static_cast<float>(inf)};
  const double truth[4] = {1.0, -2.0, 1.0, inf};
  const TensorView t{DType::F32, {4}, reinterpret_cast<const std::byte*>(test)};
  const TensorView r{DType::F32, {4}, reinterpret_cast<const std::byte*>(ref)};
  const TensorView u{DType::F64, {4}, reinterpret_cast<const std::byte*>(truth)};
  const Metrics m = compute_metrics(t, r, &u);
  // test differs from truth at 0 (over), 1 (over), 2 (under); inf == inf.
  EXPECT_EQ(m.test_differs_truth, 3u);
  EXPECT_NEAR(m.eb_test, 1.0 / 3.0, 1e-15);
  EXPECT_EQ(m.ref_differs_truth, 1u);
  EXPECT_EQ(m.eb_ref, 1.0);
  EXPECT_TRUE(std::isnan(m.error));  // inf - inf, as torch computes it
  EXPECT_EQ(m.test_nonfinite.inf, 1u);
  EXPECT_EQ(m.truth_nonfinite.inf, 1u);
}

TEST(MetricsTest, EmptyTensor) {
  const TensorView t{DType::BF16, {0, 3}, nullptr};
  const TensorView u{DType::F64, {0, 3}, nullptr};
  const Metrics m = compute_metrics(t, t, &u);
  EXPECT_EQ(m.numel, 0u);
  EXPECT_EQ(m.not_close, 0u);
  EXPECT_TRUE(std::isnan(m.error));
}

}  // namespace
}  // namespace numalign
