// gtest_test.cpp: the GoogleTest checks of numalign/gtest.hpp, passing and failing with the
// report in their message, with every option form and element type.
#include "numalign/gtest.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "simulations.hpp"

namespace numalign {
namespace {

using examples::AllreduceCase;
using examples::AllreduceVariant;
using examples::Buffer;
using examples::MatmulCase;
using examples::MatmulVariant;

template <class T>
std::vector<T> elements(const Buffer& b) {
  std::vector<T> out(b.bytes.size() / sizeof(T));
  std::memcpy(out.data(), b.bytes.data(), b.bytes.size());
  return out;
}

// The messages of the failures `check` reports, joined (the checks return them rather than
// report them, so several substrings can be tested on one message).
template <class Check>
std::string message_of(const Check& result) {
  EXPECT_FALSE(result) << "the check was expected to fail";
  return result.message();
}

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << p << "\nin:\n" << text;
}

// bf16 bit patterns of `values`, each moved `ulps` patterns up where `every` divides its index.
std::vector<bfloat16_bits> bf16(const std::vector<double>& values, int ulps = 0,
                                std::size_t every = 1) {
  std::vector<bfloat16_bits> out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto bits = static_cast<std::uint16_t>(round_to_bits(DType::BF16, values[i]));
    if (i % every == 0) bits = static_cast<std::uint16_t>(bits + ulps);
    out.push_back({bits});
  }
  return out;
}

std::vector<double> positive(std::size_t n) {
  std::vector<double> v = examples::normal_values(n, 7, 1.0);
  for (auto& x : v) x = 1.0 + std::fabs(x);
  return v;
}

TEST(GtestChecksTest, DefaultRuleOnVectorsOfFloatAndDouble) {
  const MatmulCase mm(16, 128, 16, DType::F32, 3);
  const auto truth = elements<double>(mm.truth());
  const auto ref = elements<float>(mm.run(MatmulVariant::kReference));
  const auto good = elements<float>(mm.run(MatmulVariant::kReordered));
  const auto bad = elements<float>(mm.run(MatmulVariant::kDropColumn));
  EXPECT_ALIGNED(good, ref, truth);
  ASSERT_ALIGNED(std::span(good), std::span(ref), std::span(truth));
  EXPECT_NONFATAL_FAILURE(EXPECT_ALIGNED(bad, ref, truth), "NOT ALIGNED");
  const std::string text = message_of(gtest_detail::assert_aligned_with(
      "bad", "ref", "truth", "", bad, ref, truth, check().name("mm.out").shape({16, 16})));
  expect_contains(text,
                  {"bad is not aligned with ref (truth truth)", "FAIL     mm.out", "RMSE vs truth",
                   "rule measured", "max |test-truth|", " at (", "mm.out: max |test - ref| "});
}

TEST(GtestChecksTest, UlpRuleOnBf16WithNameAndShapeGivesTheIndex) {
  const auto values = positive(64);
  const auto ref = bf16(values);
  std::vector<bfloat16_bits> test = ref;
  test[2 * 8 + 5].bits = static_cast<std::uint16_t>(test[2 * 8 + 5].bits + 3);  // (2, 5)
  EXPECT_MATCHES_WITH(ref, ref, "ulp:1");
  EXPECT_MATCHES_WITH(bf16(values, 1), ref, "ulp:1");
  EXPECT_NONFATAL_FAILURE(
      EXPECT_MATCHES_WITH(test, ref, check().rule("ulp:1").name("out").shape({8, 8})),
      "out: max |test - ref| ");
  const std::string text = message_of(gtest_detail::assert_matches_with(
      "test", "ref", "", test, ref, check().rule("ulp:1").name("out").shape({8, 8})));
  expect_contains(text, {"test is not aligned with ref\n", "FAIL     out", "ulp:1", "max ULP 3 > 1",
                         "max ULP 3 at (2, 5)", "NOT ALIGNED: 0 of 1"});
}

TEST(GtestChecksTest, ExactAndAbsWithoutTruth) {
  const auto values = positive(256);
  const auto ref = bf16(values), off_by_one = bf16(values, 1, 16);
  EXPECT_MATCHES_WITH(ref, ref, "exact");
  EXPECT_MATCHES_WITH(off_by_one, ref, "abs:0.13");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(off_by_one, ref, "exact"),
                          "16 of 256 elements differ bitwise");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(off_by_one, ref, "abs:0.001"),
                          "max |test - ref| 0.0");
}

TEST(GtestChecksTest, DefaultAndSameWithoutTruthCannotJudge) {
  // The default rule needs the truth even for equal tensors; same's allclose fast path
  // passes those without one, and outside it (1 ULP of values 1-4 exceeds tol) needs it too.
  const auto values = positive(32);
  const auto ref = bf16(values), test = bf16(values, 1);
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(ref, ref, check()),
                          "rule measured needs a float64 truth");
  EXPECT_MATCHES_WITH(ref, ref, "same");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(test, ref, "same"),
                          "rule same needs a float64 truth");
}

TEST(GtestChecksTest, AssertFormsStopTheTest) {
  static const std::vector<float> ref = {1.0f, 2.0f, 3.0f};
  static const std::vector<float> test = {1.0f, 2.0f, 3.5f};
  static const std::vector<double> truth = {1.0, 2.0, 3.0};
  EXPECT_FATAL_FAILURE(ASSERT_MATCHES_WITH(test, ref, "exact"), "1 of 3 elements differ");
  EXPECT_FATAL_FAILURE(ASSERT_ALIGNED_WITH(test, ref, truth, "same"), "NOT ALIGNED");
  EXPECT_FATAL_FAILURE(ASSERT_ALIGNED(test, ref, truth), "NOT ALIGNED");
}

TEST(GtestChecksTest, TheDefaultAndSamesBiasCheckFailTheTruncatingKernelOnly) {
  const AllreduceCase c(4, 4096, 1.0, 11);
  const auto truth = elements<double>(c.truth());
  const auto ref = elements<bfloat16_bits>(c.run(AllreduceVariant::kUnfused));
  const auto fused = elements<bfloat16_bits>(c.run(AllreduceVariant::kFused));
  const auto truncating = elements<bfloat16_bits>(c.run(AllreduceVariant::kTruncating));
  EXPECT_ALIGNED(fused, ref, truth);
  EXPECT_NONFATAL_FAILURE(EXPECT_ALIGNED(truncating, ref, truth), "biased in sign");
  EXPECT_ALIGNED_WITH(truncating, ref, truth, "same");  // same()'s rule alone passes it
  EXPECT_ALIGNED_WITH(fused, ref, truth, check().rule("same").check_bias());
  EXPECT_NONFATAL_FAILURE(
      EXPECT_ALIGNED_WITH(truncating, ref, truth, check().rule("same").check_bias()),
      "biased: error balance");
}

TEST(GtestChecksTest, TolIsTheCoresOption) {
  const std::vector<float> ref = {1.0f, 2.0f, 3.0f}, test = {1.0f, 2.0f, 3.001f};
  const std::vector<double> truth = {1.0, 2.0, 3.0};
  EXPECT_NONFATAL_FAILURE(EXPECT_ALIGNED_WITH(test, ref, truth, "same"), "NOT ALIGNED");
  // same's allclose fast path (the measured rule has no tolerance: it fails at any tol)
  EXPECT_ALIGNED_WITH(test, ref, truth, check().rule("same").tol(1e-3));
  EXPECT_NONFATAL_FAILURE(EXPECT_ALIGNED_WITH(test, ref, truth, check().tol(1e-3)), "NOT ALIGNED");
  EXPECT_NONFATAL_FAILURE(EXPECT_ALIGNED_WITH(test, ref, truth, check().tol(-1)),
                          "tol: must be a non-negative number");
}

TEST(GtestChecksTest, Fp8AsRawBytesWithTheDtypeNamed) {
  // E4M3 patterns of 1, 2 and 4; 0x39 (1.125) and 0x3a (1.25) are one and two patterns from 1.
  const std::vector<std::uint8_t> ref = {0x38, 0x40, 0x48}, one = {0x39, 0x40, 0x48},
                                  two = {0x3a, 0x40, 0x48};
  const auto e4m3 = check().rule("ulp:1").dtype(DType::F8_E4M3);
  EXPECT_MATCHES_WITH(one, ref, e4m3);
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(two, ref, e4m3), "max ULP 2 > 1");
  const std::vector<std::byte> raw(3, std::byte{0x38});
  EXPECT_MATCHES_WITH(raw, raw, check().rule("exact").dtype(DType::F8_E5M2));
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(raw, raw, "exact"),
                          "raw bytes need their dtype named");
  // Without a dtype, uint8 is U8: two apart is 2 > 1 too, but as integers (fp8: 0.25).
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(two, ref, "ulp:1"),
                          "two: max |test - ref| 2 at (0,)");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(two, ref, e4m3),
                          "two: max |test - ref| 0.25 at (0,)");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(ref, ref, check().dtype(DType::BF16)),
                          "BF16 elements are 2 bytes, the data's 1");
}

TEST(GtestChecksTest, IntegerTypesAreExact) {
  const std::vector<std::int32_t> a = {1, 2, 3}, b = {1, 2, 4};
  const std::vector<std::int64_t> big = {1LL << 53}, big1 = {(1LL << 53) + 1};
  const std::vector<std::uint16_t> u = {7, 8};
  const std::vector<std::int8_t> s = {-1, 1};
  EXPECT_MATCHES_WITH(a, a, "exact");
  EXPECT_MATCHES_WITH(u, u, "exact");
  EXPECT_MATCHES_WITH(s, s, "exact");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(b, a, "exact"), "1 of 3 elements differ bitwise");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(big1, big, "exact"), "1 of 1 elements differ");
}

TEST(GtestChecksTest, TensorViewsKeepTheirShape) {
  const std::vector<float> ref(6, 1.0f);
  std::vector<float> test = ref;
  test[4] = 2.0f;  // (1, 1) of a 2 x 3 tensor
  const TensorView r{DType::F32, {2, 3}, reinterpret_cast<const std::byte*>(ref.data())};
  const TensorView t{DType::F32, {2, 3}, reinterpret_cast<const std::byte*>(test.data())};
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(t, r, "exact"), "at (1, 1)");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(t, r, check().rule("exact").shape({3, 2})),
                          "at (2, 0)");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(t, r, check().rule("exact").shape({4, 2})),
                          "shape: [4, 2] holds 8 elements, the data 6");
}

TEST(GtestChecksTest, BadOptionsFailNamingTheOption) {
  const std::vector<float> v = {1.0f};
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(v, v, "ulp:x"), "numalign could not check v: rule");
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(v, v, "=exact"), "empty glob before '='");
  // A loosening override needs its reason; with one, the report prints it.
  EXPECT_NONFATAL_FAILURE(EXPECT_MATCHES_WITH(v, v, check().rule("exact").rule("v*", "ulp:4", "")),
                          "reason");
  std::vector<float> w = {1.0f};
  w[0] = std::nextafter(w[0], 2.0f);
  EXPECT_MATCHES_WITH(w, v, check().rule("exact").rule("w", "ulp:4", "two roundings"));
  EXPECT_NONFATAL_FAILURE(
      EXPECT_MATCHES_WITH(w, v, check().rule("ulp:0").rule("w", "ulp:0", "none")),
      "override reason: none");
}

// The TEST_P pattern: the case's parameters in the tensor's name, so that a failure names them
// in the report (gtest adds the case's index and GetParam() to the summary line).
struct Sweep {
  std::size_t m, hidden;
};

class SweepTest : public ::testing::TestWithParam<Sweep> {
 protected:
  std::string case_name() const {
    return "out[m=" + std::to_string(GetParam().m) +
           ",hidden=" + std::to_string(GetParam().hidden) + "]";
  }
};

TEST_P(SweepTest, FailuresNameTheParameters) {
  const auto [m, hidden] = GetParam();
  const auto ref = bf16(positive(m * hidden));
  const auto test = bf16(positive(m * hidden), 2, 7);
  const auto opts = check().rule("ulp:1").name(case_name()).shape({m, hidden});
  EXPECT_MATCHES_WITH(ref, ref, opts);
  EXPECT_NONFATAL_FAILURE(
      EXPECT_MATCHES_WITH(test, ref, opts),
      "FAIL     out[m=" + std::to_string(m) + ",hidden=" + std::to_string(hidden) + "]");
}

INSTANTIATE_TEST_SUITE_P(MByHidden, SweepTest,
                         ::testing::Values(Sweep{1, 64}, Sweep{4, 128}, Sweep{16, 256}),
                         [](const auto& info) {
                           return "m" + std::to_string(info.param.m) + "_hidden" +
                                  std::to_string(info.param.hidden);
                         });

}  // namespace
}  // namespace numalign
