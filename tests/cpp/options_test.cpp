// options_test.cpp: arguments and policy resolved once, in one order for every front end:
// defaults < policy < arguments given; an argument not given leaves the policy's value.
#include "numalign/options.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "numalign/error.hpp"

namespace numalign {
namespace {

JudgeArguments with_policy(std::string json) {
  JudgeArguments a;
  a.policy_json = std::move(json);
  return a;
}

TEST(RuleArgumentTest, SpecOrGlobEqualsSpec) {
  const RuleArgument plain = parse_rule_argument("ulp:1");
  EXPECT_EQ(plain.glob, "");
  EXPECT_EQ(plain.spec, "ulp:1");
  const RuleArgument over = parse_rule_argument("decoder.*=abs:0.13");
  EXPECT_EQ(over.glob, "decoder.*");
  EXPECT_EQ(over.spec, "abs:0.13");
  EXPECT_THROW(parse_rule_argument("=ulp:1"), Error);
}

TEST(ResolveOptionsTest, DefaultsWhenNothingIsGiven) {
  const JudgeOptions o = resolve_options({});
  const JudgeOptions d;
  EXPECT_EQ(o.tol, d.tol);
  EXPECT_EQ(o.default_rule.spec(), "measured");
  EXPECT_FALSE(o.equal_nan || o.check_bias || o.larger_multiplier_for_small ||
               o.force_max_multiplier || o.magnitude_profile);
  EXPECT_TRUE(o.overrides.empty() && o.only.empty());
}

TEST(ResolveOptionsTest, PolicyBeatsDefaultsAndArgumentsGivenBeatThePolicy) {
  JudgeArguments a =
      with_policy(R"({"default": "ulp:1", "tol": 0.05, "check_bias": true, "equal_nan": true})");
  JudgeOptions o = resolve_options(a);
  EXPECT_EQ(o.tol, 0.05);
  EXPECT_EQ(o.default_rule.spec(), "ulp:1");
  EXPECT_TRUE(o.check_bias && o.equal_nan);
  a.tol = 1e-4;  // given: wins, even though it equals the default
  a.check_bias = false;
  a.rules.push_back(parse_rule_argument("exact"));
  o = resolve_options(a);
  EXPECT_EQ(o.tol, 1e-4);
  EXPECT_FALSE(o.check_bias);
  EXPECT_TRUE(o.equal_nan);  // not given: the policy's stays
  EXPECT_EQ(o.default_rule.spec(), "exact");
}

TEST(ResolveOptionsTest, OverridesOfArgumentsComeAfterThePolicysSoTheyWin) {
  JudgeArguments a = with_policy(
      R"({"overrides": [{"match": "attn.*", "rule": "ulp:4", "reason": "fused softmax"}]})");
  a.rules.push_back(parse_rule_argument("attn.*=exact"));
  const JudgeOptions o = resolve_options(a);
  ASSERT_EQ(o.overrides.size(), 2u);
  EXPECT_EQ(choose_rule("attn.q", DType::F32, o).rule.spec(), "exact");
  EXPECT_EQ(o.overrides[0].reason, "fused softmax");
}

TEST(ResolveOptionsTest, BadArgumentsNameWhatIsWrong) {
  JudgeArguments a;
  a.tol = -1;
  EXPECT_THROW(resolve_options(a), Error);
  a.tol = std::nan("");
  EXPECT_THROW(resolve_options(a), Error);
  JudgeArguments loose;
  loose.rules.push_back({"w.*", "ulp:8", "  "});  // a blank reason is no reason
  try {
    resolve_options(loose);
    FAIL() << "a loosening without a reason must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no reason"), std::string::npos) << e.what();
  }
  loose.rules.back().reason = "K measured on the fused kernel";
  EXPECT_NO_THROW(resolve_options(loose));
  try {
    resolve_options(with_policy("{\"tol\": \"big\"}"));
    FAIL() << "a bad policy must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "policy");
  }
}

}  // namespace
}  // namespace numalign
