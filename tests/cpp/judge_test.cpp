// judge_test.cpp: pairing of tensors and the warnings for comparisons that mean little,
// read from the traces' metadata (docs/architecture.md, "Comparisons that mean nothing"),
// and runs held in memory judged as files are.
#include "numalign/judge.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <optional>

#include "numalign/upstream_gradient.hpp"
#include "simulations.hpp"

namespace numalign {
namespace {

namespace fs = std::filesystem;
using examples::AllreduceCase;
using examples::AllreduceVariant;
using examples::Buffer;

class JudgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "numalign_judge_XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(const std::string& name, const Buffer& b, const TraceMetadata& meta) {
    const std::string path = (dir_ / name).string();
    const std::map<std::string, std::string> header{{kMetadataKey, meta.to_json()}};
    write_trace(path, {{"out", b.view()}}, &header);
    return path;
  }

  static TraceMetadata meta(const std::string& recipe, const std::string& fingerprint,
                            bool tf32 = false) {
    TraceMetadata m;
    m.dtype_recipe = recipe;
    m.fingerprints = {{"x", fingerprint}};
    m.tf32 = {{"matmul", tf32}};
    return m;
  }

  Report judge_files(const TraceMetadata& test, const TraceMetadata& ref,
                     const TraceMetadata& truth) {
    const AllreduceCase c(4, 2048, 1.0, 5);
    const Trace t = Trace::open(save("test.safetensors", c.run(AllreduceVariant::kFused), test));
    const Trace r = Trace::open(save("ref.safetensors", c.run(AllreduceVariant::kUnfused), ref));
    const Trace u = Trace::open(save("truth.safetensors", c.truth(), truth));
    return judge(t, r, &u, JudgeOptions{});
  }

  static bool warned(const Report& r, const std::string& text) {
    for (const auto& w : r.warnings) {
      if (w.find(text) != std::string::npos) return true;
    }
    return false;
  }

  fs::path dir_;
};

TEST_F(JudgeTest, ConsistentRunsGiveNoWarning) {
  const Report r = judge_files(meta("bf16", "a"), meta("bf16", "a"), meta("fp64", "a"));
  EXPECT_TRUE(r.aligned());
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
}

TEST_F(JudgeTest, DifferentRecipesAreFlagged) {
  const Report r = judge_files(meta("bf16", "a"), meta("fp32", "a"), meta("fp64", "a"));
  EXPECT_TRUE(warned(r, "different precision recipes (ref 'fp32', test 'bf16')"));
}

TEST_F(JudgeTest, DifferentInputsAreFlagged) {
  const Report r = judge_files(meta("bf16", "a"), meta("bf16", "b"), meta("fp64", "a"));
  EXPECT_TRUE(warned(r, "inputs differ between ref and test (fingerprints of x)"));
}

// Fingerprints from older traces (SHA-256) cannot be compared with XXH3's: said, not
// mistaken for different inputs.
TEST_F(JudgeTest, FingerprintsOfDifferentAlgorithmsAreNotCompared) {
  const Report r =
      judge_files(meta("bf16", "xxh3-128:00"), meta("bf16", "sha256:00"), meta("fp64", "x"));
  EXPECT_FALSE(warned(r, "inputs differ"));
  EXPECT_TRUE(warned(r,
                     "not compared: their fingerprints were made by different algorithms "
                     "(ref sha256, test xxh3-128"));
}

TEST_F(JudgeTest, Tf32IsFlagged) {
  const Report r = judge_files(meta("bf16", "a", true), meta("bf16", "a"), meta("fp64", "a"));
  EXPECT_TRUE(warned(r, "test ran with TF32 on (matmul)"));
}

TEST_F(JudgeTest, TruthAtRefsPrecisionIsFlagged) {
  const Report r = judge_files(meta("bf16", "a"), meta("bf16", "a"), meta("bf16", "a"));
  EXPECT_TRUE(warned(r, "no higher-precision truth"));
}

// A truth numalign captured must compute on the values its runs hold (truth_of, their dtype):
// one made on unrounded values, or on another dtype's, is named; a file from elsewhere (no
// upstream gradient recorded) says nothing of its values and is not.
TEST_F(JudgeTest, TruthOnValuesTheRunsNeverHeldIsFlagged) {
  auto truth = [](const std::string& of, const std::string& recipe) {
    TraceMetadata m = meta("float64", "a");
    m.upstream_gradient = recipe;
    m.truth_of = of;
    return m;
  };
  const std::string now(kUpstreamGradientRecipe);
  const TraceMetadata bf16 = meta("bfloat16", "a");
  EXPECT_TRUE(warned(judge_files(bf16, bf16, truth("", now)), "that ref ('bfloat16') never held"));
  EXPECT_TRUE(warned(judge_files(bf16, bf16, truth("float16", now)),
                     "rounded to 'float16', but ref ran 'bfloat16'"));
  const char* any = "the truth computed on";
  EXPECT_FALSE(warned(judge_files(bf16, bf16, truth("bfloat16", now)), any));
  EXPECT_FALSE(warned(judge_files(bf16, bf16, truth("", "")), any));
  const TraceMetadata f64 = meta("float64", "a"), f32 = meta("float32", "a");
  EXPECT_FALSE(warned(judge_files(f64, f64, truth("", now)), any));
  EXPECT_FALSE(warned(judge_files(f32, f32, truth("", now)), any));  // float32 rounds nothing
}

// Backward passes that started from different upstream gradients compute different
// gradients by design: the run cannot be judged, whatever its tensors say.
TEST_F(JudgeTest, BackwardPassesFromDifferentUpstreamGradientsCannotBeJudged) {
  auto captured = [](std::optional<std::int64_t> seed, const std::string& recipe) {
    TraceMetadata m = meta("bf16", "a");
    m.seed = seed;
    m.upstream_gradient = recipe;
    return m;
  };
  const std::string now(kUpstreamGradientRecipe);
  auto refused = [](const Report& r) {
    for (const auto& why : r.could_not_judge) {
      if (why.find("different upstream gradients") != std::string::npos) return why;
    }
    return std::string();
  };
  const Report same = judge_files(captured(0, now), captured(0, now), captured(0, now));
  EXPECT_TRUE(same.aligned());
  EXPECT_EQ(refused(same), "");

  const Report seeds = judge_files(captured(0, now), captured(1, now), captured(0, now));
  EXPECT_FALSE(seeds.aligned());
  EXPECT_NE(
      refused(seeds).find("test: seed 0, " + now + "; ref: seed 1, " + now + "; truth: seed 0"),
      std::string::npos)
      << refused(seeds);

  // A trace from before the recipe was recorded (a seed, no recipe) drew with torch.randn.
  const Report versions = judge_files(captured(0, ""), captured(0, now), captured(0, now));
  EXPECT_NE(refused(versions).find("test: seed 0, randn-float64"), std::string::npos)
      << refused(versions);

  // Traces that record no seed were not captured by numalign: nothing to compare.
  const Report elsewhere =
      judge_files(captured(std::nullopt, ""), captured(0, now), captured(std::nullopt, ""));
  EXPECT_EQ(refused(elsewhere), "");
}

TEST_F(JudgeTest, MismatchesFailWithTheirReason) {
  const Buffer a = examples::make_buffer(DType::BF16, {4, 2}, std::vector<double>(8, 1.0));
  const Buffer b = examples::make_buffer(DType::F32, {4, 2}, std::vector<double>(8, 1.0));
  const Buffer c = examples::make_buffer(DType::BF16, {8}, std::vector<double>(8, 1.0));
  const Buffer f4{DType::F4, {8}, std::vector<std::byte>(4)};
  const TensorView av = a.view(), bv = b.view(), cv = c.view(), f4v = f4.view();
  const Report r = judge_tensors({{"dtype", &av, &bv, nullptr},
                                  {"shape", &av, &cv, nullptr},
                                  {"missing", nullptr, &av, nullptr},
                                  {"packed", &f4v, &f4v, nullptr}},
                                 JudgeOptions{});
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
  std::map<std::string, const TensorResult*> by;
  for (const auto& t : r.tensors) by[t.name] = &t;
  EXPECT_EQ(by["dtype"]->reason, "dtype mismatch: test BF16, ref F32");
  EXPECT_EQ(by["shape"]->reason, "shape mismatch: test [4, 2], ref [8]");
  EXPECT_EQ(by["missing"]->reason, "missing from test");
  EXPECT_EQ(by["packed"]->verdict, VerdictKind::kError);
  EXPECT_NE(by["packed"]->reason.find("not supported yet"), std::string::npos);
  EXPECT_EQ(r.tensors.front().name, "packed") << "could-not-judge comes first";
}

// Runs in memory (a front end's tensors) go through the same judge as files: pairing,
// `only`, warnings, tags from ref's metadata, and the sections asked for.
class InMemoryRunTest : public ::testing::Test {
 protected:
  const Buffer& keep(Buffer b) { return buffers_.emplace_back(std::move(b)); }
  const Buffer& values(DType dt, std::vector<double> v) {
    const std::uint64_t n = v.size();
    return keep(examples::make_buffer(dt, {n}, std::move(v)));
  }
  Trace run(const std::vector<std::pair<std::string, const Buffer*>>& tensors,
            const std::optional<TraceMetadata>& meta = std::nullopt) {
    std::vector<NamedTensor> named;
    for (const auto& [n, b] : tensors) named.push_back({n, b->view()});
    std::map<std::string, std::string> raw;
    if (meta) raw[kMetadataKey] = meta->to_json();
    return Trace::from_tensors(std::move(named), raw);
  }
  std::deque<Buffer> buffers_;
};

// Pairing tries the entry at ref's position before looking a name up: whatever each run's
// order, every tensor meets its namesake, and a tensor only in test is still listed.
TEST_F(InMemoryRunTest, PairsByNameWhateverEachRunsOrder) {
  const Buffer& x = values(DType::F32, {1.0, 2.0});
  const auto view_of = [](const Trace& trace, const std::string& name) {
    return &trace.find(name)->view;
  };
  const Trace r = run({{"a", &x}, {"b", &x}, {"c", &x}});
  struct Case {
    std::vector<std::string> test, truth;
    std::vector<std::string> only;
  };
  const std::vector<Case> cases = {
      {{"a", "b", "c"}, {"a", "b", "c"}, {}},       // alike
      {{"c", "a", "b", "d"}, {"b", "a", "c"}, {}},  // shuffled, one more in test
      {{"x", "a", "b", "c"}, {"c"}, {}},            // shifted by one; truth lacks two
      {{"b", "a"}, {}, {}},                         // test lacks c
      {{"a", "b", "c", "d"}, {"a", "b", "c"}, {"a", "d"}},
  };
  for (const Case& c : cases) {
    std::vector<std::pair<std::string, const Buffer*>> test_tensors, truth_tensors;
    for (const auto& n : c.test) test_tensors.push_back({n, &x});
    for (const auto& n : c.truth) truth_tensors.push_back({n, &x});
    const Trace t = run(test_tensors), u = run(truth_tensors);
    const std::vector<TensorTriple> triples = pair_tensors(t, r, &u, c.only);
    // Expected: ref's tensors in ref's order, then test's own, each with its namesakes.
    std::vector<std::string> expected;
    for (const auto& n : {"a", "b", "c"}) {
      if (c.only.empty() || std::find(c.only.begin(), c.only.end(), n) != c.only.end())
        expected.push_back(n);
    }
    for (const auto& n : c.test) {
      const bool in_ref = n == "a" || n == "b" || n == "c";
      if (!in_ref && (c.only.empty() || std::find(c.only.begin(), c.only.end(), n) != c.only.end()))
        expected.push_back(n);
    }
    ASSERT_EQ(triples.size(), expected.size()) << c.test.size();
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const TensorTriple& p = triples[i];
      EXPECT_EQ(p.name, expected[i]);
      EXPECT_EQ(p.test, t.find(p.name) ? view_of(t, p.name) : nullptr) << p.name;
      EXPECT_EQ(p.ref, r.find(p.name) ? view_of(r, p.name) : nullptr) << p.name;
      EXPECT_EQ(p.truth, p.ref && u.find(p.name) ? view_of(u, p.name) : nullptr) << p.name;
    }
  }
}

// The warnings of the rules come in the tensors' order, each tensor's own first; a truth that
// is not float64 is warned of once, after the warnings of the first tensor that has one.
// Each cause is one line, its tensors named in their order, and the causes in the order of
// their first tensor, whatever the threads did first.
TEST_F(InMemoryRunTest, RuleWarningsComeInTheTensorsOrder) {
  const Buffer& one = values(DType::F32, std::vector<double>(64, 1.0));
  const Buffer& off = values(DType::F32, std::vector<double>(64, 1.5));    // fails: the rule runs
  const Buffer& exact = values(DType::F64, std::vector<double>(64, 1.0));  // ref's own values
  const Buffer& narrow = values(DType::F32, std::vector<double>(64, 1.0));
  const Trace t = run({{"a", &off}, {"b", &off}, {"c", &off}, {"d", &off}});
  const Trace r = run({{"a", &one}, {"b", &one}, {"c", &one}, {"d", &one}});
  const Trace u = run({{"a", &exact}, {"b", &narrow}, {"c", &exact}, {"d", &narrow}});
  JudgeOptions o;
  o.default_rule = parse_rule("same");  // warns of a ref equal to its truth
  o.threads = 2;
  for (int repeat = 0; repeat < 20; ++repeat) {
    const Report report = judge(t, r, &u, o);
    // a and c: ref equals truth (baseline 0), one line; b, d: a float32 truth, warned of
    // once, at b, after the line whose first tensor (a) precedes it. All four are biased, but
    // they fail: "--check-bias would fail it" would add nothing.
    ASSERT_EQ(report.warnings.size(), 2u) << testing::PrintToString(report.warnings);
    EXPECT_TRUE(report.warnings[0].starts_with("baseline RMSE is 0 (ref equals truth)"));
    EXPECT_TRUE(report.warnings[0].ends_with(": 2 tensors: a, c")) << report.warnings[0];
    EXPECT_TRUE(report.warnings[1].starts_with("truth is not float64 (F32 in b)"))
        << report.warnings[1];
  }
}

TEST_F(InMemoryRunTest, PairsWarnsTagsAndTitlesNothing) {
  const Buffer& one = values(DType::F32, std::vector<double>(1200, 1.0));
  const Buffer& off = values(DType::F32, std::vector<double>(1200, 1.5));
  const Buffer& truth = values(DType::F64, std::vector<double>(1200, 1.0));
  TraceMetadata meta;
  meta.order = {"b", "a"};
  meta.tags = {{"a", {{"module", "m"}}}, {"b", {{"module", "n"}}}};
  const Trace t = run({{"a", &off}, {"b", &one}, {"extra", &one}});
  const Trace r = run({{"a", &one}, {"b", &one}}, meta);
  const Trace u = run({{"b", &truth}});
  JudgeOptions o;
  o.sections.first_failing = true;
  const Report report = judge(t, r, &u, o);
  EXPECT_EQ(report.title, "");
  ASSERT_EQ(report.tensors.size(), 2u);
  EXPECT_EQ(report.tensors[0].name, "a");  // the failure first
  EXPECT_EQ(report.tensors[0].tags.at("module"), "m");
  EXPECT_EQ(report.tensors[1].order, 0u) << "b comes first in ref's execution order";
  EXPECT_EQ(report.first_failing, "a");
  bool missing = false, extra = false;
  for (const auto& w : report.warnings) {
    missing = missing || w == "1 tensor(s) of ref are missing from truth";
    extra = extra || w.find("only in test, not judged: extra") != std::string::npos;
  }
  EXPECT_TRUE(missing && extra);
  o.only = {"b*"};
  const Report only_b = judge(t, r, &u, o);
  ASSERT_EQ(only_b.tensors.size(), 1u);
  EXPECT_EQ(only_b.tensors[0].name, "b");
  EXPECT_FALSE(only_b.first_failing.has_value());
  EXPECT_THROW(run({{"a", &one}, {"a", &one}}), Error);
}

// A parent runs its children: with a bug in one, the parent fails too, often by more. The
// innermost failing module comes first; a module whose tensor is missing from test ranks as
// failing without a ratio and says why, not "ratio 1 / limit 3" (issue 35, 7).
TEST_F(InMemoryRunTest, IsolationRanksTheInnermostFailingModuleFirstAndSaysWhatFailed) {
  const Buffer& ref = values(DType::F32, {1, 2, 3, 4});
  const Buffer& off = values(DType::F32, {1, 2, 3, 6});
  const Buffer& further = values(DType::F32, {1, 2, 3, 9});
  TraceMetadata meta;
  meta.order = {"layers.1.self_attn.out", "layers.1.out", "layers.1.mlp.out", "head.out",
                "head.grad"};
  for (const auto& n : meta.order) {
    meta.tags[n] = {{"module", n.substr(0, n.rfind('.'))}, {"kind", "output"}};
  }
  const Trace t = run({{"layers.1.self_attn.out", &off},
                       {"layers.1.out", &further},
                       {"layers.1.mlp.out", &ref},
                       {"head.out", &ref}});
  const Trace r = run({{"layers.1.self_attn.out", &ref},
                       {"layers.1.out", &ref},
                       {"layers.1.mlp.out", &ref},
                       {"head.out", &ref},
                       {"head.grad", &ref}},
                      meta);
  JudgeOptions o;
  o.default_rule = parse_rule("abs:1");
  o.sections.module_ranking = true;
  const Report report = judge(t, r, nullptr, o);
  ASSERT_EQ(report.ranking.size(), 4u);
  EXPECT_EQ(report.ranking[0].module, "head");  // head.grad is missing from test
  EXPECT_FALSE(report.ranking[0].aligned);
  EXPECT_EQ(report.ranking[0].tensor, "head.grad");
  EXPECT_EQ(report.ranking[1].module, "layers.1.self_attn");  // ratio 2, inside layers.1
  EXPECT_EQ(report.ranking[2].module, "layers.1");            // ratio 5, but a child fails
  EXPECT_EQ(report.ranking[3].module, "layers.1.mlp");
  const std::string text = render_text(report);
  EXPECT_NE(text.find("    1. FAIL  head  (head.grad: missing from test)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("    3. FAIL  layers.1  ratio 5 / limit 1  (layers.1.out; a module inside "
                      "it fails: layers.1.self_attn)"),
            std::string::npos)
      << text;
}

TEST_F(InMemoryRunTest, IsolatedModulesAreRankedWorstFirstWithoutAFirstDivergence) {
  const Buffer& ref = values(DType::F32, {1, 2, 3, 4});
  const Buffer& close = values(DType::F32, {1, 2, 3, 4.5});
  const Buffer& far = values(DType::F32, {1, 2, 3, 40});
  TraceMetadata meta;
  meta.order = {"x.out", "y.out", "y.grad", "z.out"};
  meta.tags = {{"x.out", {{"module", "x"}, {"kind", "output"}}},
               {"y.out", {{"module", "y"}, {"kind", "output"}}},
               {"y.grad", {{"module", "y"}, {"kind", "grad"}}},
               {"z.out", {{"module", "z"}, {"kind", "output"}}}};
  const Trace t = run({{"x.out", &close}, {"y.out", &ref}, {"y.grad", &far}, {"z.out", &ref}});
  const Trace r = run({{"x.out", &ref}, {"y.out", &ref}, {"y.grad", &ref}, {"z.out", &ref}}, meta);
  JudgeOptions o;
  o.default_rule = parse_rule("abs:1");
  o.sections.module_ranking = true;
  const Report report = judge(t, r, nullptr, o);
  EXPECT_FALSE(report.first_divergence.has_value());
  ASSERT_EQ(report.ranking.size(), 3u);
  EXPECT_EQ(report.ranking[0].module, "y");
  EXPECT_EQ(report.ranking[0].tensor, "y.grad");
  EXPECT_FALSE(report.ranking[0].aligned);
  EXPECT_EQ(report.ranking[1].module, "x");  // ratio 0.5 / limit 1
  EXPECT_TRUE(report.ranking[1].aligned);
  EXPECT_EQ(report.ranking[2].module, "z");
  const std::string text = render_text(report);
  EXPECT_EQ(text.find("modules in isolation"), 0u) << text;
  EXPECT_NE(text.find("    1. FAIL  y  ratio 36 / limit 1  (y.grad)"), std::string::npos) << text;
  const std::vector<TagGroup> groups = group_by_tags(report, {"module"});
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[1].values, std::vector<std::string>{"y"});
  EXPECT_EQ(groups[1].tensors, 2u);
  EXPECT_EQ(groups[1].failed, 1u);
  EXPECT_EQ(groups[1].max_ratio, 36.0);
}

// A judgement that judged nothing is no pass (issue: "fail closed"): an empty ref, an `only`
// that matches nothing, and a ref with nothing in common with a failing test all say why.
TEST_F(InMemoryRunTest, NothingJudgedCannotBeAligned) {
  const Buffer& one = values(DType::F32, std::vector<double>(16, 1.0));
  const Buffer& bad = values(DType::F32, std::vector<double>(16, 9.0));
  const Trace test = run({{"a", &bad}});
  const Trace empty = run({});
  const Trace ref = run({{"a", &one}});
  const Report no_ref = judge(test, empty, nullptr, JudgeOptions{});
  EXPECT_FALSE(no_ref.aligned());
  EXPECT_EQ(no_ref.exit_code(), kCouldNotJudge);
  ASSERT_EQ(no_ref.could_not_judge.size(), 1u);
  EXPECT_NE(no_ref.could_not_judge[0].find("ref holds no tensors"), std::string::npos)
      << no_ref.could_not_judge[0];
  EXPECT_EQ(render_summary(no_ref).rfind("COULD NOT JUDGE", 0), 0u) << render_summary(no_ref);

  JudgeOptions only;
  only.only = {"nothing*"};
  const Report filtered = judge(test, ref, nullptr, only);
  EXPECT_EQ(filtered.exit_code(), kCouldNotJudge);
  ASSERT_EQ(filtered.could_not_judge.size(), 1u);
  EXPECT_NE(filtered.could_not_judge[0].find("nothing*"), std::string::npos);
  EXPECT_NE(render_text(filtered).find("could not judge"), std::string::npos);
  EXPECT_NE(render_json(filtered).find("\"could_not_judge\""), std::string::npos);
  EXPECT_NE(render_junit(filtered).find("<error"), std::string::npos) << render_junit(filtered);

  // Judging both empty is as empty: nothing was compared.
  EXPECT_EQ(judge(empty, empty, nullptr, JudgeOptions{}).exit_code(), kCouldNotJudge);
  // A ref tensor with no test counterpart still fails by name: that is a judgement.
  const Report missing = judge(empty, ref, nullptr, JudgeOptions{});
  EXPECT_EQ(missing.exit_code(), kNotAligned);
  EXPECT_TRUE(missing.could_not_judge.empty());
}

// Reasons say what happened: NaN in both runs is not "NaN against a number"; an Inf that ref
// and truth share is not "NaN in reference".
TEST_F(InMemoryRunTest, ReasonsNameTheNonFiniteValuesThereAre) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const Buffer& both = values(DType::F32, {1.0, nan, 3.0});
  const Buffer& number = values(DType::F32, {1.0, 2.0, 3.0});
  const Trace t = run({{"x", &both}});
  const Trace same_nan = run({{"x", &both}});
  const Trace numbers = run({{"x", &number}});
  JudgeOptions ulp;
  ulp.default_rule = parse_rule("ulp:1");
  const Report both_nan = judge(t, same_nan, nullptr, ulp);
  EXPECT_EQ(both_nan.tensors.at(0).verdict, VerdictKind::kFail) << "NaN != NaN without equal_nan";
  EXPECT_EQ(both_nan.tensors.at(0).reason.find("NaN against a number"), std::string::npos)
      << both_nan.tensors.at(0).reason;
  EXPECT_NE(both_nan.tensors.at(0).reason.find("NaN in both"), std::string::npos)
      << both_nan.tensors.at(0).reason;
  ulp.equal_nan = true;
  EXPECT_EQ(judge(t, same_nan, nullptr, ulp).tensors.at(0).verdict, VerdictKind::kPass);
  ulp.equal_nan = false;
  EXPECT_NE(judge(t, numbers, nullptr, ulp).tensors.at(0).reason.find("NaN against a number"),
            std::string::npos);

  // ref holds +inf where the truth does: the baseline is NaN (inf - inf), but no NaN is in ref.
  std::vector<double> ref_values(1200, 1.0), truth_values(1200, 1.0), test_values(1200, 1.0);
  ref_values[5] = truth_values[5] = inf;
  test_values[7] = 1.5;
  const Trace inf_test = run({{"y", &values(DType::F32, test_values)}});
  const Trace inf_ref = run({{"y", &values(DType::F32, ref_values)}});
  const Trace inf_truth = run({{"y", &values(DType::F64, truth_values)}});
  const Report r = judge(inf_test, inf_ref, &inf_truth, JudgeOptions{});
  for (const auto& w : r.warnings) {
    EXPECT_EQ(w.find("found NaN in reference"), std::string::npos) << w;
  }
}

// A run that consumed random numbers (dropout in training mode, ...) cannot be judged: its
// difference to the truth measures the draws. Stated as shared, with a reason, it is judged
// and the report says so.
TEST_F(InMemoryRunTest, RandomRunsCannotBeJudgedUnlessDeclaredShared) {
  const Buffer& one = values(DType::F32, std::vector<double>(64, 1.0));
  const Buffer& truth = values(DType::F64, std::vector<double>(64, 1.0));
  TraceMetadata random;
  random.random = RandomUse{{"cpu"}, {"encoder.dropout"}};
  TraceMetadata quiet;
  quiet.random = RandomUse{};
  const Trace t = run({{"a", &one}}, random);
  const Trace r = run({{"a", &one}}, random);
  const Trace u = run({{"a", &truth}}, quiet);
  const Report report = judge(t, r, &u, JudgeOptions{});
  EXPECT_EQ(report.exit_code(), kCouldNotJudge);
  ASSERT_EQ(report.could_not_judge.size(), 1u);
  const std::string& why = report.could_not_judge[0];
  EXPECT_NE(why.find("random"), std::string::npos) << why;
  EXPECT_NE(why.find("encoder.dropout"), std::string::npos) << why;
  EXPECT_NE(why.find("--shared-randomness"), std::string::npos) << why;

  JudgeOptions shared;
  shared.shared_randomness = "every run reseeds the generator before the same kernel sequence";
  const Report accepted = judge(t, r, &u, shared);
  EXPECT_EQ(accepted.exit_code(), kAligned);
  EXPECT_NE(accepted.settings.find("every run reseeds"), std::string::npos) << accepted.settings;
  EXPECT_NE(render_text(accepted).find("every run reseeds"), std::string::npos);

  // Metadata round trip keeps what capture recorded.
  const TraceMetadata back = TraceMetadata::from_json(random.to_json(), "here");
  ASSERT_TRUE(back.random.has_value());
  EXPECT_EQ(back.random->generators, std::vector<std::string>{"cpu"});
  EXPECT_EQ(back.random->dropout, std::vector<std::string>{"encoder.dropout"});
  EXPECT_FALSE(TraceMetadata::from_json(quiet.to_json(), "here").random->used());
}

// A reference that computed something other than the truth (its own dropout masks, other
// inputs), in traces that say nothing of it: most of its tensors are far beyond the
// roundoff of their dtype from the truth. Could not judge. A few far tensors among many (a
// gradient that is zero in exact arithmetic, a sum that cancels) are legitimate: judged.
// The truth's file given as test (`judge truth.st ref.st truth.st`): ratio 0 everywhere, which
// passed; it is no run under test. A float64 run that differs anywhere, and integer tensors
// equal to their truth, are judged as before.
TEST_F(InMemoryRunTest, TheTruthGivenAsTestCannotBeJudged) {
  std::vector<double> exact(64), rounded(64), off(64);
  for (std::size_t i = 0; i < exact.size(); ++i) {
    exact[i] = std::sin(0.3 * static_cast<double>(i)) + 1.5;
    rounded[i] = exact[i] + (i % 3 ? 1e-15 : 0);  // a float64 ref, a little off the truth
    off[i] = exact[i];
  }
  off[5] += 1e-15;
  const Buffer& truth_a = values(DType::F64, exact);
  const Buffer& ref_a = values(DType::F64, rounded);
  const Buffer& ids = values(DType::I64, std::vector<double>{1, 2, 3});
  const Trace truth = run({{"a", &truth_a}, {"ids", &ids}});
  const Trace ref = run({{"a", &ref_a}, {"ids", &ids}});
  const Report given_twice = judge(truth, ref, &truth, JudgeOptions{});
  EXPECT_EQ(given_twice.exit_code(), kCouldNotJudge) << render_text(given_twice);
  ASSERT_EQ(given_twice.could_not_judge.size(), 1u);
  EXPECT_EQ(given_twice.could_not_judge[0],
            "test is bit-identical to the truth in every tensor (1): it is the truth, not a run "
            "under test (was the truth's file given as test?)");
  // float64 test and ref, one element off the truth in test: judged.
  const Buffer& off_a = values(DType::F64, off);
  const Report judged = judge(run({{"a", &off_a}, {"ids", &ids}}), ref, &truth, JudgeOptions{});
  EXPECT_TRUE(judged.could_not_judge.empty()) << render_text(judged);
  // Integers alone, equal to their truth: judged (exactly).
  const Trace only_ids = run({{"ids", &ids}});
  EXPECT_EQ(judge(only_ids, only_ids, &only_ids, JudgeOptions{}).exit_code(), kAligned);
}

TEST_F(InMemoryRunTest, AReferenceThatIsNoRenditionOfItsTruthCannotBeJudged) {
  auto judged = [&](std::size_t tensors, std::size_t far) {
    std::vector<std::pair<std::string, const Buffer*>> test, ref, truth;
    for (std::size_t i = 0; i < tensors; ++i) {
      std::vector<double> exact(256), off(256);
      for (std::size_t j = 0; j < exact.size(); ++j) {
        exact[j] = std::sin(0.37 * static_cast<double>(i * 256 + j) + 1.0);
        // 30% off (about 77 units of bf16's roundoff), or bf16's own rounding of the truth
        off[j] = i < far ? 1.3 * exact[j] + 0.2 * std::cos(static_cast<double>(j)) : exact[j];
      }
      const std::string name = "t" + std::to_string(i);
      const Buffer& r = values(DType::BF16, off);
      test.emplace_back(name, &r);
      ref.emplace_back(name, &r);
      truth.emplace_back(name, &values(DType::F64, exact));
    }
    const Trace t = run(test), r = run(ref), u = run(truth);
    return judge(t, r, &u, JudgeOptions{});
  };
  const Report refused = judged(10, 8);
  EXPECT_EQ(refused.exit_code(), kCouldNotJudge);
  ASSERT_EQ(refused.could_not_judge.size(), 1u);
  EXPECT_NE(refused.could_not_judge[0].find("ref is far from the truth in 8 of 10 tensors"),
            std::string::npos)
      << refused.could_not_judge[0];
  EXPECT_NE(refused.could_not_judge[0].find("its own random draws, other inputs"),
            std::string::npos);
  EXPECT_EQ(judged(20, 7).exit_code(), kAligned) << "fewer than 8 far tensors: judged";
  EXPECT_EQ(judged(10, 5).exit_code(), kAligned) << "not a majority: judged";
  EXPECT_EQ(judged(9, 0).exit_code(), kAligned);
}

}  // namespace
}  // namespace numalign
