// metrics_simd_test.cpp: the SIMD kernel against the scalar reference path, on every
// instruction set Highway compiled and this CPU runs, over every dtype (every bit pattern
// of the 8- and 16-bit formats), NaN/Inf, allclose boundary cases, ties and tails.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "metrics_internal.hpp"
#include "numalign/dtype.hpp"
#include "numalign/metrics.hpp"

namespace numalign {
namespace {

using detail::Partial;

// Raw little-endian elements of one dtype, built from bit patterns or values.
struct Raw {
  DType dtype;
  std::vector<std::byte> bytes;

  Raw(DType d, std::size_t n) : dtype(d), bytes(n * element_size(d)) {}
  std::size_t size() const { return bytes.size() / element_size(dtype); }
  void set_bits(std::size_t i, std::uint64_t b) {
    std::memcpy(bytes.data() + i * element_size(dtype), &b, element_size(dtype));
  }
  std::uint64_t get_bits(std::size_t i) const {
    std::uint64_t b = 0;
    std::memcpy(&b, bytes.data() + i * element_size(dtype), element_size(dtype));
    return b;
  }
  void set_value(std::size_t i, double x) { set_bits(i, round_to_bits(dtype, x)); }
  double value(std::size_t i) const {
    return to_double(dtype, bytes.data() + i * element_size(dtype));
  }
  TensorView view() const { return TensorView{dtype, {size()}, bytes.data()}; }
};

struct Case {
  std::string what;
  Raw test, ref, truth;
};

// A float64 truth near the test values (NaN where the test is NaN, so it stays finite
// elsewhere), and now and then exactly the test value or its negation, so that equal and
// equal-magnitude pairs reach the error-balance counts.
Raw truth_for(const Raw& test, std::mt19937_64& rng) {
  Raw u(DType::F64, test.size());
  std::normal_distribution<double> noise;
  for (std::size_t i = 0; i < test.size(); ++i) {
    const double t = test.value(i);
    const double near = std::isfinite(t) ? t * (1 + 1e-3 * noise(rng)) + 1e-6 * noise(rng) : t;
    switch (rng() % 8) {
      case 0:
        u.set_value(i, t);
        break;
      case 1:
        u.set_value(i, -t);
        break;
      default:
        u.set_value(i, near);
    }
  }
  return u;
}

// Every bit pattern of an 8- or 16-bit dtype as the test, against refs that are the same
// pattern, its neighbours, a sign flip, and an unrelated pattern.
std::vector<Case> every_pattern_cases(DType dt) {
  std::mt19937_64 rng(11);
  const std::uint64_t count = std::uint64_t{1} << bits(dt);
  const std::uint64_t sign = count >> 1;
  std::vector<Case> cases;
  const auto add = [&](const std::string& what, auto ref_bits) {
    Raw t(dt, count), r(dt, count);
    for (std::uint64_t p = 0; p < count; ++p) {
      t.set_bits(p, p);
      r.set_bits(p, ref_bits(p) & (count - 1));
    }
    Raw u = truth_for(t, rng);
    cases.push_back({std::string(name(dt)) + " " + what, std::move(t), std::move(r), std::move(u)});
  };
  add("equal", [](std::uint64_t p) { return p; });
  add("next", [](std::uint64_t p) { return p + 1; });
  add("three down", [](std::uint64_t p) { return p - 3; });
  add("sign flipped", [sign](std::uint64_t p) { return p ^ sign; });
  add("unrelated", [&rng](std::uint64_t) { return rng(); });
  return cases;
}

// Random values of one dtype with every kind of pair mixed in: equal, a few ULP apart, on
// the allclose boundary, far apart, NaN/Inf on either side, and ties of the maxima.
Case mixed_case(DType dt, std::size_t n, double tol, unsigned seed, bool specials = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> kind(0, 9);
  Raw t(dt, n), r(dt, n);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 0; i < n; ++i) {
    const double x = normal(rng) * std::exp2(std::uniform_int_distribution<int>(-8, 8)(rng));
    t.set_value(i, x);
    const double tv = t.value(i);
    switch (kind(rng)) {
      case 0:  // equal
        r.set_bits(i, t.get_bits(i));
        break;
      case 1:  // a few ULP apart (bit patterns, so also across zero)
        r.set_bits(i, t.get_bits(i) + std::uniform_int_distribution<int>(-3, 3)(rng));
        break;
      case 2: {  // near the boundary |ref - test| = tol + tol * |test|, by 2^-3 to 2^-40
        const double allowed = tol + tol * std::fabs(tv);
        const double off = std::exp2(-std::uniform_real_distribution<double>(3, 40)(rng));
        r.set_value(i, tv + (rng() & 1 ? 1 : -1) * allowed * (1 + (rng() & 1 ? off : -off)));
        break;
      }
      case 3:  // NaN or Inf on one side or both
        if (is_floating(dt) && specials) {
          const double specials[] = {nan, inf, -inf};
          r.set_value(i, specials[rng() % 3]);
          if (rng() & 1) t.set_value(i, specials[rng() % 3]);
        } else {
          r.set_value(i, 0);
        }
        break;
      case 4:  // a tie of max |test - ref|: the same difference at many places
        r.set_value(i, tv + 0.5);
        break;
      default:
        r.set_value(i, tv + 1e-2 * normal(rng));
    }
  }
  Raw u = truth_for(t, rng);
  return {std::string(name(dt)) + (specials ? " mixed" : " finite") + " n=" + std::to_string(n),
          std::move(t), std::move(r), std::move(u)};
}

// The summation-order bound of metrics.hpp for one sum: each path is within
// gamma(256) * sum|x_i| + 2u|S| of the exact sum, so they agree within twice that.
void expect_sums_agree(double simd, double scalar, long double abs_sum, const std::string& what) {
  if (std::isnan(scalar) || std::isinf(scalar)) {
    EXPECT_TRUE((std::isnan(simd) && std::isnan(scalar)) || simd == scalar)
        << what << ": " << simd << " vs " << scalar;
    return;
  }
  const double u = std::ldexp(1.0, -53);
  const double gamma = 256 * u / (1 - 256 * u);
  const double bound = 2 * (gamma * static_cast<double>(abs_sum) + 2 * u * std::fabs(scalar));
  EXPECT_LE(std::fabs(simd - scalar), bound) << what << ": " << simd << " vs " << scalar;
}

// Sums of the absolute terms of each float64 sum over [begin, end), for the bound.
struct AbsSums {
  long double sq_err_test = 0, sq_err_ref = 0, sq_truth = 0, sq_test = 0, dot = 0, err = 0;
};

AbsSums abs_sums(const Case& c, std::uint64_t begin, std::uint64_t end) {
  AbsSums a;
  for (std::uint64_t i = begin; i < end; ++i) {
    const long double t = c.test.value(i), r = c.ref.value(i), u = c.truth.value(i);
    a.sq_err_test += (t - u) * (t - u);
    a.sq_err_ref += (r - u) * (r - u);
    a.sq_truth += u * u;
    a.sq_test += t * t;
    a.dot += std::fabs(t * u);
    a.err += std::fabs(t - u);
  }
  return a;
}

void expect_partials_agree(const Partial& simd, const Partial& scalar, const AbsSums& abs,
                           const std::string& at) {
  // Every count, maximum, index and bin is identical, field by field.
#define EXPECT_SAME(field) EXPECT_EQ(simd.field, scalar.field) << at << " " #field
  EXPECT_SAME(n);
  EXPECT_SAME(max_abs_ref);
  EXPECT_SAME(max_abs_ref_index);
  EXPECT_SAME(max_abs_truth);
  EXPECT_SAME(max_abs_truth_index);
  EXPECT_SAME(max_abs_ref_truth);
  EXPECT_SAME(not_close);
  EXPECT_SAME(bits_differ);
  EXPECT_SAME(values_differ);
  EXPECT_SAME(ulp.max);
  EXPECT_SAME(ulp.max_index);
  EXPECT_SAME(ulp.any_inf);
  EXPECT_SAME(ulp.hist);
  EXPECT_SAME(test_differs);
  EXPECT_SAME(test_over);
  EXPECT_SAME(test_under);
  EXPECT_SAME(ref_differs);
  EXPECT_SAME(ref_over);
  EXPECT_SAME(ref_under);
  EXPECT_SAME(nf_test.nan);
  EXPECT_SAME(nf_test.inf);
  EXPECT_SAME(nf_ref.nan);
  EXPECT_SAME(nf_ref.inf);
  EXPECT_SAME(nf_truth.nan);
  EXPECT_SAME(nf_truth.inf);
#undef EXPECT_SAME
  expect_sums_agree(simd.sq_err_test.value(), scalar.sq_err_test.value(), abs.sq_err_test,
                    at + " sq_err_test");
  expect_sums_agree(simd.sq_err_ref.value(), scalar.sq_err_ref.value(), abs.sq_err_ref,
                    at + " sq_err_ref");
  expect_sums_agree(simd.sq_truth.value(), scalar.sq_truth.value(), abs.sq_truth, at + " sq_truth");
  expect_sums_agree(simd.sq_test.value(), scalar.sq_test.value(), abs.sq_test, at + " sq_test");
  expect_sums_agree(simd.test_dot_truth.value(), scalar.test_dot_truth.value(), abs.dot,
                    at + " dot");
  expect_sums_agree(simd.err_sum.value(), scalar.err_sum.value(), abs.err, at + " err_sum");
}

// Compares the two paths on [begin, end) for every tail length near a block boundary, on
// every SIMD target, both equal_nan settings, with and without a truth.
void check_case(const Case& c, double tol) {
  const TensorView t = c.test.view(), r = c.ref.view(), u = c.truth.view();
  const std::uint64_t n = t.numel();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {{0, n}};
  for (std::uint64_t len : {0, 1, 2, 3, 5, 7, 8, 9, 15, 17, 255, 257, 511, 513}) {
    if (len <= n) ranges.push_back({n - len, n});  // tails short of a vector or block
  }
  if (n > 3) ranges.push_back({1, n - 2});  // a start that is not vector aligned
  const std::vector<std::string> targets = detail::usable_simd_targets();
  ASSERT_FALSE(targets.empty());
  for (auto [begin, end] : ranges) {
    const AbsSums abs = abs_sums(c, begin, end);
    for (const std::string& target_name : targets) {
      detail::choose_simd_target(target_name);
      ASSERT_EQ(simd_target(), target_name) << "the dispatch did not follow the target";
      for (bool equal_nan : {false, true}) {
        const MetricOptions opt{.tol = tol, .equal_nan = equal_nan};
        for (const TensorView* truth : {&u, static_cast<const TensorView*>(nullptr)}) {
          const MetricsInput in{&t, &r, truth};
          const Partial simd = detail::accumulate_simd(in, opt, begin, end);
          const Partial scalar = detail::accumulate_scalar(in, opt, begin, end);
          const std::string at = target_name + (equal_nan ? " equal_nan " : " ") + c.what +
                                 (truth ? "" : " no truth") + " [" + std::to_string(begin) + ", " +
                                 std::to_string(end) + ")";
          if (truth != nullptr) {
            expect_partials_agree(simd, scalar, abs, at);
          } else {
            EXPECT_EQ(simd.not_close, scalar.not_close) << at;
            EXPECT_EQ(simd.ulp.hist, scalar.ulp.hist) << at;
            EXPECT_EQ(simd.max_abs_ref_index, scalar.max_abs_ref_index) << at;
          }
        }
      }
      if (::testing::Test::HasFailure()) break;  // one case's report, not thousands
    }
    detail::choose_simd_target("");
    if (::testing::Test::HasFailure()) return;
  }
}

// Our dispatch reads CPUID itself (to keep libhwy.so out of every process): it must find
// exactly the targets Highway's own detection finds on this machine.
TEST(MetricsSimdTest, UsableTargetsAreThoseHighwayDetects) {
  std::vector<std::string> highway;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    highway.push_back(hwy::TargetName(target));
  }
  EXPECT_EQ(detail::usable_simd_targets(), highway);
  EXPECT_EQ(simd_target(), highway.front());
  EXPECT_THROW(detail::choose_simd_target("NO_SUCH_TARGET"), std::invalid_argument);
  EXPECT_EQ(simd_target(), highway.front()) << "a failed choice left the dispatch as it was";
}

TEST(MetricsSimdTest, EveryPatternOfTheSmallFormatsAgreesWithScalar) {
  for (DType dt : {DType::BF16, DType::F16, DType::F8_E4M3, DType::F8_E5M2, DType::F8_E4M3FNUZ,
                   DType::F8_E5M2FNUZ, DType::F8_E8M0, DType::U8, DType::I8}) {
    for (const Case& c : every_pattern_cases(dt)) check_case(c, 1e-2);
  }
}

TEST(MetricsSimdTest, MixedValuesOfEveryDtypeAgreeWithScalar) {
  for (int k = 0; k < kDTypeCount; ++k) {
    const DType dt = static_cast<DType>(k);
    if (!is_judgeable(dt)) continue;
    // Without NaN/Inf most blocks stay on the SIMD fast path; with them, on the redo.
    for (bool specials : {true, false}) {
      for (double tol : {1e-4, 1e-2}) {
        for (std::size_t n : {0, 1, 7, 64, 1000, 4099})
          check_case(mixed_case(dt, n, tol, 5 + n, specials), tol);
      }
    }
  }
}

// Tensors at odd addresses (a header of odd length puts a whole file's data there): both
// paths read them element by element or with unaligned loads, and find what they find at
// aligned ones. The sanitizer build (make test-sanitize) fails on any misaligned access.
TEST(MetricsSimdTest, DataAtOddAddressesGivesTheSameMetrics) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64, DType::F8_E4M3}) {
    const Case c = mixed_case(dt, 1003, 1e-3, 11, false);
    auto shifted = [](const Raw& raw, std::vector<std::byte>& storage) {
      storage.assign(raw.bytes.size() + 1, std::byte{0});
      std::memcpy(storage.data() + 1, raw.bytes.data(), raw.bytes.size());
      return TensorView{raw.dtype, {raw.size()}, storage.data() + 1};
    };
    std::vector<std::byte> ts, rs, us;
    const TensorView t = shifted(c.test, ts), r = shifted(c.ref, rs), u = shifted(c.truth, us);
    const TensorView ta = c.test.view(), ra = c.ref.view(), ua = c.truth.view();
    const MetricOptions opt{.tol = 1e-3};
    for (const std::string& target_name : detail::usable_simd_targets()) {
      detail::choose_simd_target(target_name);
      const MetricsInput odd{&t, &r, &u}, aligned{&ta, &ra, &ua};
      const Partial simd = detail::accumulate_simd(odd, opt, 0, t.numel());
      const Partial simd_aligned = detail::accumulate_simd(aligned, opt, 0, t.numel());
      const Partial scalar = detail::accumulate_scalar(odd, opt, 0, t.numel());
      const std::string at = target_name + " " + c.what;
      EXPECT_EQ(simd.ulp.hist, simd_aligned.ulp.hist) << at;
      EXPECT_EQ(simd.not_close, simd_aligned.not_close) << at;
      const double odd_sum = simd.sq_err_test.value(), sum = simd_aligned.sq_err_test.value();
      EXPECT_TRUE(odd_sum == sum || (std::isnan(odd_sum) && std::isnan(sum))) << at;
      expect_partials_agree(simd, scalar, abs_sums(c, 0, t.numel()), at);
    }
    detail::choose_simd_target("");
  }
}

// Ties everywhere: the maxima's first index must win in every lane layout.
TEST(MetricsSimdTest, TiesKeepTheFirstIndex) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    Raw t(dt, 1030), r(dt, 1030), u(DType::F64, 1030);
    for (std::size_t i = 0; i < t.size(); ++i) {
      t.set_value(i, i % 2 ? 1.0 : 3.0);
      r.set_value(i, i % 2 ? 1.5 : 3.0);    // |t - r| = 0.5 from index 1 on
      u.set_value(i, i % 2 ? 0.75 : 3.25);  // |t - u| = 0.25 everywhere
    }
    const Case c{std::string(name(dt)) + " ties", std::move(t), std::move(r), std::move(u)};
    check_case(c, 1e-4);
    const TensorView tv = c.test.view(), rv = c.ref.view(), uv = c.truth.view();
    const Partial p = detail::accumulate_simd({&tv, &rv, &uv}, {}, 0, tv.numel());
    EXPECT_EQ(p.max_abs_ref_index, 1u) << c.what;
    EXPECT_EQ(p.max_abs_truth_index, 0u) << c.what;
  }
}

// The public entry point routes to the kernel named in the options, and the two give the
// same metrics over many chunks and threads.
TEST(MetricsSimdTest, ComputeMetricsKernelsAgreeAcrossChunksAndThreads) {
  const Case c = mixed_case(DType::BF16, (std::size_t{3} << 20) + 77, 1e-2, 9, /*specials=*/false);
  const TensorView t = c.test.view(), r = c.ref.view(), u = c.truth.view();
  const MetricsInput in{&t, &r, &u};
  MetricOptions scalar_opt{.tol = 1e-2};
  scalar_opt.kernel = MetricKernel::scalar;
  const Metrics a = compute_metrics({&in, 1}, MetricOptions{.tol = 1e-2}, 2)[0];
  const Metrics b = compute_metrics({&in, 1}, scalar_opt, 1)[0];
  EXPECT_EQ(a.not_close, b.not_close);
  EXPECT_EQ(a.ulp.hist, b.ulp.hist);
  EXPECT_EQ(a.ulp.max_index, b.ulp.max_index);
  EXPECT_EQ(a.max_abs_truth_index, b.max_abs_truth_index);
  ASSERT_TRUE(std::isfinite(b.error));
  EXPECT_NEAR(a.error, b.error, 1e-13 * b.error);
  EXPECT_NEAR(a.baseline, b.baseline, 1e-13 * b.baseline);
}

// The error-against-magnitude profile: the same bins from both paths (with NaN/Inf blocks
// redone by the scalar path and vector tails), and each element in the bin of its |truth|.
TEST(MetricsSimdTest, MagnitudeProfileAgreesWithScalarAndBinsByExponent) {
  for (bool specials : {false, true}) {
    const Case c = mixed_case(DType::BF16, 5000 + 3, 1e-2, 4, specials);
    const TensorView t = c.test.view(), r = c.ref.view(), u = c.truth.view();
    const MetricsInput in{&t, &r, &u};
    MetricOptions opt{.tol = 1e-2};
    opt.magnitude_profile = true;
    MetricOptions scalar_opt = opt;
    scalar_opt.kernel = MetricKernel::scalar;
    for (const std::string& target : detail::usable_simd_targets()) {
      detail::choose_simd_target(target);
      const Metrics a = compute_metrics({&in, 1}, opt, 2)[0];
      const Metrics b = compute_metrics({&in, 1}, scalar_opt, 1)[0];
      ASSERT_EQ(a.magnitude.bins.size(), std::size_t{kMagnitudeBins}) << target;
      for (int k = 0; k < kMagnitudeBins; ++k) {
        EXPECT_EQ(a.magnitude.bins[k].count, b.magnitude.bins[k].count) << target << " bin " << k;
        EXPECT_NEAR(a.magnitude.bins[k].sq_err_test, b.magnitude.bins[k].sq_err_test,
                    1e-12 * b.magnitude.bins[k].sq_err_test)
            << target << " bin " << k;
        EXPECT_NEAR(a.magnitude.bins[k].sq_err_ref, b.magnitude.bins[k].sq_err_ref,
                    1e-12 * b.magnitude.bins[k].sq_err_ref)
            << target << " bin " << k;
      }
      const Metrics none = compute_metrics({&in, 1}, MetricOptions{.tol = 1e-2}, 2)[0];
      EXPECT_TRUE(none.magnitude.empty()) << "only when asked for";
    }
    detail::choose_simd_target("");
  }
  // Known values: 0 and tiny in bin 0, 3 in bin 1 + bias, 2^40 clamped to the last bin, a
  // NaN left out.
  const double t[] = {0.5, 1.0, 3.5, 0x1p40, NAN};
  const double r[] = {0.0, 0.0, 3.0, 0x1p40, 1.0};
  const double uu[] = {0.0, 1e-30, 3.0, 0x1p40, 1.0};
  MagnitudeProfile p;
  detail::add_magnitude_profile(t, r, uu, 5, p);
  EXPECT_EQ(p.bins[0].count, 2u);
  EXPECT_EQ(p.bins[1 + kMagnitudeBias].count, 1u);
  EXPECT_EQ(p.bins[kMagnitudeBins - 1].count, 1u);
  EXPECT_EQ(p.bins[1 + kMagnitudeBias].sq_err_test, 0.25);
  EXPECT_EQ(p.bins[0].sq_err_test, 0.25 + 1.0);
  std::uint64_t total = 0;
  for (const auto& bin : p.bins) total += bin.count;
  EXPECT_EQ(total, 4u);
}

}  // namespace
}  // namespace numalign
