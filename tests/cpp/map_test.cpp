// map_test.cpp: maps between two implementations: the file's errors (exact messages), the
// captures, pieces read in place (checked against an element-by-element oracle), and
// judging a fused projection against separate ones.
#include "numalign/map.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "numalign/dtype.hpp"
#include "numalign/judge.hpp"
#include "numalign/layout.hpp"
#include "numalign/metrics.hpp"
#include "numalign/trace.hpp"
#include "simulations.hpp"

namespace numalign {
namespace {

using examples::Buffer;
using examples::make_buffer;

std::string parse_error(const std::string& json) {
  try {
    TensorMap::parse(json, "map.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(parsed)";
}

TEST(MapFileTest, EachMistakeIsNamedWithItsEntry) {
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a.**.b", "ref": "x.{1}"}]})"),
            "map.json: map entry 1: test glob \"a.**.b\" has two * side by side: what each "
            "captures would be ambiguous");
  EXPECT_EQ(
      parse_error(R"({"map": [{"test": "blocks.*.attention.qkv.out",
                               "ref": ["model.layers.{1}.q.out", "model.layers.{2}.k.out"],
                               "cat_dim": -1}]})"),
      "map.json: map entry 1: ref \"model.layers.{2}.k.out\" inserts capture {2}, but test glob "
      "\"blocks.*.attention.qkv.out\" has only 1 *");
  EXPECT_EQ(parse_error(R"({"map": [], "ignore": [{"ref": "model.rotary_emb.*"}]})"),
            "map.json: ignore 1 (ref \"model.rotary_emb.*\") needs a written reason: a tensor "
            "left unjudged must say why");
  EXPECT_EQ(parse_error(R"({"map": [], "ignore": [{"ref": "r.*", "reason": "  "}]})"),
            "map.json: ignore 1 (ref \"r.*\") needs a written reason: a tensor left unjudged "
            "must say why");
  EXPECT_EQ(parse_error(R"({"map": [{"test": ["a", "b"], "ref": ["c", "d"], "cat_dim": 0}]})"),
            "map.json: map entry 1: test and ref are both lists: one side must be one name or "
            "glob");
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a.*", "ref": ["c.{1}", "d.{1}"]}]})"),
            "map.json: map entry 1: a list of ref tensors needs \"cat_dim\", the dim they lie "
            "side by side along");
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a.*", "ref": "c.{x}"}]})"),
            "map.json: map entry 1: ref: \"c.{x}\": a placeholder is {N}, N >= 1 the number of a "
            "* of the glob");
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a.*", "ref": "c"}]})"),
            "map.json: map entry 1: test glob \"a.*\" matches many tensors but ref inserts none "
            "of its captures ({1}): they would all pair with the same tensors");
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a", "ref": "b", "dim": 0}]})"),
            "map.json: map entry 1: unknown field \"dim\" (expected test, ref, cat_dim, "
            "transpose, sharded_dim, replicated)");
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a", "ref": "b", "transpose": [1, 1]}]})"),
            "map.json: map entry 1: transpose must be two different dims, as [0, 1]");
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a.{1}", "ref": "b.{1}"}]})"),
            "map.json: map entry 1: test and ref both insert captures ({N}): one side must be "
            "the glob");
  EXPECT_EQ(parse_error(R"({"ignore": []})"), "map.json: a map needs \"map\": the list of entries");
  EXPECT_EQ(parse_error(R"({"map": [}})").rfind("map.json: map is not valid JSON: ", 0), 0u);
  EXPECT_EQ(parse_error(R"({"map": [{"test": "a", "ref": "b"}], "maps": []})"),
            "map.json: unknown field \"maps\" (expected map, ignore)");
}

TEST(MapFileTest, TheIssuesExampleParses) {
  const TensorMap m = TensorMap::parse(R"({"map": [
      {"test": "blocks.*.attention.qkv.out",
       "ref": ["model.layers.{1}.self_attn.q_proj.out", "model.layers.{1}.self_attn.k_proj.out",
               "model.layers.{1}.self_attn.v_proj.out"], "cat_dim": -1},
      {"test": "blocks.*.attention.out", "ref": "model.layers.{1}.self_attn.o_proj.out"}],
    "ignore": [{"ref": "model.rotary_emb.*", "reason": "the fused kernel applies rotary inside"}]})",
                                       "map.json");
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_TRUE(m.entries[0].glob_on_test);
  EXPECT_TRUE(m.entries[0].ref_is_list);
  EXPECT_EQ(*m.entries[0].cat_dim, -1);
  ASSERT_EQ(m.ignore.size(), 1u);
  EXPECT_EQ(m.ignore[0].reason, "the fused kernel applies rotary inside");
  // A test list with the glob on ref: the other direction.
  const TensorMap other = TensorMap::parse(
      R"({"map": [{"test": ["b.{1}.gate", "b.{1}.up"], "ref": "m.*.gate_up", "cat_dim": 0}]})",
      "m");
  EXPECT_FALSE(other.entries[0].glob_on_test);
}

TEST(GlobCapturesTest, StarsCaptureAsLittleAsTheRestAllows) {
  auto caps = glob_captures("blocks.*.attention.qkv.out", "blocks.12.attention.qkv.out");
  ASSERT_TRUE(caps);
  ASSERT_EQ(caps->size(), 1u);
  EXPECT_EQ((*caps)[0], "12");
  caps = glob_captures("*.*.out", "layers.0.mlp.out");
  ASSERT_TRUE(caps);
  EXPECT_EQ((*caps)[0], "layers");
  EXPECT_EQ((*caps)[1], "0.mlp");
  caps = glob_captures("a?c.*", "abc.");
  ASSERT_TRUE(caps);
  EXPECT_EQ((*caps)[0], "");
  EXPECT_FALSE(glob_captures("blocks.*.out", "block.1.out"));
  EXPECT_FALSE(glob_captures("a*b*c", std::string(2000, 'a') + "b"));  // stays fast
  // '?' is one character as the matcher reads them: a code point, or a byte that is not
  // UTF-8 (found by fuzz_map: a lead byte without its continuation was taken as three).
  caps = glob_captures("??*.*", "\xe2m.{1\".x");
  ASSERT_TRUE(caps);
  EXPECT_EQ((*caps)[0], "");
  EXPECT_EQ((*caps)[1], "{1\".x");
  caps = glob_captures("?*", "\xe2\x82\xac!");  // the euro sign is one character
  ASSERT_TRUE(caps);
  EXPECT_EQ((*caps)[0], "!");
}

// The oracle of captures: every star as short as possible, first to last, by plain
// backtracking over ASCII (exponential in general: small cases only).
std::optional<std::vector<std::string>> shortest_captures(std::string_view g, std::string_view n) {
  if (g.empty()) return n.empty() ? std::optional(std::vector<std::string>{}) : std::nullopt;
  if (g[0] == '*') {
    for (std::size_t len = 0; len <= n.size(); ++len) {
      if (auto rest = shortest_captures(g.substr(1), n.substr(len))) {
        rest->insert(rest->begin(), std::string(n.substr(0, len)));
        return rest;
      }
    }
    return std::nullopt;
  }
  if (n.empty() || (g[0] != '?' && g[0] != n[0])) return std::nullopt;
  return shortest_captures(g.substr(1), n.substr(1));
}

TEST(GlobCapturesTest, CapturesAreTheShortestFirstOnesOfABacktrackingOracle) {
  std::mt19937_64 rng(11);
  const std::string alphabet = "ab.", glob_alphabet = "ab.*?";
  for (int trial = 0; trial < 20000; ++trial) {
    std::string g, n;
    for (int k = static_cast<int>(rng() % 7); k > 0; --k) g += glob_alphabet[rng() % 5];
    for (int k = static_cast<int>(rng() % 9); k > 0; --k) n += alphabet[rng() % 3];
    if (g.find("**") != std::string::npos) continue;  // the map refuses those
    const auto want = shortest_captures(g, n);
    const auto got = glob_captures(g, n);
    ASSERT_EQ(got.has_value(), want.has_value()) << g << " / " << n;
    if (!got) continue;
    ASSERT_EQ(got->size(), want->size()) << g << " / " << n;
    for (std::size_t i = 0; i < got->size(); ++i)
      EXPECT_EQ((*got)[i], (*want)[i]) << g << " / " << n << " capture " << i;
  }
}

// A star per character of a long name recursed once per star (a stack overflow at 100,000);
// a long tail after one star was quadratic. Both are one pass now.
TEST(GlobCapturesTest, ManyStarsAndLongNamesNeedNoRecursion) {
  std::string many;
  for (int i = 0; i < 100000; ++i) many += "*a";
  const auto caps = glob_captures(many, std::string(100000, 'a'));
  ASSERT_TRUE(caps);
  EXPECT_EQ(caps->size(), 100000u);
  EXPECT_TRUE((*caps)[0].empty());
  const auto tail = glob_captures("*" + std::string(60000, 'a'), std::string(120000, 'a'));
  ASSERT_TRUE(tail);
  EXPECT_EQ((*tail)[0].size(), 60000u);
  EXPECT_FALSE(glob_captures("*" + std::string(60000, 'a') + "b", std::string(120000, 'a')));
}

// The oracle: element i of a view, found from its multi-index without copy_elements' runs.
std::vector<float> naive_read(const TensorView& v) {
  std::vector<float> out;
  for (std::uint64_t i = 0; i < v.numel(); ++i) {
    const auto idx = unravel_index(v.shape, i);
    std::uint64_t along = idx[v.layout->dim];
    std::size_t p = 0;
    while (along >= v.layout->parts[p].extent) along -= v.layout->parts[p++].extent;
    const StridedPart& part = v.layout->parts[p];
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d)
      off += static_cast<std::int64_t>(d == v.layout->dim ? along : idx[d]) * part.strides[d];
    float f;
    std::memcpy(&f, part.data + off * 4, 4);
    out.push_back(f);
  }
  return out;
}

TEST(LayoutTest, CopiesAnyRangeOfSlicesTransposesAndConcatenations) {
  std::vector<float> a(2 * 3 * 10), b(2 * 3 * 4);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(1000 + i);
  const auto* pa = reinterpret_cast<const std::byte*>(a.data());
  const auto* pb = reinterpret_cast<const std::byte*>(b.data());
  const std::vector<std::int64_t> sa = contiguous_strides({2, 3, 10});
  std::deque<Layout> layouts;
  std::vector<TensorView> views;
  // A slice along the last dim, along the middle dim, a transpose of a's first two dims, and
  // a concatenation of a and b along the last dim.
  layouts.push_back({2, {{pa + 4 * 4, sa, 3}}});
  views.push_back({DType::F32, {2, 3, 3}, nullptr, &layouts.back()});
  layouts.push_back({1, {{pa + 1 * 10 * 4, sa, 2}}});
  views.push_back({DType::F32, {2, 2, 10}, nullptr, &layouts.back()});
  layouts.push_back({0, {{pa, {10, 30, 1}, 3}}});
  views.push_back({DType::F32, {3, 2, 10}, nullptr, &layouts.back()});
  layouts.push_back({2, {{pa, sa, 10}, {pb, contiguous_strides({2, 3, 4}), 4}}});
  views.push_back({DType::F32, {2, 3, 14}, nullptr, &layouts.back()});
  for (const TensorView& v : views) {
    const std::vector<float> want = naive_read(v);
    for (std::uint64_t begin = 0; begin < v.numel(); begin += 7) {
      for (std::uint64_t end = begin; end <= v.numel(); end += 5) {
        std::vector<float> got(end - begin);
        copy_elements(v, begin, end, reinterpret_cast<std::byte*>(got.data()));
        for (std::uint64_t i = begin; i < end; ++i)
          ASSERT_EQ(got[i - begin], want[i]) << format_shape(v.shape) << " at " << i;
      }
    }
  }
  // Spot check the oracle itself: the slice [:, :, 4:7] starts with a[0, 0, 4] = 4.
  EXPECT_EQ(naive_read(views[0])[0], 4.0f);
  EXPECT_EQ(naive_read(views[0])[3], 14.0f);
  EXPECT_EQ(naive_read(views[3])[10], 1000.0f);
}

// The runs of a fused QKV projection (test) and separate q, k and v (ref, truth).
class FusedProjectionTest : public ::testing::Test {
 protected:
  static constexpr std::uint64_t kB = 3, kT = 50, kH = 40;  // q, k, v of width kH each
  void SetUp() override {
    std::mt19937_64 g(7);
    std::normal_distribution<double> n(0, 1);
    for (const char* p : {"q", "k", "v"}) {
      std::vector<double> u(kB * kT * kH), r(u.size());
      for (auto& x : u) x = n(g);
      // ref: float32 with one float32 roundoff of noise; truth: the exact values.
      for (std::size_t i = 0; i < u.size(); ++i) r[i] = u[i] * (1 + 3e-8 * n(g));
      truth_[p] = u;
      ref_[p] = r;
    }
  }
  // The fused test tensor: q, k, v side by side along the last dim, k scaled by 1 + k_bug.
  Buffer fused(double k_bug) const {
    std::vector<double> f(kB * kT * 3 * kH);
    for (std::uint64_t row = 0; row < kB * kT; ++row) {
      for (int p = 0; p < 3; ++p) {
        const auto& src = ref_.at(p == 0 ? "q" : p == 1 ? "k" : "v");
        for (std::uint64_t j = 0; j < kH; ++j)
          f[row * 3 * kH + p * kH + j] = src[row * kH + j] * (p == 1 ? 1 + k_bug : 1);
      }
    }
    return make_buffer(DType::F32, {kB, kT, 3 * kH}, f);
  }
  Trace run(std::vector<std::pair<std::string, Buffer>> tensors) {
    std::vector<NamedTensor> named;
    for (auto& [n, b] : tensors) named.push_back({n, buffers_.emplace_back(std::move(b)).view()});
    return Trace::from_tensors(std::move(named), {});
  }
  Trace separate(DType dt, const std::map<std::string, std::vector<double>>& values) {
    std::vector<std::pair<std::string, Buffer>> t;
    for (const char* p : {"q", "k", "v"})
      t.push_back({std::string("model.layers.0.self_attn.") + p + "_proj.out",
                   make_buffer(dt, {kB, kT, kH}, values.at(p))});
    return run(std::move(t));
  }
  std::map<std::string, std::vector<double>> truth_, ref_;
  std::deque<Buffer> buffers_;
};

const char* kQkvMap = R"({"map": [{"test": "blocks.*.attention.qkv.out",
    "ref": ["model.layers.{1}.self_attn.q_proj.out", "model.layers.{1}.self_attn.k_proj.out",
            "model.layers.{1}.self_attn.v_proj.out"], "cat_dim": -1}]})";

JudgeOptions with_map(const char* json) {
  JudgeOptions o;
  o.map = std::make_shared<TensorMap>(TensorMap::parse(json, "map.json"));
  return o;
}

const TensorResult& result(const Report& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no result " + name);
}

TEST_F(FusedProjectionTest, OnlyThePieceWithTheBugFailsUnderItsRefName) {
  const Trace test = run({{"blocks.0.attention.qkv.out", fused(1e-3)}});
  const Trace ref = separate(DType::F32, ref_), truth = separate(DType::F64, truth_);
  const Report r = judge(test, ref, &truth, with_map(kQkvMap));
  ASSERT_EQ(r.tensors.size(), 3u);
  EXPECT_EQ(result(r, "model.layers.0.self_attn.q_proj.out").verdict, VerdictKind::kPass);
  EXPECT_EQ(result(r, "model.layers.0.self_attn.v_proj.out").verdict, VerdictKind::kPass);
  const TensorResult& k = result(r, "model.layers.0.self_attn.k_proj.out");
  EXPECT_EQ(k.verdict, VerdictKind::kFail) << k.reason;
  EXPECT_EQ(k.tags.at("test_source"), "blocks.0.attention.qkv.out[:, :, 40:80]");
  for (const auto& w : r.warnings)  // the scaled piece is biased too; nothing else is said
    EXPECT_EQ(w.rfind("model.layers.0.self_attn.k_proj.out: error balance", 0), 0u) << w;
  EXPECT_EQ(r.exit_code(), kNotAligned);
  const Report clean =
      judge(run({{"blocks.0.attention.qkv.out", fused(0)}}), ref, &truth, with_map(kQkvMap));
  EXPECT_EQ(clean.exit_code(), kAligned) << render_text(clean);
}

TEST_F(FusedProjectionTest, APieceJudgedInPlaceHasTheMetricsOfItsCopy) {
  // The independent oracle: the k piece copied out by hand, judged as a plain tensor.
  const Buffer f = fused(1e-3);
  std::vector<double> k_values;
  for (std::uint64_t row = 0; row < kB * kT; ++row)
    for (std::uint64_t j = 0; j < kH; ++j) k_values.push_back(ref_["k"][row * kH + j] * (1 + 1e-3));
  const Buffer k_copy = make_buffer(DType::F32, {kB, kT, kH}, k_values);
  const Trace ref = separate(DType::F32, ref_), truth = separate(DType::F64, truth_);
  const std::string k = "model.layers.0.self_attn.k_proj.out";
  const Trace plain = run({{k, k_copy}});
  JudgeOptions o;
  o.only = {k};
  JudgeOptions m = with_map(kQkvMap);
  m.only = {k};
  const Report want = judge(plain, ref, &truth, o);
  const Report got = judge(run({{"blocks.0.attention.qkv.out", f}}), ref, &truth, m);
  const Metrics &a = *result(want, k).metrics, &b = *result(got, k).metrics;
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.baseline, b.baseline);
  EXPECT_EQ(a.max_abs_ref, b.max_abs_ref);
  EXPECT_EQ(a.max_abs_ref_index, b.max_abs_ref_index);
  EXPECT_EQ(a.max_abs_truth_index, b.max_abs_truth_index);
  EXPECT_EQ(a.ulp.max_index, b.ulp.max_index);
  EXPECT_EQ(a.ulp.hist, b.ulp.hist);
  EXPECT_EQ(a.not_close, b.not_close);
  EXPECT_EQ(result(want, k).reason, result(got, k).reason);
}

TEST_F(FusedProjectionTest, SizesThatDoNotAddUpCannotBeJudgedNamingTheEntry) {
  Buffer narrow = make_buffer(DType::F32, {kB, kT, 2 * kH}, std::vector<double>(kB * kT * 2 * kH));
  const Trace test = run({{"blocks.0.attention.qkv.out", std::move(narrow)}});
  const Trace ref = separate(DType::F32, ref_), truth = separate(DType::F64, truth_);
  const Report r = judge(test, ref, &truth, with_map(kQkvMap));
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
  EXPECT_EQ(result(r, "model.layers.0.self_attn.q_proj.out").reason,
            "map.json: map entry 1: sizes do not add up: ref "
            "\"model.layers.0.self_attn.q_proj.out\" [3, 50, 40] + "
            "\"model.layers.0.self_attn.k_proj.out\" [3, 50, 40] + "
            "\"model.layers.0.self_attn.v_proj.out\" [3, 50, 40] along dim -1 do not make test "
            "\"blocks.0.attention.qkv.out\" [3, 50, 80]");
}

// A ref list naming one tensor twice: which piece is it? (Judging the last one passed a
// fused tensor whose first piece was garbage.)
TEST_F(FusedProjectionTest, ARefNamedTwiceInOneEntryCannotBeJudged) {
  std::vector<double> f(kB * kT * 3 * kH, 1e6);  // piece 1 garbage, then k, then q
  for (std::uint64_t row = 0; row < kB * kT; ++row) {
    for (std::uint64_t j = 0; j < kH; ++j) {
      f[row * 3 * kH + kH + j] = ref_["k"][row * kH + j];
      f[row * 3 * kH + 2 * kH + j] = ref_["q"][row * kH + j];
    }
  }
  const Trace test =
      run({{"blocks.0.attention.qkv.out", make_buffer(DType::F32, {kB, kT, 3 * kH}, f)}});
  const Trace ref = separate(DType::F32, ref_), truth = separate(DType::F64, truth_);
  const char* twice = R"({"map": [{"test": "blocks.*.attention.qkv.out",
      "ref": ["model.layers.{1}.self_attn.q_proj.out", "model.layers.{1}.self_attn.k_proj.out",
              "model.layers.{1}.self_attn.q_proj.out"], "cat_dim": -1}]})";
  JudgeOptions o = with_map(twice);
  o.only = {"*q_proj*", "*k_proj*"};
  const Report r = judge(test, ref, &truth, o);
  EXPECT_EQ(r.exit_code(), kCouldNotJudge) << render_text(r);
  const TensorResult& q = result(r, "model.layers.0.self_attn.q_proj.out");
  EXPECT_EQ(q.verdict, VerdictKind::kError);
  EXPECT_EQ(q.reason, "map.json: map entry 1 names it twice");
  for (const auto& w : r.warnings) {  // truth holds it: no "missing from truth" beside
    EXPECT_EQ(w.find("missing from truth"), std::string::npos) << w;
  }
}

// A map that ignores every tensor of ref judges nothing, and says so in its own words: it
// blamed only / --only when none was given (issue 35, 8).
TEST_F(FusedProjectionTest, AMapThatIgnoresEverythingSaysSo) {
  const Trace test = run({{"blocks.0.attention.qkv.out", fused(0)}});
  const Trace ref = separate(DType::F32, ref_), truth = separate(DType::F64, truth_);
  const Report r =
      judge(test, ref, &truth, with_map(R"({"map": [], "ignore": [{"ref": "*", "reason": "r"},
                                      {"test": "*", "reason": "r"}]})"));
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
  EXPECT_NE(std::find(r.could_not_judge.begin(), r.could_not_judge.end(),
                      "nothing was judged: map.json ignores or leaves out every tensor of ref"),
            r.could_not_judge.end())
      << render_text(r);
  JudgeOptions only = with_map(R"({"map": [], "ignore": [{"ref": "*", "reason": "r"},
                                   {"test": "*", "reason": "r"}]})");
  only.only = {"*q_proj*"};
  const Report o = judge(test, ref, &truth, only);
  EXPECT_NE(std::find(o.could_not_judge.begin(), o.could_not_judge.end(),
                      "nothing was judged: no tensor of ref matches only / --only (*q_proj*) "
                      "that map.json does not ignore"),
            o.could_not_judge.end())
      << render_text(o);
}

TEST_F(FusedProjectionTest, ARefTensorNobodyMapsCannotBeJudged) {
  const Trace test = run({{"blocks.0.attention.qkv.out", fused(0)}});
  std::vector<std::pair<std::string, Buffer>> more;
  for (const char* p : {"q", "k", "v"})
    more.push_back({std::string("model.layers.0.self_attn.") + p + "_proj.out",
                    make_buffer(DType::F32, {kB, kT, kH}, ref_[p])});
  more.push_back({"model.rotary_emb.out", make_buffer(DType::F32, {4}, {1, 2, 3, 4})});
  more.push_back({"model.norm.out", make_buffer(DType::F32, {4}, {1, 2, 3, 4})});
  const Trace ref = run(std::move(more));
  const Report r =
      judge(test, ref, nullptr, with_map(R"({"map": [{"test": "blocks.*.attention.qkv.out",
    "ref": ["model.layers.{1}.self_attn.q_proj.out", "model.layers.{1}.self_attn.k_proj.out",
            "model.layers.{1}.self_attn.v_proj.out"], "cat_dim": -1}],
    "ignore": [{"ref": "model.rotary_emb.*", "reason": "applied inside the fused kernel"}]})"));
  EXPECT_EQ(result(r, "model.norm.out").verdict, VerdictKind::kError);
  EXPECT_EQ(result(r, "model.norm.out").reason,
            "not mapped: no entry of map.json maps it, no ignore covers it, and test has no "
            "tensor of that name");
  EXPECT_THROW(result(r, "model.rotary_emb.out"), std::runtime_error) << "ignored: not judged";
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_NE(std::find(r.warnings.begin(), r.warnings.end(),
                      "the map leaves out 1 tensor(s) of ref matching \"model.rotary_emb.*\", "
                      "not judged: applied inside the fused kernel"),
            r.warnings.end());
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
}

TEST_F(FusedProjectionTest, AnEntryPointingPastRefCannotBeJudged) {
  const Trace test = run({{"blocks.0.attention.qkv.out", fused(0)}});
  const Trace ref = separate(DType::F32, ref_);
  const Report r = judge(test, ref, nullptr, with_map(R"({"map": [
      {"test": "blocks.*.attention.qkv.out",
       "ref": ["model.layers.{1}.self_attn.q_proj.out", "l.{1}.k"], "cat_dim": -1}]})"));
  ASSERT_FALSE(r.could_not_judge.empty());
  EXPECT_EQ(r.could_not_judge.front(),
            "map.json: map entry 1: test \"blocks.0.attention.qkv.out\" maps to ref \"l.0.k\", "
            "which ref does not hold");
  // A match that names no ref tensor at all is no pair (`*` also matches submodules' tensors),
  // and an entry left with no pair says so; ref's tensors are then unmapped, so still not a pass.
  const Report none = judge(test, ref, nullptr, with_map(R"({"map": [
      {"test": "blocks.*.attention.qkv.out", "ref": ["l.{1}.q", "l.{1}.k"], "cat_dim": -1}]})"));
  EXPECT_TRUE(none.could_not_judge.empty());
  EXPECT_NE(std::find(none.warnings.begin(), none.warnings.end(),
                      "map.json: map entry 1 (test \"blocks.*.attention.qkv.out\") matched no "
                      "tensor of test whose ref tensors exist (ref has no \"l.0.q\", for one)"),
            none.warnings.end());
  EXPECT_EQ(none.exit_code(), kCouldNotJudge);
}

TEST_F(FusedProjectionTest, ATestListFormsOneFusedRefTensor) {
  // The other direction: ref is fused (one tensor), test holds q, k and v apart.
  std::vector<std::pair<std::string, Buffer>> parts;
  for (const char* p : {"q", "k", "v"}) {
    std::vector<double> v = ref_[p];
    if (std::string(p) == "v")
      for (auto& x : v) x *= 1 + 1e-3;
    parts.push_back({std::string("b.0.") + p, make_buffer(DType::F32, {kB, kT, kH}, v)});
  }
  const Trace test = run(std::move(parts));
  auto fused_of = [&](DType dt, const std::map<std::string, std::vector<double>>& values) {
    std::vector<double> f(kB * kT * 3 * kH);
    for (std::uint64_t row = 0; row < kB * kT; ++row)
      for (int p = 0; p < 3; ++p)
        for (std::uint64_t j = 0; j < kH; ++j)
          f[row * 3 * kH + p * kH + j] = values.at(p == 0 ? "q" : p == 1 ? "k" : "v")[row * kH + j];
    return run({{"m.0.qkv", make_buffer(dt, {kB, kT, 3 * kH}, f)}});
  };
  const Trace ref = fused_of(DType::F32, ref_), truth = fused_of(DType::F64, truth_);
  const char* json =
      R"({"map": [{"test": ["b.{1}.q", "b.{1}.k", "b.{1}.v"], "ref": "m.*.qkv", "cat_dim": 2}]})";
  const Report r = judge(test, ref, &truth, with_map(json));
  ASSERT_EQ(r.tensors.size(), 1u);
  EXPECT_EQ(r.tensors[0].name, "m.0.qkv");
  EXPECT_EQ(r.tensors[0].verdict, VerdictKind::kFail);
  EXPECT_EQ(r.tensors[0].tags.at("test_source"), "cat(b.0.q, b.0.k, b.0.v; dim 2)");
  // The error lies in v, the last third: the largest difference is found there.
  const auto idx = unravel_index(r.tensors[0].shape, r.tensors[0].metrics->max_abs_ref_index);
  EXPECT_GE(idx[2], 2 * kH);
}

TEST_F(FusedProjectionTest, ATransposedTestTensorIsReadThroughItsStrides) {
  // test holds k as [kH, kB * kT]: k transposed; q and v are not used.
  std::vector<double> kt(kH * kB * kT);
  for (std::uint64_t row = 0; row < kB * kT; ++row)
    for (std::uint64_t j = 0; j < kH; ++j) kt[j * kB * kT + row] = ref_["k"][row * kH + j];
  const Trace test = run({{"kt", make_buffer(DType::F32, {kH, kB * kT}, kt)}});
  std::vector<std::pair<std::string, Buffer>> r2, u2;
  r2.push_back({"k", make_buffer(DType::F32, {kB * kT, kH}, ref_["k"])});
  u2.push_back({"k", make_buffer(DType::F64, {kB * kT, kH}, truth_["k"])});
  const Trace ref = run(std::move(r2)), truth = run(std::move(u2));
  const Report r = judge(test, ref, &truth,
                         with_map(R"({"map": [{"test": "kt", "ref": "k", "transpose": [0, 1]}]})"));
  ASSERT_EQ(r.tensors.size(), 1u);
  EXPECT_EQ(r.tensors[0].verdict, VerdictKind::kPass) << r.tensors[0].reason;
  EXPECT_EQ(r.tensors[0].metrics->bits_differ, 0u) << "read back exactly as ref";
  EXPECT_EQ(r.tensors[0].tags.at("test_source"), "kt transposed");
}

// Tensor-parallel ranks against a single-process ref: a column-parallel output is sharded
// along its last dim, a replicated one must agree on every rank.
class RanksTest : public FusedProjectionTest {
 protected:
  // `ranks` traces: rank r holds columns [r * w, (r + 1) * w) of k, and all of q.
  std::vector<Trace> rank_runs(std::size_t ranks, double q_bug_on_last = 0) {
    std::vector<Trace> out;
    const std::uint64_t w = kH / ranks;
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<double> piece;
      for (std::uint64_t row = 0; row < kB * kT; ++row)
        for (std::uint64_t j = r * w; j < (r + 1) * w; ++j)
          piece.push_back(ref_["k"][row * kH + j]);
      std::vector<double> q = ref_["q"];
      if (r + 1 == ranks && q_bug_on_last != 0) q[5] *= 1 + q_bug_on_last;
      out.push_back(run({{"k", make_buffer(DType::F32, {kB, kT, w}, piece)},
                         {"q", make_buffer(DType::F32, {kB, kT, kH}, q)}}));
    }
    return out;
  }
  Trace single(DType dt, const std::map<std::string, std::vector<double>>& v) {
    return run({{"k", make_buffer(dt, {kB, kT, kH}, v.at("k"))},
                {"q", make_buffer(dt, {kB, kT, kH}, v.at("q"))}});
  }
};

// A tensor only rank 1 holds (not rank 0, not ref) was in no list: the run passed.
TEST_F(RanksTest, ATensorOnlyALaterRankHoldsCannotBeJudged) {
  const Trace ref = single(DType::F32, ref_), truth = single(DType::F64, truth_);
  const char* map =
      R"({"map": [{"ref": "k", "sharded_dim": -1}, {"ref": "q", "replicated": true}]})";
  std::vector<Trace> runs = rank_runs(2);
  const Trace rank0 = std::move(runs[0]);
  std::vector<std::pair<std::string, Buffer>> with_extra;
  for (const auto& e : runs[1].entries()) {
    std::vector<double> v(e.view.numel());
    for (std::uint64_t i = 0; i < v.size(); ++i) v[i] = to_double(DType::F32, e.view.data + 4 * i);
    with_extra.push_back({e.name, make_buffer(DType::F32, e.view.shape, v)});
  }
  with_extra.push_back({"stray", make_buffer(DType::F32, {4}, {1e9, 1e9, 1e9, 1e9})});
  const Trace rank1 = run(std::move(with_extra));
  const Report r = judge({&rank0, &rank1}, ref, &truth, with_map(map));
  EXPECT_EQ(r.exit_code(), kCouldNotJudge) << render_text(r);
  const TensorResult& stray = result(r, "stray");
  EXPECT_EQ(stray.verdict, VerdictKind::kError);
  EXPECT_EQ(stray.reason, "only on rank 1 of test: rank 0 and ref have no tensor of that name");
}

TEST_F(RanksTest, ShardsAreJudgedAsOneTensorAndReplicasMustAgree) {
  const Trace ref = single(DType::F32, ref_), truth = single(DType::F64, truth_);
  const char* map =
      R"({"map": [{"ref": "k", "sharded_dim": -1}, {"ref": "q", "replicated": true}]})";
  for (std::size_t ranks : {2u, 4u}) {
    std::vector<Trace> runs = rank_runs(ranks);
    std::vector<const Trace*> test;
    for (const auto& t : runs) test.push_back(&t);
    const Report r = judge(test, ref, &truth, with_map(map));
    EXPECT_EQ(r.exit_code(), kAligned) << render_text(r);
    EXPECT_EQ(result(r, "k").metrics->bits_differ, 0u) << "the shards read back as ref";
    EXPECT_EQ(result(r, "k").tags.at("test_source"),
              "k on ranks 0-" + std::to_string(ranks - 1) + " along dim -1");
    // Without a map, k is taken as replicated: its ranks hold other columns, so it fails,
    // and the message says how to declare the shards.
    const Report plain = judge(test, ref, &truth, JudgeOptions{});
    const TensorResult& k = result(plain, "k");
    EXPECT_EQ(k.verdict, VerdictKind::kFail);
    EXPECT_EQ(k.reason.rfind("replicated, but rank 1 differs from rank 0 in ", 0), 0u) << k.reason;
    EXPECT_NE(k.reason.find("if the ranks hold pieces of it, say so in a map entry "
                            "(\"sharded_dim\")"),
              std::string::npos);
  }
}

TEST_F(RanksTest, AReplicaThatDiffersFailsNamingTheRankAndElement) {
  const Trace ref = single(DType::F32, ref_), truth = single(DType::F64, truth_);
  std::vector<Trace> runs = rank_runs(2, 1e-3);
  const Report r = judge({&runs[0], &runs[1]}, ref, &truth,
                         with_map(R"({"map": [{"ref": "k", "sharded_dim": 2}]})"));
  const TensorResult& q = result(r, "q");
  EXPECT_EQ(q.verdict, VerdictKind::kFail);
  EXPECT_EQ(q.reason.rfind("replicated, but rank 1 differs from rank 0 in 1 element(s), the first "
                           "at (0, 0, 5): ",
                           0),
            0u)
      << q.reason;
  EXPECT_EQ(r.exit_code(), kNotAligned);
}

TEST(RankPathTest, NamedAsDistributedSaveNamesThem) {
  EXPECT_EQ(rank_trace_path("out/run.safetensors", 3), "out/run.rank3.safetensors");
  EXPECT_EQ(rank_trace_path("out/run", 0), "out/run.rank0.safetensors");
  EXPECT_EQ(rank_trace_path("a.b/.hidden", 1), "a.b/.hidden.rank1.safetensors");
  EXPECT_EQ(rank_trace_path("x.tar.st", 2), "x.tar.rank2.st");
}

}  // namespace
}  // namespace numalign
