// integers_test.cpp: integers of every width are compared exactly by every rule and metric,
// never through double (2^53 + 1 and 2^53 are one double; so are 2^64 - 1 and 2^64 - 1000).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "numalign/judge.hpp"
#include "tensor_store.hpp"

namespace numalign {
namespace {

using testing::TensorStore;

template <typename T>
TensorResult judged(DType dt, T test, T ref, const char* rule) {
  TensorStore store;
  JudgeOptions o;  // the rule for every tensor, with a reason (ulp:K > 1 loosens the default)
  o.overrides.push_back({"*", parse_rule(rule), "a bound under test", "test"});
  const Report r = judge_tensors(
      {{"x", store.view(dt, std::vector<T>{test}), store.view(dt, std::vector<T>{ref}), nullptr}},
      o);
  return r.tensors.at(0);
}

constexpr std::int64_t kTwo53 = std::int64_t{1} << 53;
constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kMaxU64 = std::numeric_limits<std::uint64_t>::max();

TEST(IntegerTest, NeighboursBeyondDoublePrecisionFailEveryStrictRule) {
  for (const char* rule : {"ulp:0", "abs:0", "exact", "rmse"}) {
    EXPECT_EQ(judged<std::int64_t>(DType::I64, kTwo53 + 1, kTwo53, rule).verdict,
              VerdictKind::kFail)
        << rule;
    EXPECT_EQ(judged<std::int64_t>(DType::I64, kTwo53 - 1, kTwo53, rule).verdict,
              VerdictKind::kFail)
        << rule;
    EXPECT_EQ(judged<std::int64_t>(DType::I64, kMax64 - 1, kMax64, rule).verdict,
              VerdictKind::kFail)
        << rule;
    EXPECT_EQ(judged<std::uint64_t>(DType::U64, kMaxU64, kMaxU64 - 999, rule).verdict,
              VerdictKind::kFail)
        << rule;
    EXPECT_EQ(judged<std::int64_t>(DType::I64, kMin64 + 1, kMin64, rule).verdict,
              VerdictKind::kFail)
        << rule;
  }
  EXPECT_EQ(judged<std::int64_t>(DType::I64, kMin64, kMin64, "ulp:0").verdict, VerdictKind::kPass);
}

TEST(IntegerTest, DistancesAreExactUpToTheFullRange) {
  // ulp:K of integers is |test - ref| in units of 1, exact to 2^64 - 1.
  EXPECT_EQ(judged<std::uint64_t>(DType::U64, kMaxU64, kMaxU64 - 999, "ulp:998").verdict,
            VerdictKind::kFail);
  EXPECT_EQ(judged<std::uint64_t>(DType::U64, kMaxU64, kMaxU64 - 999, "ulp:999").verdict,
            VerdictKind::kPass);
  EXPECT_EQ(judged<std::int64_t>(DType::I64, kTwo53 + 1, kTwo53, "ulp:1").verdict,
            VerdictKind::kPass);
  EXPECT_EQ(judged<std::int64_t>(DType::I64, kTwo53 + 1, kTwo53, "abs:1").verdict,
            VerdictKind::kPass);
  EXPECT_EQ(judged<std::int64_t>(DType::I64, kTwo53 + 1, kTwo53, "abs:0.5").verdict,
            VerdictKind::kFail);
  const TensorResult widest = judged<std::int64_t>(DType::I64, kMax64, kMin64, "ulp:0");
  ASSERT_TRUE(widest.metrics.has_value());
  EXPECT_EQ(widest.metrics->ulp.max, kMaxU64) << "INT64_MAX - INT64_MIN = 2^64 - 1";
  EXPECT_EQ(widest.metrics->values_differ, 1u);
  EXPECT_EQ(judged<std::int64_t>(DType::I64, kMax64, kMin64, "abs:1.8446744073709552e19").verdict,
            VerdictKind::kPass);
  EXPECT_EQ(judged<std::int64_t>(DType::I64, kMax64, kMin64, "abs:1e19").verdict,
            VerdictKind::kFail);
  // Narrow widths too, at their extremes.
  EXPECT_EQ(judged<std::int32_t>(DType::I32, std::numeric_limits<std::int32_t>::min(),
                                 std::numeric_limits<std::int32_t>::max(), "ulp:4294967294")
                .verdict,
            VerdictKind::kFail);
  EXPECT_EQ(judged<std::int32_t>(DType::I32, std::numeric_limits<std::int32_t>::min(),
                                 std::numeric_limits<std::int32_t>::max(), "ulp:4294967295")
                .verdict,
            VerdictKind::kPass);
  EXPECT_EQ(judged<std::uint8_t>(DType::U8, 0, 255, "abs:254").verdict, VerdictKind::kFail);
}

TEST(IntegerTest, ManyElementsTakeTheSameExactPath) {
  // Long enough for the vector path: each of the 1000 elements is 2^53 + i against 2^53 + i + 1
  // at one position only.
  TensorStore store;
  std::vector<std::int64_t> ref(1000), test(1000);
  for (int i = 0; i < 1000; ++i) ref[i] = test[i] = kTwo53 + i;
  test[617] += 1;
  JudgeOptions o;
  o.default_rule = parse_rule("ulp:0");
  const Report r =
      judge_tensors({{"x", store.view(DType::I64, test), store.view(DType::I64, ref), nullptr}}, o);
  const TensorResult& t = r.tensors.at(0);
  EXPECT_EQ(t.verdict, VerdictKind::kFail);
  EXPECT_EQ(t.metrics->values_differ, 1u);
  EXPECT_EQ(t.metrics->ulp.max, 1u);
  EXPECT_EQ(t.metrics->ulp.max_index, 617u);
  EXPECT_EQ(t.metrics->max_abs_ref_index, 617u);
}

}  // namespace
}  // namespace numalign
