// fused_allreduce_test.cpp: a kernel test as kernel teams write them, on numalign's checks.
// A simulated fused allreduce + residual + RMSNorm (bf16 in and out, fp32 accumulation) is
// tested against the unfused reference over m x hidden, each case tagged 1-stage or 2-stage by
// its payload, with exact, ulp:1, the default rule against a float64 truth and same()'s rule.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <numalign/gtest.hpp>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace {

using numalign::bfloat16_bits;
using numalign::check;

constexpr int kRanks = 4;
constexpr std::size_t kOneStageMaxBytes = 128 * 1024;  // larger payloads take the 2-stage path
constexpr float kEps = 1e-6f;

float to_float(bfloat16_bits b) { return std::bit_cast<float>(std::uint32_t{b.bits} << 16); }
bfloat16_bits round_bf16(float x) {  // to nearest, ties to even (finite inputs)
  const auto u = std::bit_cast<std::uint32_t>(x);
  return {static_cast<std::uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16)};
}
bfloat16_bits truncate_bf16(float x) {
  return {static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16)};
}

struct Case {
  std::size_t m, hidden;
  std::size_t payload() const { return m * hidden * sizeof(bfloat16_bits); }
  bool two_stage() const { return payload() > kOneStageMaxBytes; }
  std::string tag() const {
    return "m=" + std::to_string(m) + ",hidden=" + std::to_string(hidden) + "," +
           (two_stage() ? "2-stage" : "1-stage");
  }
};

// What gtest prints as GetParam() when a case fails.
void PrintTo(const Case& c, std::ostream* os) { *os << c.tag(); }

// One case's inputs, in bf16 as the ranks hold them.
struct Inputs {
  std::vector<std::vector<bfloat16_bits>> partial;  // per rank, m x hidden
  std::vector<bfloat16_bits> residual;              // m x hidden
  std::vector<bfloat16_bits> gamma;                 // hidden

  Inputs(const Case& c, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    const auto draw = [&](std::size_t n) {
      std::vector<bfloat16_bits> v(n);
      for (auto& x : v) x = round_bf16(normal(rng));
      return v;
    };
    for (int r = 0; r < kRanks; ++r) partial.push_back(draw(c.m * c.hidden));
    residual = draw(c.m * c.hidden);
    gamma = draw(c.hidden);
  }
};

// A kernel's two outputs: the new residual (allreduce + residual) and its RMSNorm.
template <class T>
struct Outputs {
  std::vector<T> residual, norm;
};

// The unfused reference: allreduce (fp32 sum in rank order, rounded to bf16), then residual
// add (rounded to bf16), then RMSNorm of the rounded residual.
Outputs<bfloat16_bits> unfused(const Case& c, const Inputs& in) {
  Outputs<bfloat16_bits> out;
  for (std::size_t i = 0; i < c.m * c.hidden; ++i) {
    float s = 0;
    for (int r = 0; r < kRanks; ++r) s += to_float(in.partial[r][i]);
    out.residual.push_back(round_bf16(to_float(round_bf16(s)) + to_float(in.residual[i])));
  }
  for (std::size_t row = 0; row < c.m; ++row) {
    float sq = 0;
    for (std::size_t j = 0; j < c.hidden; ++j) {
      const float x = to_float(out.residual[row * c.hidden + j]);
      sq += x * x;
    }
    const float scale = 1.0f / std::sqrt(sq / static_cast<float>(c.hidden) + kEps);
    for (std::size_t j = 0; j < c.hidden; ++j)
      out.norm.push_back(
          round_bf16(to_float(out.residual[row * c.hidden + j]) * scale * to_float(in.gamma[j])));
  }
  return out;
}

// The fused kernel: the 1-stage path sums the ranks in reverse order, the 2-stage path as a
// tree (reduce-scatter then all-gather); either adds the residual in fp32 before its one
// rounding and normalises the fp32 value. `store` rounds (or, in a broken build, truncates).
Outputs<bfloat16_bits> fused(const Case& c, const Inputs& in,
                             bfloat16_bits (*store)(float) = round_bf16) {
  Outputs<bfloat16_bits> out;
  std::vector<float> row_values(c.hidden);
  for (std::size_t row = 0; row < c.m; ++row) {
    float sq = 0;
    for (std::size_t j = 0; j < c.hidden; ++j) {
      const std::size_t i = row * c.hidden + j;
      const auto p = [&](int r) { return to_float(in.partial[r][i]); };
      const float s = c.two_stage() ? (p(0) + p(1)) + (p(2) + p(3)) : ((p(3) + p(2)) + p(1)) + p(0);
      const float x = s + to_float(in.residual[i]);
      row_values[j] = x;
      sq += x * x;
      out.residual.push_back(store(x));
    }
    const float scale = 1.0f / std::sqrt(sq / static_cast<float>(c.hidden) + kEps);
    for (std::size_t j = 0; j < c.hidden; ++j)
      out.norm.push_back(store(row_values[j] * scale * to_float(in.gamma[j])));
  }
  return out;
}

// The float64 truth from the same bf16 inputs.
Outputs<double> truth(const Case& c, const Inputs& in) {
  Outputs<double> out;
  for (std::size_t i = 0; i < c.m * c.hidden; ++i) {
    double s = to_float(in.residual[i]);
    for (int r = 0; r < kRanks; ++r) s += to_float(in.partial[r][i]);
    out.residual.push_back(s);
  }
  for (std::size_t row = 0; row < c.m; ++row) {
    double sq = 0;
    for (std::size_t j = 0; j < c.hidden; ++j)
      sq += out.residual[row * c.hidden + j] * out.residual[row * c.hidden + j];
    const double scale = 1.0 / std::sqrt(sq / static_cast<double>(c.hidden) + kEps);
    for (std::size_t j = 0; j < c.hidden; ++j)
      out.norm.push_back(out.residual[row * c.hidden + j] * scale * to_float(in.gamma[j]));
  }
  return out;
}

class FusedAllreduceTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    c_ = GetParam();
    const Inputs in(c_, 1000 * c_.m + c_.hidden);
    ref_ = unfused(c_, in);
    fused_ = fused(c_, in);
    truncating_ = fused(c_, in, truncate_bf16);
    truth_ = truth(c_, in);
  }
  // The case's parameters in the tensor's name: a failure's report names them.
  numalign::CheckOptions named(const std::string& output) const {
    return check().name(output + "[" + c_.tag() + "]").shape({c_.m, c_.hidden});
  }

  Case c_{};
  Outputs<bfloat16_bits> ref_, fused_, truncating_;
  Outputs<double> truth_;
};

// The fused kernel rounds once where the reference rounds twice: it is at least as close to
// the truth (the default rule passes it), yet not bit-exact, and where the residual cancels
// the sum the two roundings are many ULPs of the small result apart.
TEST_P(FusedAllreduceTest, FusedPassesButNotExactNorUlp1) {
  EXPECT_ALIGNED_WITH(fused_.residual, ref_.residual, truth_.residual, named("residual"));
  EXPECT_ALIGNED_WITH(fused_.norm, ref_.norm, truth_.norm, named("norm"));
  EXPECT_NONFATAL_FAILURE(
      EXPECT_MATCHES_WITH(fused_.residual, ref_.residual, named("residual").rule("exact")),
      "elements differ bitwise");
  EXPECT_NONFATAL_FAILURE(
      EXPECT_MATCHES_WITH(fused_.residual, ref_.residual, named("residual").rule("ulp:1")),
      "FAIL     residual[" + c_.tag() + "]");
}

// A build that truncates instead of rounding stays close in RMSE (same()'s rule passes it)
// but errs towards zero everywhere: the default rule fails it as biased.
TEST_P(FusedAllreduceTest, TruncatingKernelFailsAsBiased) {
  EXPECT_NONFATAL_FAILURE(
      EXPECT_ALIGNED_WITH(truncating_.residual, ref_.residual, truth_.residual, named("residual")),
      "biased in sign where ref is not");
  EXPECT_NONFATAL_FAILURE(
      EXPECT_ALIGNED_WITH(truncating_.norm, ref_.norm, truth_.norm, named("norm")),
      "biased in sign where ref is not");
  EXPECT_ALIGNED_WITH(truncating_.residual, ref_.residual, truth_.residual,
                      named("residual").rule("same"));
  EXPECT_ALIGNED_WITH(truncating_.norm, ref_.norm, truth_.norm, named("norm").rule("same"));
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (std::size_t m = 1; m <= 128; m *= 2)
    for (std::size_t hidden : {1024, 2048, 4096}) cases.push_back({m, hidden});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(MByHidden, FusedAllreduceTest, ::testing::ValuesIn(sweep()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "m" + std::to_string(c.m) + "_hidden" + std::to_string(c.hidden) +
                                  (c.two_stage() ? "_2stage" : "_1stage");
                         });

}  // namespace
