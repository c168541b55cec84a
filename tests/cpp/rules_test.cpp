// rules_test.cpp: same()'s multiplier table branch by branch, the pass inequality at its
// boundary, rule specs, globs, overrides and the policy file.
#include "numalign/rules.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/metrics.hpp"

namespace numalign {
namespace {

TEST(MultiplierTest, EveryBranchOfSamesTable) {
  const Shape big{2000};
  EXPECT_EQ(rmse_multiplier(DType::F32, big, 1e-4, false, false), 2.0);
  EXPECT_EQ(rmse_multiplier(DType::F64, big, 1e-4, false, false), 2.0);
  EXPECT_EQ(rmse_multiplier(DType::BF16, big, 1e-4, false, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F16, big, 1e-4, false, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F8_E4M3, big, 1e-4, false, false), 3.0);
  // numel < 1000 raises fp32 to 3; exactly 1000 does not.
  EXPECT_EQ(rmse_multiplier(DType::F32, {999}, 1e-4, false, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, {1000}, 1e-4, false, false), 2.0);
  // 4-D with the last two dims 1.
  EXPECT_EQ(rmse_multiplier(DType::F32, {10, 200, 1, 1}, 1e-4, false, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, {10, 200, 1, 2}, 1e-4, false, false), 2.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, {2000, 1, 1}, 1e-4, false, false), 2.0);
  // tol >= 2e-2.
  EXPECT_EQ(rmse_multiplier(DType::F32, big, 2e-2, false, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, big, 1.9e-2, false, false), 2.0);
  // Optional tiers.
  EXPECT_EQ(rmse_multiplier(DType::F32, {10}, 1e-4, true, false), 10.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, {11}, 1e-4, true, false), 8.0);
  EXPECT_EQ(rmse_multiplier(DType::BF16, {500}, 1e-4, true, false), 8.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, {501}, 1e-4, true, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, {10}, 1e-4, false, false), 3.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, big, 1e-4, true, true), 10.0);
  EXPECT_EQ(rmse_multiplier(DType::F32, big, 1e-4, false, true), 10.0);
}

// Metrics that skip the fast path, with given RMSEs: the inequality alone decides.
Metrics rmse_metrics(double error, double baseline, std::uint64_t numel) {
  Metrics m;
  m.numel = numel;
  m.floating = true;
  m.has_truth = true;
  m.error = error;
  m.baseline = baseline;
  m.not_close = 1;
  return m;
}

// On the line the inequality is decided on the data, exactly: equality passes (error 0.5 =
// 2 x baseline 0.25 at tol 0, fp32 of 4096 elements), the next float up fails.
TEST(RmseRuleTest, PassInequalityAtItsBoundary) {
  const std::vector<double> zeros(4096, 0.0);
  const std::vector<float> ref(4096, 0.25f), at(4096, 0.5f),
      above(4096, std::nextafter(0.5f, 1.0f));
  auto view = [](const std::vector<float>& v) {
    return TensorView{DType::F32, {v.size()}, reinterpret_cast<const std::byte*>(v.data())};
  };
  const TensorView truth{DType::F64, {4096}, reinterpret_cast<const std::byte*>(zeros.data())};
  JudgeOptions o;
  o.tol = 0;
  const RuleChoice rmse{Rule{RuleKind::kSame}, nullptr};
  const MetricOptions mo{0.0, false};
  auto v = evaluate(rmse, view(at), view(ref), &truth,
                    compute_metrics(view(at), view(ref), &truth, mo), o);
  EXPECT_EQ(v.kind, VerdictKind::kPass) << v.reason;
  EXPECT_EQ(*v.ratio, 2.0);
  EXPECT_EQ(*v.limit, 2.0);
  EXPECT_NE(v.reason.find("exact arithmetic"), std::string::npos) << v.reason;
  v = evaluate(rmse, view(above), view(ref), &truth,
               compute_metrics(view(above), view(ref), &truth, mo), o);
  EXPECT_EQ(v.kind, VerdictKind::kFail);
  EXPECT_NE(v.reason.find("RMSE vs truth"), std::string::npos);
}

// Where float64 would pass: 3 x 0.0006229016948897019 + 1e-3 / 10 rounds up to the error
// 0.0019687050846691058 (same() passes it), which is 4.3e-20 above the exact bound.
TEST(RmseRuleTest, TheLineIsDecidedInExactArithmetic) {
  const double truth_v[1] = {0.0}, ref_v[1] = {-0.0006229016948897019};
  const double test_v[2][1] = {{0.0019687050846691058}, {0.0019687050846691053}};
  const TensorView truth{DType::F64, {1}, reinterpret_cast<const std::byte*>(truth_v)};
  const TensorView ref{DType::F64, {1}, reinterpret_cast<const std::byte*>(ref_v)};
  JudgeOptions o;
  o.tol = 1e-3;
  const MetricOptions mo{o.tol, false};
  for (int k = 0; k < 2; ++k) {
    const TensorView test{DType::F64, {1}, reinterpret_cast<const std::byte*>(test_v[k])};
    const Metrics m = compute_metrics(test, ref, &truth, mo);
    ASSERT_EQ(m.not_close, 1u);
    ASSERT_TRUE(m.error <= 3.0 * m.baseline + o.tol / 10.0);  // float64 would pass both
    const auto v = evaluate({Rule{RuleKind::kSame}, nullptr}, test, ref, &truth, m, o);
    EXPECT_EQ(v.kind, k == 0 ? VerdictKind::kFail : VerdictKind::kPass) << v.reason;
  }
}

// Squares past float64's range: same() gets inf for both RMSEs and passes (inf <= inf);
// exactly, an error of 4e200 is above 3 x 1e200, and one of 2e200 is below.
TEST(RmseRuleTest, OverflowingSquaresAreDecidedExactly) {
  const double truth_v[1] = {0.0}, ref_v[1] = {1e200}, test_v[2][1] = {{4e200}, {2e200}};
  const TensorView truth{DType::F64, {1}, reinterpret_cast<const std::byte*>(truth_v)};
  const TensorView ref{DType::F64, {1}, reinterpret_cast<const std::byte*>(ref_v)};
  const JudgeOptions o;
  for (int k = 0; k < 2; ++k) {
    const TensorView test{DType::F64, {1}, reinterpret_cast<const std::byte*>(test_v[k])};
    const Metrics m = compute_metrics(test, ref, &truth, MetricOptions{o.tol, false});
    ASSERT_TRUE(std::isinf(m.error) && std::isinf(m.baseline));
    const auto v = evaluate({Rule{RuleKind::kSame}, nullptr}, test, ref, &truth, m, o);
    EXPECT_EQ(v.kind, k == 0 ? VerdictKind::kFail : VerdictKind::kPass) << v.reason;
    EXPECT_NE(v.reason.find("overflows"), std::string::npos) << v.reason;
  }
}

TEST(RmseRuleTest, FastPathNeedsNoTruth) {
  const TensorView test{DType::F32, {8}, nullptr};
  Metrics m;
  m.numel = 8;
  m.floating = true;
  const auto v = evaluate({Rule{RuleKind::kSame}, nullptr}, test, test, nullptr, m, JudgeOptions{});
  EXPECT_EQ(v.kind, VerdictKind::kPass);
  EXPECT_NE(v.reason.find("allclose"), std::string::npos);
}

TEST(RmseRuleTest, TruthMustBeFloat64) {
  const TensorView test{DType::BF16, {8}, nullptr}, truth{DType::F32, {8}, nullptr};
  const auto v = evaluate({Rule{RuleKind::kSame}, nullptr}, test, test, &truth,
                          rmse_metrics(1, 1, 8), JudgeOptions{});
  EXPECT_EQ(v.kind, VerdictKind::kError);
  EXPECT_NE(v.reason.find("not F64"), std::string::npos);
  const auto none = evaluate({Rule{RuleKind::kSame}, nullptr}, test, test, nullptr,
                             rmse_metrics(1, 1, 8), JudgeOptions{});
  EXPECT_EQ(none.kind, VerdictKind::kError);
}

TEST(RmseRuleTest, NanErrorsPassOnlyWithEqualNan) {
  const TensorView test{DType::F32, {4096}, nullptr}, truth{DType::F64, {4096}, nullptr};
  JudgeOptions o;
  const auto m = rmse_metrics(NAN, NAN, 4096);
  EXPECT_EQ(evaluate({Rule{RuleKind::kSame}, nullptr}, test, test, &truth, m, o).kind,
            VerdictKind::kFail);
  o.equal_nan = true;
  EXPECT_EQ(evaluate({Rule{RuleKind::kSame}, nullptr}, test, test, &truth, m, o).kind,
            VerdictKind::kPass);
}

TEST(RuleSpecTest, ParsesAndPrintsEveryKind) {
  EXPECT_EQ(Rule{}.spec(), "measured");  // the default
  EXPECT_EQ(parse_rule("same").spec(), "same");
  EXPECT_EQ(parse_rule("same:5").spec(), "same:5");
  // same's former name, in older policy files and scripts, reads as same.
  EXPECT_EQ(parse_rule("rmse").spec(), "same");
  EXPECT_EQ(parse_rule("rmse:5").spec(), "same:5");
  EXPECT_EQ(parse_rule("ulp:1").kind, RuleKind::kUlp);
  EXPECT_EQ(parse_rule("ulp:4").param, 4);
  EXPECT_EQ(parse_rule("exact").kind, RuleKind::kExact);
  EXPECT_EQ(parse_rule("abs:0.13").param, 0.13);
  EXPECT_EQ(parse_rule("abs:0.13").spec(), "abs:0.13");
  for (const char* bad : {"", "same:", "same:0", "rmse:", "rmse:0", "samex", "ulp", "ulp:1.5",
                          "ulp:-1", "abs:x", "exact:1", "close"}) {
    EXPECT_THROW(parse_rule(bad), Error) << bad;
  }
  try {
    parse_rule("ulp:x", "policy.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "policy.json");
    EXPECT_NE(e.problem().find("'x' is not a non-negative number"), std::string::npos);
  }
}

TEST(OverrideTest, TheSelectorChoosesAsTheLastMatchingOverride) {
  JudgeOptions o;
  std::mt19937 rng(3);
  const std::vector<std::string> parts = {"layers.", "1",    "2",   ".",   "*",
                                          "?",       "attn", "mlp", "grad"};
  for (int i = 0; i < 300; ++i) {
    std::string g;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 5); k < n; ++k)
      g += parts[rng() % parts.size()];
    o.overrides.push_back({g, parse_rule(i % 2 ? "ulp:1" : "exact"), "", "--rule"});
  }
  const RuleSelector selector(o);
  for (int i = 0; i < 3000; ++i) {
    std::string name;
    for (int k = 0, n = static_cast<int>(rng() % 7); k < n; ++k) {
      const std::string& p = parts[rng() % parts.size()];
      name += (p == "*" || p == "?") ? "x" : p;
    }
    RuleChoice want{o.default_rule, nullptr};
    for (const auto& ov : o.overrides)
      if (glob_match(ov.glob, name)) want = {ov.rule, &ov};
    const RuleChoice got = selector.choose(name, DType::BF16);
    ASSERT_EQ(got.override, want.override) << name;
    ASSERT_EQ(got.rule.kind, want.rule.kind) << name;
  }
}

TEST(OverrideTest, LastMatchWinsAndIntegersAreExact) {
  JudgeOptions o;
  o.overrides.push_back({"*.grad", parse_rule("ulp:1"), "", "--rule"});
  o.overrides.push_back({"dec.*.grad", parse_rule("exact"), "", "--rule"});
  EXPECT_EQ(choose_rule("enc.grad", DType::BF16, o).rule.kind, RuleKind::kUlp);
  EXPECT_EQ(choose_rule("dec.0.grad", DType::BF16, o).rule.kind, RuleKind::kExact);
  EXPECT_EQ(choose_rule("out", DType::BF16, o).rule.kind, RuleKind::kMeasured);
  EXPECT_EQ(choose_rule("out", DType::I64, o).rule.kind, RuleKind::kExact);
}

TEST(OverrideTest, LooseningNeedsAReason) {
  JudgeOptions o;
  o.overrides.push_back({"*", parse_rule("ulp:1"), "", "--rule"});
  EXPECT_NO_THROW(check_override_reasons(o));
  o.overrides.push_back({"attn.*", parse_rule("ulp:4"), "", "--rule"});
  EXPECT_THROW(check_override_reasons(o), Error);
  o.overrides.back().reason = "softmax kernel uses exp2 approximation, 4 ULP documented";
  EXPECT_NO_THROW(check_override_reasons(o));
  o.overrides.push_back({"x", parse_rule("rmse:9"), "", "p.json"});
  EXPECT_THROW(check_override_reasons(o), Error);
}

TEST(OverrideTest, RaisingTheMultiplierPerTensorNeedsAReason) {
  JudgeOptions o;
  o.overrides.push_back({"*", parse_rule("rmse:3"), "", "--rule"});
  const Override& ov = o.overrides.back();
  const TensorView big{DType::F32, {4096}, nullptr}, truth{DType::F64, {4096}, nullptr};
  // fp32 at 4096 elements defaults to 2: an unexplained 3 is refused.
  auto v = evaluate({ov.rule, &ov}, big, big, &truth, rmse_metrics(0.1, 0.1, 4096), o);
  EXPECT_EQ(v.kind, VerdictKind::kError);
  EXPECT_NE(v.reason.find("without a reason"), std::string::npos);
  const TensorView half{DType::BF16, {4096}, nullptr};
  v = evaluate({ov.rule, &ov}, half, half, &truth, rmse_metrics(0.1, 0.1, 4096), o);
  EXPECT_EQ(v.kind, VerdictKind::kPass);  // bf16's default is already 3
}

TEST(PolicyTest, ReadsOverridesWithReasons) {
  JudgeOptions o;
  parse_policy(R"({"default": "rmse", "tol": 0.001, "check_bias": true,
    "overrides": [{"match": "decoder.*.grad", "rule": "ulp:2", "reason": "atomics reorder the sum"}]})",
               "p.json", o);
  EXPECT_EQ(o.tol, 0.001);
  EXPECT_TRUE(o.check_bias);
  ASSERT_EQ(o.overrides.size(), 1u);
  EXPECT_EQ(o.overrides[0].reason, "atomics reorder the sum");
  EXPECT_EQ(o.overrides[0].origin, "p.json");
  EXPECT_NO_THROW(check_override_reasons(o));
}

TEST(PolicyTest, RejectsBadPoliciesByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"[1]", "must be a JSON object"},
      {"{", "not valid JSON"},
      {R"({"tol": "x"})", "\"tol\" must be"},
      {R"({"overrides": [{"rule": "exact"}]})", "needs \"match\" and \"rule\""},
      {R"({"overrides": [{"match": "*", "rule": "exact", "why": "x"}]})", "unknown field \"why\""},
      {R"({"overides": []})", "unknown policy field \"overides\""},
  };
  for (const auto& [json, message] : cases) {
    JudgeOptions o;
    try {
      parse_policy(json, "p.json", o);
      ADD_FAILURE() << json;
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "p.json");
      EXPECT_NE(e.problem().find(message), std::string::npos) << e.what();
    }
  }
  JudgeOptions o;
  parse_policy(R"({"overrides": [{"match": "*", "rule": "ulp:8", "reason": "   "}]})", "p.json", o);
  EXPECT_THROW(check_override_reasons(o), Error);  // a blank reason is no reason
}

TEST(BiasCheckTest, ThresholdsOfDesignSection3) {
  Metrics m;
  m.has_truth = true;
  m.test_differs_truth = 400;  // noise floor 4 / 20 = 0.2
  m.eb_ref = 0.0;
  m.eb_test = 0.19;
  EXPECT_FALSE(bias_check_fails(m));
  m.eb_test = -0.21;
  EXPECT_TRUE(bias_check_fails(m));
  m.eb_ref = 0.1;  // 2 * 0.1 + 0.05 = 0.25
  EXPECT_FALSE(bias_check_fails(m));
  m.eb_test = 0.26;
  EXPECT_TRUE(bias_check_fails(m));
}

}  // namespace
}  // namespace numalign
