// measured_test.cpp: the measured rule at each of its boundaries (the whole tensor's RMSE, the
// worst element, the floor of ref's error, the bias floor), at every magnitude alike, and what
// it refuses to judge.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/metrics.hpp"
#include "numalign/rules.hpp"
#include "simulations.hpp"

namespace numalign {
namespace {

using examples::Buffer;
using examples::make_buffer;

struct Judged {
  Verdict verdict;
  Metrics metrics;
};

// test = truth + test_err, ref = truth + ref_err, stored as `dtype` (F64: exactly).
Judged judge_measured(const std::vector<double>& truth, const std::vector<double>& test,
                      const std::vector<double>& ref, DType dtype = DType::F64,
                      const std::string& spec = "measured") {
  const Shape shape{truth.size()};
  const Buffer u = make_buffer(DType::F64, shape, truth), t = make_buffer(dtype, shape, test),
               r = make_buffer(dtype, shape, ref);
  const TensorView tv = t.view(), rv = r.view(), uv = u.view();
  Judged j;
  j.metrics = compute_metrics(tv, rv, &uv);
  j.verdict = evaluate({parse_rule(spec), nullptr}, tv, rv, &uv, j.metrics, JudgeOptions{});
  return j;
}

// truth 1, 2, ..., n (scaled); ref off by +-d alternately; test off by k d alternately.
Judged scaled(double k, double scale, std::size_t n = 64) {
  std::vector<double> u(n), t(n), r(n);
  const double d = 0x1p-20 * scale;
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = static_cast<double>(i + 1) * scale;
    const double sign = i % 2 ? -1 : 1;
    r[i] = u[i] + sign * d;
    t[i] = u[i] + sign * k * d;
  }
  return judge_measured(u, t, r);
}

TEST(MeasuredRuleTest, ThreeTimesRefsErrorIsTheLimitAtEveryMagnitude) {
  for (const double scale : {0x1p-40, 1.0, 0x1p+40}) {
    const Judged at = scaled(3, scale);
    EXPECT_EQ(at.verdict.kind, VerdictKind::kPass) << scale << " " << at.verdict.reason;
    EXPECT_EQ(*at.verdict.ratio, 3.0);
    EXPECT_EQ(*at.verdict.limit, 3.0);
    const Judged above = scaled(3 + 0x1p-30, scale);
    EXPECT_EQ(above.verdict.kind, VerdictKind::kFail) << scale;
    EXPECT_NE(above.verdict.reason.find("RMSE vs truth above 3x ref's"), std::string::npos);
  }
  EXPECT_EQ(judge_measured({1, 2}, {1, 2.5}, {1, 2.25}, DType::F64, "measured:2").verdict.kind,
            VerdictKind::kPass);
}

TEST(MeasuredRuleTest, OneElementFarOffFailsWhatTheWholeTensorAveragesAway) {
  const std::size_t n = 4096;
  std::vector<double> u(n), t(n), r(n);
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = 1 + static_cast<double>(i % 7);
    r[i] = t[i] = u[i] + (i % 2 ? -0x1p-20 : 0x1p-20);
  }
  t[1234] = u[1234] + 10 * 0x1p-20;
  const Judged j = judge_measured(u, t, r);
  EXPECT_LT(j.metrics.error / j.metrics.baseline, 1.2);  // the RMSE rule's ratio
  EXPECT_EQ(j.verdict.kind, VerdictKind::kFail);
  EXPECT_NE(j.verdict.reason.find("worst element above 3x ref's"), std::string::npos)
      << j.verdict.reason;
  EXPECT_NE(j.verdict.reason.find("at (1234,)"), std::string::npos) << j.verdict.reason;
  EXPECT_EQ(*j.verdict.ratio, 10.0);
}

TEST(MeasuredRuleTest, AnExactReferenceIsFlooredAtHalfARoundoffOfTheTruthsRms) {
  // bf16 values 1 and 256 alternately (RMS 181): ref equals the truth, so its error is 0 and
  // the allowance is 3 x 2^-9 x 181 = 1.06. One ULP off at a 1 (2^-7) passes; one ULP off at
  // a 256 (2) does not.
  std::vector<double> u(256);
  for (std::size_t i = 0; i < u.size(); ++i) u[i] = i % 2 ? 256 : 1;
  std::vector<double> small = u, large = u;
  small[10] += 0x1p-7;
  large[11] += 2;
  const Judged pass = judge_measured(u, small, u, DType::BF16);
  EXPECT_EQ(pass.verdict.kind, VerdictKind::kPass) << pass.verdict.reason;
  EXPECT_NE(pass.verdict.reason.find("floored"), std::string::npos);
  const Judged fail = judge_measured(u, large, u, DType::BF16);
  EXPECT_EQ(fail.verdict.kind, VerdictKind::kFail) << fail.verdict.reason;
  EXPECT_NE(fail.verdict.reason.find("worst element above"), std::string::npos);
}

TEST(MeasuredRuleTest, TruncationFailsAsBiasedButNotANarrowImbalance) {
  // truth just above bf16 values: rounding goes down or up by the truth's position, truncation
  // always down
  const std::size_t n = 4096;
  std::vector<double> u(n), rounded(n), truncated(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double base = 1 + static_cast<double>(i % 128) * 0x1p-7;
    const double frac = (static_cast<double>((i * 37) % 100) + 0.5) / 100;  // in (0, 1)
    u[i] = base + frac * 0x1p-7;
    truncated[i] = base;
    rounded[i] = frac < 0.5 ? base : base + 0x1p-7;
  }
  const Judged j = judge_measured(u, truncated, rounded, DType::BF16);
  EXPECT_EQ(j.verdict.kind, VerdictKind::kFail) << j.verdict.reason;
  EXPECT_NE(j.verdict.reason.find("biased in sign where ref is not"), std::string::npos);
  EXPECT_LT(j.metrics.eb_test, -0.9);
  // The same imbalance on 1 element in 8 (EB -0.125): the bias check alone would flag it,
  // the measured rule's floor of 0.3 does not.
  std::vector<double> mild = rounded;
  for (std::size_t i = 0; i < n; i += 8) mild[i] = truncated[i];
  const Judged m = judge_measured(u, mild, rounded, DType::BF16);
  EXPECT_TRUE(bias_check_fails(m.metrics));
  EXPECT_EQ(m.verdict.kind, VerdictKind::kPass) << m.verdict.reason;
}

TEST(MeasuredRuleTest, RefusesWhatItCannotJudge) {
  const double nan = std::nan("");
  EXPECT_EQ(judge_measured({1, 2}, {1, 2}, {nan, 2}).verdict.kind, VerdictKind::kError);
  const Judged bad_test = judge_measured({1, 2}, {nan, 2}, {1, 2});
  EXPECT_EQ(bad_test.verdict.kind, VerdictKind::kFail);
  EXPECT_NE(bad_test.verdict.reason.find("test differs from ref and truth in NaN or Inf at 1 "
                                         "element (first at (0,))"),
            std::string::npos);
  const Buffer t = make_buffer(DType::F32, {2}, {1, 2});
  const TensorView tv = t.view();
  const Metrics m = compute_metrics(tv, tv, &tv);
  EXPECT_EQ(evaluate({parse_rule("measured"), nullptr}, tv, tv, &tv, m, JudgeOptions{}).kind,
            VerdictKind::kError);  // truth F32
  EXPECT_EQ(evaluate({parse_rule("measured"), nullptr}, tv, tv, nullptr, m, JudgeOptions{}).kind,
            VerdictKind::kError);  // no truth
}

TEST(MeasuredRuleTest, SpecsAndLoosening) {
  EXPECT_EQ(parse_rule("measured").spec(), "measured");
  EXPECT_EQ(parse_rule("measured:4").spec(), "measured:4");
  EXPECT_THROW(parse_rule("measured:0"), Error);
  JudgeOptions o;
  o.default_rule = parse_rule("measured:2");
  EXPECT_NO_THROW(check_override_reasons(o));
  o.default_rule = parse_rule("measured:4");
  EXPECT_THROW(check_override_reasons(o), Error);
  o.default_rule = parse_rule("measured");
  EXPECT_EQ(choose_rule("x", DType::I64, o).rule.kind, RuleKind::kExact);
}

}  // namespace
}  // namespace numalign

namespace numalign {
namespace {

// Masked attention scores and the like: -Inf, +Inf and NaN where all three runs hold them
// alike are left out, and the finite rest is judged as it would be alone.
TEST(MeasuredRuleTest, NanAndInfAlikeInAllThreeRunsAreLeftOut) {
  const double inf = INFINITY, nan = std::nan("");
  const double d = 0x1p-20;
  const std::vector<double> u{-inf, 1, 2, inf, nan, 3};
  const std::vector<double> r{-inf, 1 + d, 2 - d, inf, nan, 3 + d};
  const std::vector<double> good{-inf, 1 - d, 2 + d, inf, nan, 3 - 2 * d};
  const Judged pass = judge_measured(u, good, r);
  EXPECT_EQ(pass.verdict.kind, VerdictKind::kPass) << pass.verdict.reason;
  EXPECT_EQ(*pass.verdict.ratio, 2.0);
  EXPECT_NE(pass.verdict.reason.find("3 elements NaN or Inf alike in test, ref and truth left "
                                     "out"),
            std::string::npos)
      << pass.verdict.reason;
  // The finite rest judged as it would be alone: a worst element 4x ref's fails, and the
  // index named is the tensor's, not the finite rest's.
  std::vector<double> bad = good;
  bad[5] = 3 + 4 * d;
  const Judged fail = judge_measured(u, bad, r);
  EXPECT_EQ(fail.verdict.kind, VerdictKind::kFail) << fail.verdict.reason;
  EXPECT_NE(fail.verdict.reason.find("worst element 4x ref's at (5,)"), std::string::npos)
      << fail.verdict.reason;
  const Judged alone = judge_measured({1, 2, 3}, {1 - d, 2 + d, 3 + 4 * d}, {1 + d, 2 - d, 3 + d});
  EXPECT_EQ(*alone.verdict.ratio, *fail.verdict.ratio);
}

// Squares beyond float64's range either way: the ratios are decided on the values scaled
// near 1, as at every other magnitude (an error of 4x ref's fails, 2x passes).
TEST(MeasuredRuleTest, SquaresOutOfFloat64sRangeAreDecidedOnScaledValues) {
  for (const double scale : {1e200, 1.0, 1e-200, 1e-310}) {
    const Judged four = judge_measured({0, scale}, {4 * scale, scale}, {scale, scale});
    EXPECT_EQ(four.verdict.kind, VerdictKind::kFail) << scale << " " << four.verdict.reason;
    EXPECT_EQ(*four.verdict.ratio, 4.0) << scale;
    const Judged two = judge_measured({0, scale}, {2 * scale, scale}, {scale, scale});
    EXPECT_EQ(two.verdict.kind, VerdictKind::kPass) << scale << " " << two.verdict.reason;
    EXPECT_EQ(*two.verdict.ratio, 2.0) << scale;
  }
  // A truth whose squares overflow while the errors' do not: ref's floor is kept.
  const Judged big = judge_measured({1e300, -1e300}, {1e300, -1e300}, {1e300, -1e300});
  EXPECT_EQ(big.verdict.kind, VerdictKind::kPass) << big.verdict.reason;
}

TEST(MeasuredRuleTest, NanOrInfOfTheWrongKindFailsTestOrRefusesRef) {
  const double inf = INFINITY, nan = std::nan("");
  const std::vector<double> u{-inf, 1, 2}, r{-inf, 1, 2};
  for (const auto& test : std::vector<std::vector<double>>{
           {inf, 1, 2}, {nan, 1, 2}, {-1e30, 1, 2}, {-inf, inf, 2}, {-inf, 1, nan}}) {
    const Judged j = judge_measured(u, test, r);
    EXPECT_EQ(j.verdict.kind, VerdictKind::kFail) << j.verdict.reason;
    EXPECT_EQ(*j.verdict.ratio, INFINITY);
  }
  // ref Inf where its truth is finite (an overflow), or finite where its truth is -Inf: its
  // error there is unbounded, whatever test holds.
  for (const auto& ref :
       std::vector<std::vector<double>>{{-inf, inf, 2}, {-1e30, 1, 2}, {nan, 1, 2}}) {
    const Judged j = judge_measured(u, r, ref);
    EXPECT_EQ(j.verdict.kind, VerdictKind::kError) << j.verdict.reason;
    EXPECT_NE(j.verdict.reason.find("ref and truth differ in NaN or Inf"), std::string::npos);
  }
  const Judged all = judge_measured({-inf, nan}, {-inf, nan}, {-inf, nan});
  EXPECT_EQ(all.verdict.kind, VerdictKind::kPass) << all.verdict.reason;
  EXPECT_EQ(all.verdict.reason, "all 2 elements NaN or Inf alike in test, ref and truth");
  const Judged empty = judge_measured({}, {}, {});
  EXPECT_EQ(empty.verdict.kind, VerdictKind::kPass);
  EXPECT_EQ(empty.verdict.reason, "empty: no elements to differ");
}

}  // namespace
}  // namespace numalign
