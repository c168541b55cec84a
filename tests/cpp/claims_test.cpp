// claims_test.cpp: the measured claims of docs/architecture.md ("The rules"), reproduced on
// simulated kernels.
#include <gtest/gtest.h>

#include <cmath>

#include "numalign/gtest.hpp"
#include "numalign/judge.hpp"
#include "simulations.hpp"

namespace numalign {
namespace {

using examples::AllreduceCase;
using examples::AllreduceVariant;
using examples::Buffer;
using examples::make_buffer;
using examples::MatmulCase;
using examples::MatmulVariant;

TensorResult judge_one(const Buffer& test, const Buffer& ref, const Buffer* truth,
                       const JudgeOptions& o = {}) {
  const TensorView t = test.view(), r = ref.view();
  const TensorView u = truth ? truth->view() : TensorView{};
  const Report report = judge_tensors({{"out", &t, &r, truth ? &u : nullptr}}, o);
  return report.tensors.at(0);
}

JudgeOptions with_rule(const char* spec) {
  JudgeOptions o;
  o.default_rule = parse_rule(spec);
  return o;
}

class MatmulClaims : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulClaims, ReorderPassesAndDroppedColumnFails) {
  const DType dtype = GetParam();
  for (std::uint64_t seed : {1, 2, 3}) {
    const MatmulCase mm(32, 256, 32, dtype, seed);  // K = 256, M x N = 1024
    const Buffer truth = mm.truth(), ref = mm.run(MatmulVariant::kReference);
    const TensorResult reordered = judge_one(mm.run(MatmulVariant::kReordered), ref, &truth);
    EXPECT_EQ(reordered.verdict, VerdictKind::kPass) << reordered.reason;
    ASSERT_TRUE(reordered.ratio);
    EXPECT_LE(*reordered.ratio, 1.5);
    const TensorResult dropped = judge_one(mm.run(MatmulVariant::kDropColumn), ref, &truth);
    EXPECT_EQ(dropped.verdict, VerdictKind::kFail);
    if (dtype == DType::BF16) {
      EXPECT_GE(*dropped.ratio, 20.0);
    } else {
      EXPECT_GT(*dropped.ratio, 1e5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp32, MatmulClaims, ::testing::Values(DType::BF16, DType::F32),
                         [](const auto& info) { return std::string(name(info.param)); });

// bf16 values `ulps` steps away from each of `values`.
Buffer shifted_bf16(const std::vector<double>& values, int ulps, std::size_t every = 1) {
  Buffer b = make_buffer(DType::BF16, {values.size()}, values);
  for (std::size_t i = 0; i < values.size(); i += every) {
    std::uint16_t bits;
    std::memcpy(&bits, b.bytes.data() + 2 * i, 2);
    bits = static_cast<std::uint16_t>(bits + ulps);  // positive values: +1 pattern = +1 ULP
    std::memcpy(b.bytes.data() + 2 * i, &bits, 2);
  }
  return b;
}

std::vector<double> positive_values(std::size_t n, double magnitude) {
  std::vector<double> v = examples::normal_values(n, 5, 0.1);
  for (auto& x : v) x = magnitude * (1.0 + std::fabs(x));
  return v;
}

TEST(UlpVersusAbsTest, ThreeUlpsAtSmallMagnitudeHideUnderAnAbsoluteBound) {
  const auto values = positive_values(2048, 0.01);
  const Buffer ref = make_buffer(DType::BF16, {values.size()}, values);
  const Buffer test = shifted_bf16(values, 3);
  EXPECT_EQ(judge_one(test, ref, nullptr, with_rule("ulp:1")).verdict, VerdictKind::kFail);
  const TensorResult abs = judge_one(test, ref, nullptr, with_rule("abs:0.13"));
  EXPECT_EQ(abs.verdict, VerdictKind::kPass);
  EXPECT_LT(*abs.ratio, 0.13);
}

TEST(UlpVersusAbsTest, OneUlpAtLargeMagnitudeIsRejectedByAnAbsoluteBound) {
  const auto values = positive_values(2048, 64.0);
  const Buffer ref = make_buffer(DType::BF16, {values.size()}, values);
  const Buffer test = shifted_bf16(values, 1);
  const TensorResult ulp = judge_one(test, ref, nullptr, with_rule("ulp:1"));
  EXPECT_EQ(ulp.verdict, VerdictKind::kPass) << ulp.reason;
  EXPECT_EQ(ulp.metrics->ulp.max, 1u);
  const TensorResult abs = judge_one(test, ref, nullptr, with_rule("abs:0.13"));
  EXPECT_EQ(abs.verdict, VerdictKind::kFail);
  EXPECT_GT(*abs.ratio, 0.13);
  EXPECT_EQ(judge_one(test, ref, nullptr, with_rule("exact")).verdict, VerdictKind::kFail);
}

TEST(UlpVersusAbsTest, TwoUlpsOnOnePercentFailUlpButPassRmse) {
  const AllreduceCase c(4, 4096, 1.0, 9);
  const Buffer truth = c.truth(), ref = c.run(AllreduceVariant::kUnfused);
  Buffer test = ref;
  for (std::size_t i = 0; i < 4096; i += 100) {  // 1% of the elements, 2 ULP further out
    std::uint16_t bits;
    std::memcpy(&bits, test.bytes.data() + 2 * i, 2);
    bits = static_cast<std::uint16_t>(bits + 2);
    std::memcpy(test.bytes.data() + 2 * i, &bits, 2);
  }
  EXPECT_EQ(judge_one(test, ref, &truth, with_rule("ulp:1")).verdict, VerdictKind::kFail);
  const TensorResult rmse = judge_one(test, ref, &truth);
  EXPECT_EQ(rmse.verdict, VerdictKind::kPass) << rmse.reason;
}

TEST(AllreduceClaimsTest, FusedIsMoreAccurateThanUnfusedAtEveryMagnitude) {
  for (double magnitude : {1.0, 16.0, 64.0, 256.0}) {
    const AllreduceCase c(4, 4096, magnitude, 21);
    const Buffer truth = c.truth(), ref = c.run(AllreduceVariant::kUnfused);
    const Buffer fused = c.run(AllreduceVariant::kFused);
    // More accurate than the reference in RMSE (same's ratio), and nowhere worse than its
    // worst element (measured's ratio, the larger of the two, is 1: both keep one rounding
    // at the element that cancels most).
    const TensorResult same = judge_one(fused, ref, &truth, with_rule("same"));
    EXPECT_EQ(same.verdict, VerdictKind::kPass) << magnitude;
    EXPECT_LT(*same.ratio, 1.0) << magnitude;
    const TensorResult measured = judge_one(fused, ref, &truth);
    EXPECT_EQ(measured.verdict, VerdictKind::kPass) << magnitude << " " << measured.reason;
    EXPECT_LE(*measured.ratio, 1.0) << magnitude;
    EXPECT_EQ(judge_one(fused, ref, &truth, with_rule("exact")).verdict, VerdictKind::kFail);
    // Where the residual cancels the sum, two roundings differ by thousands of ULPs.
    EXPECT_GT(judge_one(fused, ref, &truth, with_rule("ulp:1")).metrics->ulp.max, 1000u);
    const TensorResult abs = judge_one(fused, ref, &truth, with_rule("abs:0.13"));
    EXPECT_EQ(abs.verdict, magnitude <= 1.0 ? VerdictKind::kPass : VerdictKind::kFail) << magnitude;
  }
}

// Truncation keeps the RMSE under same()'s limit: the same rule passes it unless its bias
// check is on; the default rule (measured) fails it as biased.
TEST(AllreduceClaimsTest, TruncationFailsTheDefaultRuleAndSameOnlyWithTheBiasCheck) {
  JudgeOptions bias = with_rule("same");
  bias.check_bias = true;
  for (double magnitude : {1.0, 64.0}) {
    const AllreduceCase c(4, 4096, magnitude, 33);
    const Buffer truth = c.truth(), ref = c.run(AllreduceVariant::kUnfused);
    const Buffer truncating = c.run(AllreduceVariant::kTruncating);
    const TensorResult plain = judge_one(truncating, ref, &truth, with_rule("same"));
    EXPECT_EQ(plain.verdict, VerdictKind::kPass);
    EXPECT_LT(*plain.ratio, 3.0);
    EXPECT_LT(plain.metrics->eb_test, -0.7);
    const TensorResult measured = judge_one(truncating, ref, &truth);
    EXPECT_EQ(measured.verdict, VerdictKind::kFail);
    EXPECT_NE(measured.reason.find("biased in sign where ref is not"), std::string::npos);
    EXPECT_EQ(judge_one(truncating, ref, &truth, bias).verdict, VerdictKind::kFail);
    // A correctly rounding kernel passes the same check.
    EXPECT_EQ(judge_one(c.run(AllreduceVariant::kFused), ref, &truth, bias).verdict,
              VerdictKind::kPass);
  }
}

// One biased kernel upstream makes every tensor after it biased: the report gives the cause
// one line, with a count and the first three names (it gave a line per tensor: 71 for one
// eps change, issue 35, 8); a single tensor keeps its own line.
TEST(AllreduceClaimsTest, ManyBiasedTensorsAreOneWarningLine) {
  std::vector<Buffer> buffers;
  std::vector<TensorView> views;
  std::vector<TensorTriple> triples;
  constexpr int kTensors = 5;
  for (int i = 0; i < kTensors; ++i) {
    const AllreduceCase c(4, 4096, 1.0, 40 + i);
    buffers.push_back(c.run(AllreduceVariant::kTruncating));
    buffers.push_back(c.run(AllreduceVariant::kUnfused));
    buffers.push_back(c.truth());
  }
  views.reserve(buffers.size());
  for (const Buffer& b : buffers) views.push_back(b.view());
  for (int i = 0; i < kTensors; ++i) {
    triples.push_back(
        {"layer" + std::to_string(i), &views[3 * i], &views[3 * i + 1], &views[3 * i + 2]});
  }
  const std::string cause = "biased in sign where ref is not: --check-bias would fail it";
  const Report many = judge_tensors(triples, with_rule("same"));
  ASSERT_TRUE(many.aligned());
  ASSERT_EQ(many.warnings.size(), 1u) << many.warnings.front();
  const std::string& line = many.warnings.front();
  EXPECT_EQ(line.rfind(cause + ": 5 tensors: layer0 (error balance ", 0), 0u) << line;
  EXPECT_NE(line.find("), layer1 (error balance "), std::string::npos) << line;
  EXPECT_EQ(line.find("layer3"), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with(" and 2 more")) << line;
  triples.resize(1);
  const Report one = judge_tensors(triples, with_rule("same"));
  ASSERT_EQ(one.warnings.size(), 1u);
  EXPECT_EQ(one.warnings.front().rfind("layer0: " + cause + " (error balance ", 0), 0u)
      << one.warnings.front();
}

TEST(GtestMacrosTest, AlignedSpansPassAndMisalignedOnesPrintTheReport) {
  const MatmulCase mm(32, 128, 32, DType::F32, 4);
  const Buffer truth = mm.truth(), ref = mm.run(MatmulVariant::kReference);
  const Buffer good = mm.run(MatmulVariant::kReordered), bad = mm.run(MatmulVariant::kDropColumn);
  EXPECT_ALIGNED(good.view(), ref.view(), truth.view());
  std::vector<float> ref_f(1024), bad_f(1024);
  std::vector<double> truth_d(1024);
  std::memcpy(ref_f.data(), ref.bytes.data(), 4096);
  std::memcpy(bad_f.data(), bad.bytes.data(), 4096);
  std::memcpy(truth_d.data(), truth.bytes.data(), 8192);
  const auto result =
      gtest_detail::assert_aligned("bad_f", "ref_f", "truth_d", bad_f, ref_f, truth_d);
  EXPECT_FALSE(result);
  EXPECT_NE(std::string(result.message()).find("NOT ALIGNED"), std::string::npos);
  EXPECT_NE(std::string(result.message()).find("RMSE vs truth"), std::string::npos);
}

}  // namespace
}  // namespace numalign
