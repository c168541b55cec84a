// consistency_test.cpp: ranks' traces against rank 0's: what counts as a difference under
// exact and ulp:K, how each difference is described, the name filter, and both renderings.
#include "numalign/consistency.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include "numalign/error.hpp"
#include "numalign/trace.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

class ConsistencyTest : public ::testing::Test {
 protected:
  // A tensor of `dtype` holding `values` (element size sizeof(T)), kept alive until written.
  template <typename T>
  NamedTensor tensor(const std::string& name, DType dtype, Shape shape,
                     const std::vector<T>& values) {
    auto& bytes = storage_.emplace_back(values.size() * sizeof(T));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return {name, {dtype, std::move(shape), bytes.data()}};
  }
  NamedTensor f32(const std::string& name, const std::vector<float>& values, Shape shape = {}) {
    if (shape.empty()) shape = {values.size()};
    return tensor(name, DType::F32, std::move(shape), values);
  }

  // Writes the next rank's trace and opens it.
  void add_rank(const std::vector<NamedTensor>& tensors) {
    const std::string path = dir_.file("rank" + std::to_string(files_.size()) + ".safetensors");
    write_trace(path, tensors);
    traces_.push_back(Trace::open(path));
    files_.push_back(path);
  }

  ConsistencyReport check(const std::string& rule, const std::vector<std::string>& only = {}) {
    std::vector<const Trace*> ranks;
    for (const Trace& t : traces_) ranks.push_back(&t);
    return check_consistent(ranks, files_, parse_rule(rule), only, /*threads=*/1);
  }

  static const TensorConsistency& find(const ConsistencyReport& r, const std::string& name) {
    for (const auto& t : r.tensors) {
      if (t.name == name) return t;
    }
    throw std::runtime_error("no tensor " + name + " in the report");
  }

  static std::vector<float> ramp(std::size_t n) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = 1.0f + static_cast<float>(i) / 4;
    return v;
  }

  testing::TempDir dir_;
  std::deque<std::vector<std::byte>> storage_;
  std::deque<Trace> traces_;
  std::vector<std::string> files_;
};

TEST_F(ConsistencyTest, IdenticalRanksAreConsistent) {
  for (int r = 0; r < 3; ++r) {
    add_rank({f32("w", ramp(8), {2, 4}), tensor<std::int32_t>("step", DType::I32, {1}, {7})});
  }
  const ConsistencyReport report = check("exact");
  EXPECT_TRUE(report.consistent());
  EXPECT_EQ(report.rule, "exact");
  EXPECT_EQ(report.files, files_);
  ASSERT_EQ(report.tensors.size(), 2u);
  for (const auto& t : report.tensors) {
    EXPECT_TRUE(t.consistent) << t.name;
    EXPECT_TRUE(t.differing.empty()) << t.name;
  }
  const std::string text = render_consistency_text(report);
  EXPECT_NE(text.find("numalign consistent: 3 ranks, rule exact\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  rank 2: " + files_[2] + "\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("DIFFER"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("CONSISTENT: 2 of 2 tensors agree (exact) across 3 ranks\n")) << text;
}

TEST_F(ConsistencyTest, ADifferingRankIsNamedWithCountFirstIndexValuesAndMaxUlp) {
  std::vector<float> changed = ramp(8);
  changed[5] = 2.0f * changed[5];  // 2.25 -> 4.5: one exponent up, 2^23 float ULPs
  changed[7] = std::nextafter(changed[7], 10.0f);
  add_rank({f32("w", ramp(8), {2, 4})});
  add_rank({f32("w", ramp(8), {2, 4})});
  add_rank({f32("w", changed, {2, 4})});
  const ConsistencyReport report = check("exact");
  EXPECT_FALSE(report.consistent());
  const TensorConsistency& t = find(report, "w");
  EXPECT_FALSE(t.consistent);
  ASSERT_EQ(t.differing.size(), 1u) << "rank 1 agrees";
  const RankDifference& d = t.differing[0];
  EXPECT_EQ(d.rank, 2u);
  EXPECT_EQ(d.problem, "");
  EXPECT_EQ(d.elements_differ, 2u);
  EXPECT_EQ(d.first_index, 5u);
  EXPECT_EQ(d.value, 4.5);
  EXPECT_EQ(d.rank0_value, 2.25);
  EXPECT_EQ(d.max_ulp, std::uint64_t{1} << 23);
  EXPECT_FALSE(d.ulp_inf);

  const std::string text = render_consistency_text(report);
  EXPECT_NE(text.find("DIFFER  w\n        rank 2: 2 element(s) differ, the first at (1, 1): 4.5 "
                      "(rank 0: 2.25); max ulp 8388608\n"),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("NOT CONSISTENT: 1 of 1 tensors differ from rank 0 on rank(s) 2\n"))
      << text;
}

TEST_F(ConsistencyTest, UlpRuleAcceptsDistancesUpToK) {
  std::vector<float> one_ulp = ramp(4), two_ulp = ramp(4);
  one_ulp[1] = std::nextafter(one_ulp[1], 10.0f);
  two_ulp[2] = std::nextafter(std::nextafter(two_ulp[2], 0.0f), 0.0f);
  add_rank({f32("a", ramp(4)), f32("b", ramp(4))});
  add_rank({f32("a", one_ulp), f32("b", two_ulp)});

  const ConsistencyReport exact = check("exact");
  EXPECT_FALSE(find(exact, "a").consistent);
  EXPECT_FALSE(find(exact, "b").consistent);

  const ConsistencyReport ulp1 = check("ulp:1");
  EXPECT_EQ(ulp1.rule, "ulp:1");
  EXPECT_TRUE(find(ulp1, "a").consistent);
  const TensorConsistency& b = find(ulp1, "b");
  EXPECT_FALSE(b.consistent);
  ASSERT_EQ(b.differing.size(), 1u);
  EXPECT_EQ(b.differing[0].max_ulp, 2u);
  EXPECT_EQ(b.differing[0].first_index, 2u);
  // Inconsistent tensors come first, whatever rank 0's order.
  EXPECT_EQ(ulp1.tensors[0].name, "b");

  EXPECT_TRUE(check("ulp:2").consistent());
}

TEST_F(ConsistencyTest, NanAgainstANumberIsOutsideEveryUlpBound) {
  std::vector<float> with_nan = ramp(4);
  with_nan[3] = std::numeric_limits<float>::quiet_NaN();
  add_rank({f32("a", ramp(4))});
  add_rank({f32("a", with_nan)});
  const ConsistencyReport report = check("ulp:1000000");
  const TensorConsistency& a = find(report, "a");
  EXPECT_FALSE(a.consistent);
  ASSERT_EQ(a.differing.size(), 1u);
  EXPECT_TRUE(a.differing[0].ulp_inf);
  EXPECT_EQ(a.differing[0].first_index, 3u);
  EXPECT_NE(render_consistency_text(report).find("max ulp inf"), std::string::npos);
}

TEST_F(ConsistencyTest, IntegersCompareByTheirDifference) {
  add_rank({tensor<std::int32_t>("step", DType::I32, {3}, {1, 5, 9})});
  add_rank({tensor<std::int32_t>("step", DType::I32, {3}, {1, 8, 9})});
  const ConsistencyReport exact = check("exact");
  const TensorConsistency& t = find(exact, "step");
  ASSERT_EQ(t.differing.size(), 1u);
  EXPECT_EQ(t.differing[0].first_index, 1u);
  EXPECT_EQ(t.differing[0].value, 8);
  EXPECT_EQ(t.differing[0].rank0_value, 5);
  EXPECT_EQ(t.differing[0].max_ulp, 3u) << "an integer's unit is 1";
  EXPECT_FALSE(check("ulp:2").consistent());
  EXPECT_TRUE(check("ulp:3").consistent());
}

// 64-bit integers differ by 1 where doubles cannot tell them apart (2^53 + 1 is no double).
TEST_F(ConsistencyTest, SixtyFourBitIntegersCompareExactly) {
  add_rank({tensor<std::int64_t>("i", DType::I64, {1}, {std::int64_t{1} << 53})});
  add_rank({tensor<std::int64_t>("i", DType::I64, {1}, {(std::int64_t{1} << 53) + 1})});
  const ConsistencyReport report = check("ulp:0");
  EXPECT_FALSE(report.consistent());
  EXPECT_EQ(find(report, "i").differing.at(0).max_ulp, 1u);
  EXPECT_TRUE(check("ulp:1").consistent());
}

TEST_F(ConsistencyTest, MissingMismatchedAndExtraTensorsAreInconsistent) {
  add_rank({f32("same", ramp(4)), f32("gone", ramp(4)), f32("retyped", ramp(4)),
            f32("reshaped", ramp(8), {2, 4})});
  add_rank({f32("same", ramp(4)), tensor<double>("retyped", DType::F64, {4}, {1, 2, 3, 4}),
            f32("reshaped", ramp(8)), f32("extra", ramp(2))});
  const ConsistencyReport report = check("ulp:1000");
  EXPECT_FALSE(report.consistent());
  EXPECT_TRUE(find(report, "same").consistent);
  auto problem = [&](const std::string& name) {
    const TensorConsistency& t = find(report, name);
    EXPECT_FALSE(t.consistent) << name;
    EXPECT_EQ(t.differing.size(), 1u) << name;
    return t.differing.empty() ? std::string() : t.differing[0].problem;
  };
  EXPECT_EQ(problem("gone"), "missing");
  EXPECT_EQ(problem("retyped"), "dtype F64, rank 0 has F32");
  EXPECT_EQ(problem("reshaped"), "shape [8], rank 0 has [2, 4]");
  EXPECT_EQ(problem("extra"), "only on this rank, not on rank 0");
  EXPECT_EQ(find(report, "extra").differing[0].rank, 1u);
  // The four inconsistent tensors first; the consistent one last.
  ASSERT_EQ(report.tensors.size(), 5u);
  EXPECT_EQ(report.tensors.back().name, "same");

  const std::string text = render_consistency_text(report);
  EXPECT_NE(text.find("DIFFER  gone\n        rank 1: missing\n"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("NOT CONSISTENT: 4 of 5 tensors differ from rank 0 on rank(s) 1\n"))
      << text;
}

TEST_F(ConsistencyTest, OnlyJudgesTheTensorsItNames) {
  std::vector<float> changed = ramp(4);
  changed[0] = -1;
  add_rank({f32("layer.0.w", ramp(4)), f32("layer.1.w", ramp(4)), f32("head.w", ramp(4))});
  add_rank({f32("layer.0.w", ramp(4)), f32("layer.1.w", ramp(4)), f32("head.w", changed),
            f32("head.extra", ramp(4))});
  const ConsistencyReport layers = check("exact", {"layer.*"});
  EXPECT_TRUE(layers.consistent());
  ASSERT_EQ(layers.tensors.size(), 2u);
  EXPECT_EQ(layers.tensors[0].name, "layer.0.w");
  EXPECT_EQ(layers.tensors[1].name, "layer.1.w");
  const ConsistencyReport head = check("exact", {"nothing", "head.w"});
  ASSERT_EQ(head.tensors.size(), 1u);
  EXPECT_FALSE(head.consistent());
  EXPECT_FALSE(check("exact", {"head.*"}).consistent());
  EXPECT_EQ(check("exact", {"head.*"}).tensors.size(), 2u) << "head.w and head.extra";
}

TEST_F(ConsistencyTest, RefusesOtherRulesAndASingleRank) {
  add_rank({f32("a", ramp(4))});
  try {
    check("exact");
    FAIL() << "one rank accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "consistent");
  }
  add_rank({f32("a", ramp(4))});
  for (const std::string rule : {"same", "measured", "abs:0.1"}) {
    try {
      check(rule);
      FAIL() << rule << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "--rule");
      EXPECT_NE(e.problem().find(rule), std::string::npos) << e.problem();
    }
  }
}

TEST_F(ConsistencyTest, JsonCarriesEveryDifference) {
  std::vector<float> changed = ramp(8);
  changed[6] = 0.5f;
  add_rank({f32("w", ramp(8), {2, 4}), f32("gone", ramp(2)), f32("ok", ramp(2))});
  add_rank({f32("w", changed, {2, 4}), f32("ok", ramp(2))});
  const std::string json = render_consistency_json(check("exact"));
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_FALSE(parser.parse(json).get(doc)) << json;
  EXPECT_FALSE(bool(doc["consistent"]));
  EXPECT_EQ(std::string_view(doc["rule"]), "exact");
  simdjson::dom::array files = doc["files"];
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(std::string_view(files.at(1)), files_[1]);

  // Inconsistent first, each group in rank 0's order (the writer's: by name).
  simdjson::dom::array tensors = doc["tensors"];
  ASSERT_EQ(tensors.size(), 3u);
  simdjson::dom::element w = tensors.at(1);
  EXPECT_EQ(std::string_view(w["name"]), "w");
  EXPECT_FALSE(bool(w["consistent"]));
  simdjson::dom::element d = w["differing"].at(0);
  EXPECT_EQ(std::uint64_t(d["rank"]), 1u);
  EXPECT_EQ(std::uint64_t(d["elements_differ"]), 1u);
  EXPECT_EQ(std::string_view(d["first_index"]), "(1, 2)");
  EXPECT_EQ(double(d["value"]), 0.5);
  EXPECT_EQ(double(d["rank0_value"]), 2.5);
  EXPECT_GT(std::uint64_t(d["max_ulp"]), 0u);
  EXPECT_TRUE(d["problem"].error()) << "no problem field for a compared rank";

  simdjson::dom::element gone = tensors.at(0);
  EXPECT_EQ(std::string_view(gone["name"]), "gone");
  EXPECT_EQ(std::string_view(gone["differing"].at(0)["problem"]), "missing");
  EXPECT_TRUE(gone["differing"].at(0)["max_ulp"].error());

  simdjson::dom::element ok = tensors.at(2);
  EXPECT_TRUE(bool(ok["consistent"]));
  EXPECT_EQ(simdjson::dom::array(ok["differing"]).size(), 0u);
}

}  // namespace
}  // namespace numalign
