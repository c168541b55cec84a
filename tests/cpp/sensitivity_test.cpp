// sensitivity_test.cpp: planted bugs and which rules catch them, on the bf16 allreduce case
// (the claims of docs/architecture.md, "The rules": truncation passes same but fails the bias
// check; a 2-ULP error on 1% of the elements fails ulp:1 and passes same; a NaN fails everything).
#include "numalign/sensitivity.hpp"

#include <gtest/gtest.h>

#include "simulations.hpp"

namespace numalign {
namespace {

using examples::AllreduceCase;
using examples::AllreduceVariant;
using examples::Buffer;

class SensitivityTest : public ::testing::Test {
 protected:
  SensitivityTest()
      : case_(4, 4096, 1.0, 3),
        test_(case_.run(AllreduceVariant::kUnfused)),
        ref_(case_.run(AllreduceVariant::kUnfused)),
        truth_(case_.truth()),
        tv_(test_.view()),
        rv_(ref_.view()),
        uv_(truth_.view()) {}

  Sensitivity run(const std::string& rule, bool check_bias = false, bool with_truth = true) {
    JudgeOptions o;
    o.default_rule = parse_rule(rule);
    o.check_bias = check_bias;
    return sensitivity({{"out", &tv_, &rv_, with_truth ? &uv_ : nullptr}}, o);
  }

  static const SensitivityRow& row(const Sensitivity& s, const std::string& starts) {
    for (const auto& r : s.rows) {
      if (r.bug.rfind(starts, 0) == 0) return r;
    }
    throw std::runtime_error("no row " + starts);
  }

  AllreduceCase case_;
  Buffer test_, ref_, truth_;
  TensorView tv_, rv_, uv_;
};

TEST_F(SensitivityTest, SameMissesTruncationAndSparseUlpErrorsButNotNanOrBias) {
  const std::vector<std::byte> before = test_.bytes;
  const Sensitivity s = run("same");
  EXPECT_EQ(test_.bytes, before) << "bugs are planted in copies";
  ASSERT_EQ(s.rows.size(), 6u);
  EXPECT_FALSE(s.rows[0].caught) << "the run as it is passes";
  EXPECT_TRUE(row(s, "one element NaN").caught);
  EXPECT_TRUE(row(s, "one reduction term dropped").caught);
  EXPECT_TRUE(row(s, "2 ULP away from zero").caught);
  EXPECT_FALSE(row(s, "truncation").caught);
  EXPECT_FALSE(row(s, "2 ULP on 1%").caught);
  EXPECT_EQ(row(s, "one element NaN").planted, 1u);
  const std::string text = render_sensitivity_text(s);
  EXPECT_NE(text.find("2 planted bug(s) would pass this rule unnoticed"), std::string::npos)
      << text;
}

// The default rule sees what same()'s misses: truncation (its bias check) and 2 ULP on 1% of
// the elements (its worst element), with the run as it is still passing.
TEST_F(SensitivityTest, TheDefaultRuleCatchesEveryPlantedBug) {
  const Sensitivity s = run("measured");
  EXPECT_FALSE(s.rows[0].caught) << "the run as it is passes";
  for (std::size_t i = 1; i < s.rows.size(); ++i) EXPECT_TRUE(s.rows[i].caught) << s.rows[i].bug;
}

TEST_F(SensitivityTest, Ulp1CatchesTheSparseErrorAndTheBiasCheckCatchesTruncation) {
  const Sensitivity ulp = run("ulp:1");
  EXPECT_TRUE(row(ulp, "2 ULP on 1%").caught);
  const Sensitivity biased = run("same", /*check_bias=*/true);
  EXPECT_TRUE(row(biased, "truncation").caught);
  const Sensitivity exact = run("exact");
  for (std::size_t i = 1; i < exact.rows.size(); ++i)
    EXPECT_TRUE(exact.rows[i].caught) << exact.rows[i].bug;
}

TEST_F(SensitivityTest, TruncationNeedsATruth) {
  const Sensitivity s = run("ulp:1", false, /*with_truth=*/false);
  EXPECT_FALSE(row(s, "truncation").applicable);
  EXPECT_NE(render_sensitivity_json(s).find(R"("bug":"truncation toward zero","applicable":false)"),
            std::string::npos);
}

// On a run that already fails, only tensors that passed as they were can show a bug caught,
// and only planted tensors count as failing (no "24/15").
TEST_F(SensitivityTest, ARunThatFailsAsItIsCountsOnlyPlantedTensors) {
  const std::vector<std::int32_t> one{1, 2, 3}, other{1, 2, 4};
  const TensorView it{DType::I32, {3}, reinterpret_cast<const std::byte*>(one.data())};
  const TensorView ir{DType::I32, {3}, reinterpret_cast<const std::byte*>(other.data())};
  std::vector<double> wrong(rv_.numel(), 100.0);
  const Buffer off = examples::make_buffer(rv_.dtype, rv_.shape, wrong);
  const TensorView ov = off.view();
  JudgeOptions o;
  o.default_rule = parse_rule("same");  // passes "out" with 2 ULP on 1% (measured fails it)
  const Sensitivity s = sensitivity({{"out", &tv_, &rv_, &uv_},
                                     {"steps", &it, &ir, nullptr},
                                     {"gone", nullptr, &rv_, &uv_},
                                     {"broken", &ov, &rv_, &uv_}},
                                    o);
  EXPECT_TRUE(s.rows[0].caught) << "fails as it is";
  const SensitivityRow& nan = row(s, "one element NaN");
  EXPECT_EQ(nan.planted, 2u) << "out and broken";
  EXPECT_EQ(nan.failing, 2u) << "only planted tensors count";
  EXPECT_TRUE(nan.caught) << "out passed as it was and fails with the bug";
  EXPECT_EQ(nan.worst.rfind("out", 0), 0u) << nan.worst;
  const SensitivityRow& sparse = row(s, "2 ULP on 1%");
  EXPECT_FALSE(sparse.caught) << "broken failed already: it cannot show this bug caught";
  EXPECT_LE(sparse.failing, sparse.planted);
  const std::string text = render_sensitivity_text(s);
  EXPECT_NE(text.find("fails as it is"), std::string::npos) << text;

  // Nothing that passes as it is: no row can say caught or missed.
  const Sensitivity none = sensitivity({{"broken", &ov, &rv_, &uv_}}, o);
  for (std::size_t i = 1; i < none.rows.size(); ++i) {
    EXPECT_FALSE(none.rows[i].applicable) << none.rows[i].bug;
    EXPECT_FALSE(none.rows[i].caught);
  }
  EXPECT_NE(render_sensitivity_text(none).find("means nothing"), std::string::npos)
      << render_sensitivity_text(none);
}

}  // namespace
}  // namespace numalign
