// allclose_test.cpp: the allclose:ATOL,RTOL rule's pass at its boundary, with NaN and Inf,
// the figures of assert_close's message, and the rule's spec and verdict.
#include "allclose.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/metrics.hpp"
#include "numalign/rules.hpp"

namespace numalign {
namespace {

TensorView f64(const std::vector<double>& v, Shape shape = {}) {
  if (shape.empty()) shape = {v.size()};
  return TensorView{DType::F64, shape, reinterpret_cast<const std::byte*>(v.data())};
}

TEST(AllcloseTest, TheBoundIsInclusiveAndRelativeToRef) {
  const std::vector<double> ref = {100, 100, -2, 0};
  // 101 is exactly 0 + 0.01 * 100 away: within; the next double above is beyond
  const std::vector<double> test = {101, std::nextafter(101.0, 200.0), -2, 0};
  const detail::CloseStats s = detail::close_stats(f64(test), f64(ref), 0, 0.01, false);
  EXPECT_EQ(s.beyond, 1u);
  EXPECT_EQ(s.worst_index, 1u);
  EXPECT_GT(s.worst, 1.0);
  EXPECT_LT(s.worst, 1.0 + 1e-12);
  EXPECT_EQ(s.max_abs_index, 1u);
  EXPECT_DOUBLE_EQ(s.max_rel, s.max_abs / 100);
}

TEST(AllcloseTest, NanAndInfinityFollowTorchIsclose) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> ref = {nan, inf, inf, 1, -inf};
  const std::vector<double> test = {nan, inf, -inf, inf, 1};
  // NaN matches NaN only with equal_nan; equal infinities are close; any other infinity is not
  EXPECT_EQ(detail::close_stats(f64(test), f64(ref), 1e9, 1e9, false).beyond, 4u);
  const detail::CloseStats s = detail::close_stats(f64(test), f64(ref), 1e9, 1e9, true);
  EXPECT_EQ(s.beyond, 3u);
  EXPECT_TRUE(std::isinf(s.worst));
}

TEST(AllcloseTest, DefaultsAreAssertClosesPerDtype) {
  EXPECT_EQ(detail::assert_close_defaults(DType::BF16), (std::pair{1e-5, 1.6e-2}));
  EXPECT_EQ(detail::assert_close_defaults(DType::F16), (std::pair{1e-5, 1e-3}));
  EXPECT_EQ(detail::assert_close_defaults(DType::F32), (std::pair{1e-5, 1.3e-6}));
  EXPECT_EQ(detail::assert_close_defaults(DType::F64), (std::pair{1e-7, 1e-7}));
  EXPECT_EQ(detail::assert_close_defaults(DType::F8_E4M3), (std::pair{0.0, 0.0}));
}

TEST(AllcloseRuleTest, SpecsParseAndPrint) {
  EXPECT_EQ(parse_rule("allclose").spec(), "allclose");
  EXPECT_LT(parse_rule("allclose").param, 0);
  const Rule r = parse_rule("allclose:1e-05,0.016");
  EXPECT_EQ(r.kind, RuleKind::kAllclose);
  EXPECT_EQ(r.param, 1e-5);
  EXPECT_EQ(r.rtol, 0.016);
  EXPECT_EQ(parse_rule(r.spec()).rtol, 0.016);
  for (const char* bad : {"allclose:", "allclose:1", "allclose:1,", "allclose:,1", "allclose:a,1",
                          "allclose:1,-1", "allclose:1,2,3"}) {
    EXPECT_THROW(parse_rule(bad), Error) << bad;
  }
}

TEST(AllcloseRuleTest, TheVerdictSaysWhatAssertCloseSays) {
  const std::vector<double> ref = {1, 2, 3, 4, 5, 6}, test = {1, 2, 3.5, 4, 5, 6.01};
  const TensorView t = f64(test, {2, 3}), r = f64(ref, {2, 3});
  Metrics m;
  m.numel = 6;
  m.floating = true;
  const JudgeOptions o;
  const Verdict v = evaluate({parse_rule("allclose:0,0.01"), nullptr}, t, r, nullptr, m, o);
  EXPECT_EQ(v.kind, VerdictKind::kFail);
  EXPECT_EQ(v.limit, 1);
  EXPECT_DOUBLE_EQ(*v.ratio, 0.5 / 0.03);
  EXPECT_NE(v.reason.find("1 / 6 elements (16.67%) beyond |test - ref| <= 0 + 0.01 |ref|"),
            std::string::npos)
      << v.reason;
  EXPECT_NE(v.reason.find("greatest absolute difference 0.5 at (0, 2)"), std::string::npos)
      << v.reason;
  const Verdict pass = evaluate({parse_rule("allclose:0,0.2"), nullptr}, t, r, nullptr, m, o);
  EXPECT_EQ(pass.kind, VerdictKind::kPass);
  EXPECT_LE(*pass.ratio, 1);
}

TEST(AllcloseRuleTest, TolerancesBeyondAssertClosesDefaultsNeedAReason) {
  JudgeOptions o;
  o.default_rule = parse_rule("allclose:1e-05,0.016");
  EXPECT_NO_THROW(check_override_reasons(o));
  o.default_rule = parse_rule("allclose:0.01,0.01");
  EXPECT_THROW(check_override_reasons(o), Error);
  o.default_rule = parse_rule("allclose");
  o.overrides.push_back({"*", parse_rule("allclose:0.04,0.04"), "ported unchanged", "policy"});
  EXPECT_NO_THROW(check_override_reasons(o));
}

TEST(AllcloseRuleTest, IntegersAreExact) {
  JudgeOptions o;
  o.default_rule = parse_rule("allclose:10,10");
  EXPECT_EQ(choose_rule("x", DType::I32, o).rule.kind, RuleKind::kExact);
  EXPECT_EQ(choose_rule("x", DType::BF16, o).rule.kind, RuleKind::kAllclose);
}

}  // namespace
}  // namespace numalign
