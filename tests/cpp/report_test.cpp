// report_test.cpp: a Report's order, counts, exit code and worst tensor, and its text, JSON
// and JUnit renderings (names escaped in each).
#include "numalign/report.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "temp_dir.hpp"

namespace numalign {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TensorResult result(const std::string& name, VerdictKind verdict, std::optional<double> ratio,
                    std::optional<double> limit, std::size_t order) {
  TensorResult r;
  r.name = name;
  r.verdict = verdict;
  r.rule = "rmse";
  r.reason = verdict == VerdictKind::kPass ? "within the limit" : "beyond the limit";
  r.dtype = DType::BF16;
  r.shape = {2, 2};
  r.ratio = ratio;
  r.limit = limit;
  r.order = order;
  return r;
}

std::vector<std::string> names(const Report& r) {
  std::vector<std::string> out;
  for (const auto& t : r.tensors) out.push_back(t.name);
  return out;
}

TEST(ReportTest, SeverityIsRatioOverLimit) {
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, 6.0, 3.0, 0)), 2.0);
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, 0.5, 2.0, 0)), 0.25);
  // A limit of 0 (exact, ulp:0): any excess is infinitely severe, none is 0.
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, 1.0, 0.0, 0)), kInf);
  EXPECT_EQ(severity(result("a", VerdictKind::kPass, 0.0, 0.0, 0)), 0.0);
  // Without a measure, or with NaN, nothing is known to be better: the most severe.
  EXPECT_EQ(severity(result("a", VerdictKind::kError, std::nullopt, std::nullopt, 0)), kInf);
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, 2.0, std::nullopt, 0)), kInf);
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, std::nan(""), 3.0, 0)), kInf);
  // Nor is an infinite ratio over an infinite limit, or a NaN limit: never NaN, which no
  // sort could order.
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, kInf, kInf, 0)), kInf);
  EXPECT_EQ(severity(result("a", VerdictKind::kFail, 2.0, std::nan(""), 0)), kInf);
}

TEST(ReportTest, SortPutsErrorsThenFailuresWorstFirstThenPassesInOrder) {
  Report r;
  r.tensors = {
      result("pass.late", VerdictKind::kPass, 9.0, 3.0, 7),  // a pass's ratio does not sort it
      result("fail.mild", VerdictKind::kFail, 4.0, 3.0, 1),
      result("error.late", VerdictKind::kError, std::nullopt, std::nullopt, 6),
      result("pass.early", VerdictKind::kPass, 0.5, 3.0, 0),
      result("fail.bad", VerdictKind::kFail, 30.0, 3.0, 5),
      result("fail.exact", VerdictKind::kFail, 1.0, 0.0, 4),
      result("fail.mild.tie", VerdictKind::kFail, 8.0, 6.0, 3),  // 4/3 too: order breaks it
      result("error.early", VerdictKind::kError, std::nullopt, std::nullopt, 2),
  };
  r.sort();
  EXPECT_EQ(names(r),
            (std::vector<std::string>{"error.early", "error.late", "fail.exact", "fail.bad",
                                      "fail.mild", "fail.mild.tie", "pass.early", "pass.late"}));
  // The results moved whole, not only their names.
  EXPECT_EQ(r.tensors[3].ratio, 30.0);
  EXPECT_EQ(r.tensors[3].order, 5u);
  EXPECT_EQ(r.tensors[7].ratio, 9.0);
}

// Report::sort against the plainest oracle: std::stable_sort of whole results by the
// documented order. Passes already in order take the sort's sliding path; passes out of order,
// or sharing an order, the general one; failures tie on severity and carry infinities.
TEST(ReportTest, SortAgreesWithAStableSortOfWholeResults) {
  const auto rank = [](VerdictKind k) {
    return k == VerdictKind::kError ? 0 : k == VerdictKind::kFail ? 1 : 2;
  };
  const auto before = [&](const TensorResult& a, const TensorResult& b) {
    if (rank(a.verdict) != rank(b.verdict)) return rank(a.verdict) < rank(b.verdict);
    if (a.verdict == VerdictKind::kFail && severity(a) != severity(b))
      return severity(a) > severity(b);
    return a.order < b.order;
  };
  std::mt19937 rng(7);
  for (int round = 0; round < 400; ++round) {
    const std::size_t n = rng() % 40;
    const int pass_share = static_cast<int>(rng() % 4);  // 0: none pass ... 3: most pass
    const bool passes_in_order = rng() % 2;
    Report r;
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned roll = rng() % 8;
      const VerdictKind kind = static_cast<int>(roll % 4) < pass_share ? VerdictKind::kPass
                               : roll % 3 == 0                         ? VerdictKind::kError
                                                                       : VerdictKind::kFail;
      const double ratios[] = {1.0, 2.0, 4.0, kInf, std::nan("")};
      const double limits[] = {0.0, 1.0, 2.0, kInf};
      const std::size_t order = passes_in_order ? i : rng() % n;  // repeats out of order
      TensorResult t =
          result("t" + std::to_string(i), kind, ratios[rng() % 5], limits[rng() % 4], order);
      t.reason = "reason of t" + std::to_string(i) + std::string(20, 'x');  // on the heap
      t.metrics.emplace().numel = i;
      r.tensors.push_back(std::move(t));
    }
    std::vector<TensorResult> expected = r.tensors;
    std::stable_sort(expected.begin(), expected.end(), before);
    r.sort();
    ASSERT_EQ(r.tensors.size(), expected.size());
    for (std::size_t i = 0; i < n; ++i) {
      const TensorResult &got = r.tensors[i], &want = expected[i];
      ASSERT_EQ(got.name, want.name) << "round " << round << ", position " << i;
      ASSERT_EQ(got.reason, want.reason);
      ASSERT_EQ(got.order, want.order);
      ASSERT_TRUE(got.metrics);
      ASSERT_EQ(got.metrics->numel, want.metrics->numel);
    }
  }
}

TEST(ReportTest, CountsVerdictAndExitCode) {
  Report r;
  EXPECT_TRUE(r.aligned());
  EXPECT_EQ(r.exit_code(), kAligned);
  EXPECT_EQ(r.worst(), nullptr);

  r.tensors = {result("a", VerdictKind::kPass, 1.0, 3.0, 0),
               result("b", VerdictKind::kPass, 2.0, 3.0, 1)};
  EXPECT_TRUE(r.aligned());
  EXPECT_EQ(r.count(VerdictKind::kPass), 2u);
  EXPECT_EQ(r.exit_code(), kAligned);
  EXPECT_EQ(r.worst(), nullptr) << "passes are never the worst";

  r.tensors.push_back(result("c", VerdictKind::kFail, 4.0, 3.0, 2));
  r.tensors.push_back(result("d", VerdictKind::kFail, 9.0, 3.0, 3));
  EXPECT_FALSE(r.aligned());
  EXPECT_EQ(r.count(VerdictKind::kFail), 2u);
  EXPECT_EQ(r.exit_code(), kNotAligned);
  ASSERT_NE(r.worst(), nullptr);
  EXPECT_EQ(r.worst()->name, "d");

  // Could not judge outranks a failure, in the exit code and as the worst.
  r.tensors.push_back(result("e", VerdictKind::kError, std::nullopt, std::nullopt, 4));
  EXPECT_EQ(r.count(VerdictKind::kError), 1u);
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
  EXPECT_EQ(r.worst()->name, "e");
}

TEST(ReportTest, TextListsFailuresFirstAndEndsWithTheSummary) {
  Report r;
  r.title = "test.safetensors vs ref.safetensors";
  r.settings = "rule rmse, tol 1e-04";
  r.tensors = {result("layer.ok", VerdictKind::kPass, 1.25, 3.0, 0),
               result("layer.bad", VerdictKind::kFail, 4.5, 3.0, 1),
               result("layer.fine", VerdictKind::kPass, 0.75, 3.0, 2)};
  r.sort();
  const std::string text = render_text(r);
  EXPECT_TRUE(
      text.starts_with("numalign judge\n  test.safetensors vs ref.safetensors\n"
                       "  settings: rule rmse, tol 1e-04\n"))
      << text;
  const auto bad = text.find("FAIL     layer.bad"), ok = text.find("PASS     layer.ok"),
             fine = text.find("PASS     layer.fine");
  ASSERT_NE(bad, std::string::npos) << text;
  ASSERT_NE(ok, std::string::npos) << text;
  ASSERT_NE(fine, std::string::npos) << text;
  EXPECT_LT(bad, ok);
  EXPECT_LT(ok, fine);
  // A failure's reason follows it; a pass's only with verbose.
  EXPECT_NE(text.find("\n         beyond the limit\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("within the limit"), std::string::npos) << text;
  EXPECT_NE(render_text(r, /*verbose=*/true).find("within the limit"), std::string::npos);
  EXPECT_TRUE(
      text.ends_with("\nNOT ALIGNED: 2 of 3 tensors pass, 1 fail; worst: layer.bad (ratio 4.5, "
                     "limit 3)\n"))
      << text;
  EXPECT_EQ(render_summary(r),
            "NOT ALIGNED: 2 of 3 tensors pass, 1 fail; worst: layer.bad (ratio 4.5, limit 3)");

  r.tensors.push_back(result("missing", VerdictKind::kError, std::nullopt, std::nullopt, 3));
  EXPECT_EQ(render_summary(r),
            "COULD NOT JUDGE: 2 of 4 tensors pass, 1 fail, 1 could not be judged; worst: missing");
  r.tensors = {result("a", VerdictKind::kPass, 1.0, 3.0, 0)};
  EXPECT_EQ(render_summary(r), "ALIGNED: 1 of 1 tensors pass");
}

// A PASS row never shows a ratio above its limit without saying why it passed.
TEST(ReportTest, APassAboveItsLimitSaysWhy) {
  Report r;
  r.tensors = {result("fast_path", VerdictKind::kPass, 6.9, 2.0, 0),
               result("within", VerdictKind::kPass, 1.5, 2.0, 1)};
  r.tensors[0].reason = "allclose to ref at tol 0.0001";
  const std::string text = render_text(r);
  EXPECT_NE(text.find("PASS     fast_path"), std::string::npos) << text;
  EXPECT_NE(text.find("\n         allclose to ref at tol 0.0001\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("within the limit"), std::string::npos) << text;
}

TEST(ReportTest, TextShowsFiftyPassesUnlessVerbose) {
  Report r;
  for (std::size_t i = 0; i < 53; ++i) {
    r.tensors.push_back(result("t" + std::to_string(i), VerdictKind::kPass, 1.0, 3.0, i));
  }
  const std::string text = render_text(r);
  EXPECT_NE(text.find("PASS     t49 "), std::string::npos);
  EXPECT_EQ(text.find("PASS     t50 "), std::string::npos);
  EXPECT_NE(text.find("... 3 more passing tensors (--verbose lists all)"), std::string::npos);
  const std::string all = render_text(r, /*verbose=*/true);
  EXPECT_NE(all.find("PASS     t52 "), std::string::npos);
  EXPECT_EQ(all.find("more passing tensors"), std::string::npos);
}

TEST(ReportTest, SummaryNamesTheFirstDivergenceBeforeTheWorstTensor) {
  Report r;
  r.tensors = {result("layers.1.mlp.out", VerdictKind::kFail, 4.5, 3.0, 0),
               result("layers.1.mlp.act_fn.grad", VerdictKind::kFail, 40.0, 3.0, 1)};
  r.sort();
  FirstDivergence d;
  d.forward = DivergencePoint{"layers.1.mlp.out", "layers.1.mlp", true, {}, ""};
  r.first_divergence = d;
  EXPECT_EQ(render_summary(r),
            "NOT ALIGNED: 0 of 2 tensors pass, 2 fail; culprit: module layers.1.mlp (forward, "
            "layers.1.mlp.out); worst: layers.1.mlp.act_fn.grad (ratio 40, limit 3)");
  // Inherited (or inputs not recorded): named as where it first shows, not as the culprit.
  r.first_divergence->forward->inputs_aligned = false;
  EXPECT_NE(render_summary(r).find("; first divergence: module layers.1.mlp (forward, "
                                   "layers.1.mlp.out); worst: layers.1.mlp.act_fn.grad"),
            std::string::npos)
      << render_summary(r);
  // Backward only, from the model itself.
  r.first_divergence =
      FirstDivergence{std::nullopt, DivergencePoint{"grad.param.w\n", "", true, {}, ""}};
  EXPECT_NE(render_summary(r).find("; culprit: module (model) (backward, grad.param.w\\x0a);"),
            std::string::npos)
      << render_summary(r);
  // Isolation: the worst module when nothing else says where.
  r.first_divergence.reset();
  r.ranking = {ModuleRank{"layers.1.mlp", "layers.1.mlp.out", 4.5, 3.0, false}};
  EXPECT_NE(render_summary(r).find("; worst module in isolation: layers.1.mlp; worst: "),
            std::string::npos)
      << render_summary(r);
  r.ranking.front().aligned = true;
  EXPECT_EQ(render_summary(r).find("isolation"), std::string::npos);
}

TEST(ReportTest, TextTableNeverCutsTheLayerIndexOutOfAName) {
  Report r;
  for (int layer : {7, 11}) {
    r.tensors.push_back(
        result("grad.param.model.layers." + std::to_string(layer) + ".self_attn.q_proj.weight",
               VerdictKind::kFail, 4.5 + layer, 3.0, layer));
  }
  const std::string hostile = "x" + std::string(60, 'y') + ".out";  // nothing to drop: wrapped
  r.tensors.push_back(result(hostile, VerdictKind::kFail, 4.0, 3.0, 20));
  r.sort();
  const std::string text = render_text(r);
  EXPECT_NE(text.find("\nFAIL     grad..11.self_attn.q_proj.weight" + std::string(7, ' ') + "rmse"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nFAIL     grad..layers.7.self_attn.q_proj.weight rmse"), std::string::npos)
      << text;
  // Too long for its column even shortened: whole on its row, the numbers on the next line.
  EXPECT_NE(text.find("\nFAIL     " + hostile + "\n" + std::string(48, ' ') + "rmse"),
            std::string::npos)
      << text;
  // Verbose: every name whole.
  const std::string all = render_text(r, /*verbose=*/true);
  EXPECT_NE(all.find("\nFAIL     grad.param.model.layers.11.self_attn.q_proj.weight\n" +
                     std::string(48, ' ') + "rmse"),
            std::string::npos)
      << all;
  EXPECT_EQ(all.find(".."), std::string::npos) << all;
}

TEST(ReportTest, TextEscapesControlCharactersInNamesAndReasons) {
  Report r;
  TensorResult bad = result("evil\nPASS     forged\x01", VerdictKind::kFail, 4.5, 3.0, 0);
  bad.reason = "line one\rline two";
  r.tensors = {bad};
  r.warnings = {"a warning\x1b[31m in red"};
  const std::string text = render_text(r);
  EXPECT_EQ(text.find("\nPASS     forged"), std::string::npos) << "a name forged a row:\n" << text;
  EXPECT_NE(text.find("evil\\x0aPASS     forged\\x01"), std::string::npos) << text;
  EXPECT_NE(text.find("line one\\x0dline two"), std::string::npos) << text;
  EXPECT_NE(text.find("  - a warning\\x1b[31m in red\n"), std::string::npos) << text;
  EXPECT_NE(render_summary(r).find("worst: evil\\x0aPASS     forged\\x01"), std::string::npos);
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE(u >= 0x20 || c == '\n') << "raw control character " << int{u};
  }
}

TEST(ReportTest, JunitSuitesOnePerReportNamedAndEscaped) {
  Report a, b;
  a.tensors = {result("x", VerdictKind::kPass, 0.5, 3.0, 0)};
  b.tensors = {result("y<\u202e", VerdictKind::kFail, 4.5, 3.0, 0),
               result("z", VerdictKind::kPass, 0.5, 3.0, 1)};
  const std::string xml = render_junit_suites({{"t.py::a&\n", &a}, {"t.py::b", &b}});
  EXPECT_EQ(xml.rfind("<?xml", 0), 0u);
  EXPECT_NE(xml.find("<testsuite name=\"t.py::a&amp;&#10;\" tests=\"1\" failures=\"0\""),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testsuite name=\"t.py::b\" tests=\"2\" failures=\"1\""), std::string::npos);
  // Each test case named by the test that judged it (classname) and its tensor (name).
  EXPECT_NE(xml.find("<testcase classname=\"t.py::a&amp;&#10;\" name=\"x\">"), std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testcase classname=\"t.py::b\" name=\"y&lt;&#x202e;\"><failure"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testcase classname=\"t.py::b\" name=\"z\">"), std::string::npos) << xml;
  EXPECT_EQ(xml.find("numalign.rmse"), std::string::npos) << xml;
  EXPECT_EQ(xml.find("<testsuites>"), xml.rfind("<testsuites>")) << "one document";
  // The run that could not be judged, too.
  b.could_not_judge = {"nothing was judged"};
  EXPECT_NE(render_junit_suites({{"t.py::b", &b}})
                .find("<testcase classname=\"t.py::b\" name=\"(the run)\"><error"),
            std::string::npos);
  EXPECT_NE(render_junit(b).find("<testcase classname=\"numalign\" name=\"(the run)\"><error"),
            std::string::npos);
}

TEST(ReportTest, JsonFieldsParseBack) {
  Report r;
  r.settings = "rule rmse";
  r.warnings = {"TF32 was on"};
  TensorResult with_metrics = result("w\"\n\x02", VerdictKind::kFail, 4.5, 3.0, 0);
  Metrics m;
  m.numel = 4;
  m.floating = true;
  m.max_abs_ref = 0.25;
  m.max_abs_ref_index = 3;
  m.values_differ = 2;
  m.ulp.max = 3;
  m.ulp.max_index = 2;
  m.ulp.hist.set(0, 2);
  m.ulp.hist.set(1, 1);
  m.ulp.hist.set(ulp_bin(3), 1);
  m.test_nonfinite.nan = 1;
  with_metrics.metrics = m;
  TensorResult ulp_rule = result("u", VerdictKind::kPass, 7.0, 8.0, 1);
  ulp_rule.rule = "ulp:8";  // its ratio is not an rmse ratio: not max_ratio
  TensorResult missing = result("gone", VerdictKind::kError, std::nullopt, std::nullopt, 2);
  missing.rule = "";
  missing.dtype.reset();
  r.tensors = {with_metrics, ulp_rule, missing};
  r.sort();

  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  const std::string json = render_json(r);
  ASSERT_FALSE(parser.parse(json).get(doc)) << json;
  EXPECT_FALSE(bool(doc["aligned"]));
  simdjson::dom::element s = doc["summary"];
  EXPECT_EQ(std::uint64_t(s["tensors"]), 3u);
  EXPECT_EQ(std::uint64_t(s["passed"]), 1u);
  EXPECT_EQ(std::uint64_t(s["failed"]), 1u);
  EXPECT_EQ(std::uint64_t(s["errors"]), 1u);
  EXPECT_EQ(double(s["max_ratio"]), 4.5);
  EXPECT_EQ(std::string_view(s["worst"]), "gone");
  EXPECT_EQ(std::string_view(s["settings"]), "rule rmse");
  EXPECT_EQ(std::string_view(doc["warnings"].at(0)), "TF32 was on");
  EXPECT_TRUE(doc["first_divergence"].error()) << "absent unless the report has one";

  simdjson::dom::array tensors = doc["tensors"];
  ASSERT_EQ(tensors.size(), 3u);
  simdjson::dom::element gone = tensors.at(0);  // errors first
  EXPECT_EQ(std::string_view(gone["verdict"]), "error");
  EXPECT_TRUE(gone["dtype"].is_null());
  EXPECT_TRUE(gone["numel"].is_null());
  EXPECT_TRUE(gone["ratio"].is_null());
  EXPECT_TRUE(gone["ulp_hist"].is_null());
  EXPECT_TRUE(gone["nonfinite"].is_null());

  simdjson::dom::element w = tensors.at(1);
  EXPECT_EQ(std::string_view(w["name"]), "w\"\n\x02") << "the name round-trips";
  EXPECT_EQ(std::string_view(w["verdict"]), "fail");
  EXPECT_EQ(std::string_view(w["dtype"]), "BF16");
  EXPECT_EQ(std::uint64_t(w["shape"].at(1)), 2u);
  EXPECT_EQ(std::uint64_t(w["numel"]), 4u);
  EXPECT_EQ(double(w["ratio"]), 4.5);
  EXPECT_EQ(double(w["limit"]), 3.0);
  EXPECT_TRUE(w["error"].is_null()) << "no truth";
  EXPECT_TRUE(w["bias"].is_null());
  EXPECT_EQ(double(w["max_abs_ref"]), 0.25);
  EXPECT_EQ(std::uint64_t(w["max_abs_ref_index"].at(0)), 1u);  // flat 3 in [2, 2]
  EXPECT_EQ(std::uint64_t(w["max_abs_ref_index"].at(1)), 1u);
  EXPECT_EQ(std::uint64_t(w["max_ulp"]), 3u);
  EXPECT_EQ(double(w["frac_diff"]), 0.5);
  simdjson::dom::object hist = w["ulp_hist"];
  EXPECT_EQ(hist.size(), 3u) << "empty bins are left out";
  EXPECT_EQ(std::uint64_t(hist["0"]), 2u);
  EXPECT_EQ(std::uint64_t(hist["1"]), 1u);
  EXPECT_EQ(std::uint64_t(hist["3-4"]), 1u);
  EXPECT_EQ(std::uint64_t(w["nonfinite"]["test"]["nan"]), 1u);
  EXPECT_TRUE(w["nonfinite"]["truth"].error()) << "no truth, no truth counts";

  EXPECT_EQ(std::string_view(tensors.at(2)["rule"]), "ulp:8");
}

// Many tensors: the JSON goes out in pieces as it is produced, and the pieces, the string
// and the file written through them are the same bytes.
TEST(ReportTest, JsonStreamedInPiecesIsTheSameDocument) {
  Report r;
  r.settings = "rule rmse";
  for (std::size_t i = 0; i < 20'000; ++i) {
    TensorResult t = result("layers." + std::to_string(i / 100) + ".t" + std::to_string(i % 100),
                            i % 97 ? VerdictKind::kPass : VerdictKind::kFail,
                            i % 97 ? 1.0 : 5.0 + static_cast<double>(i), 3.0, i);
    Metrics m;
    m.numel = 4;
    m.floating = true;
    m.ulp.hist.set(0, 3);
    m.ulp.hist.set(1, 1);
    t.metrics = m;
    r.tensors.push_back(std::move(t));
  }
  r.sort();
  const std::string whole = render_json(r);
  std::string joined;
  std::size_t pieces = 0, largest = 0;
  render_json(r, [&](std::string_view piece) {
    joined += piece;
    ++pieces;
    largest = std::max(largest, piece.size());
  });
  EXPECT_EQ(joined, whole);
  EXPECT_GT(pieces, 3u) << whole.size() << " bytes in one piece";
  for (const int threads : {1, 3}) {  // blocks formatted on one thread or several: one text
    std::string again;
    render_json(
        r, [&](std::string_view piece) { again += piece; }, threads);
    EXPECT_EQ(again, whole) << threads << " thread(s)";
  }
  EXPECT_LT(largest, std::size_t{2} << 20);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_FALSE(parser.parse(whole).get(doc));
  EXPECT_EQ(simdjson::dom::array(doc["tensors"]).size(), 20'000u);
  // The tensors are formatted in blocks on several threads: each comes out whole, in order.
  std::size_t at = 0;
  for (simdjson::dom::element t : simdjson::dom::array(doc["tensors"])) {
    ASSERT_EQ(std::string_view(t["name"]), r.tensors[at].name) << at;
    ASSERT_EQ(std::int64_t(t["ulp_hist"]["0"]), 3) << at;
    ASSERT_EQ(std::int64_t(t["ulp_hist"]["1"]), 1) << at;
    ++at;
  }

  testing::TempDir dir;
  for (const int threads : {0, 1}) {
    write_json_file(r, dir.file("report.json"), threads);
    std::ifstream in(dir.file("report.json"), std::ios::binary);
    std::stringstream read;
    read << in.rdbuf();
    EXPECT_EQ(read.str(), whole) << threads << " thread(s)";
  }
}

// Indices in JSON are unravel_index's, whatever the rank (short ranks are formatted without a
// vector of their own): scalars and empty tensors have none.
TEST(ReportTest, JsonIndicesAreUnravelledForEveryRank) {
  const std::vector<Shape> shapes = {{},        {5},       {0},         {3, 4},      {2, 0, 3},
                                     {2, 3, 4}, {1, 1, 1}, Shape(8, 2), Shape(9, 2), Shape(12, 3)};
  Report r;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    TensorResult t = result("t" + std::to_string(i), VerdictKind::kPass, 1.0, 3.0, i);
    t.shape = shapes[i];
    Metrics m;
    m.numel = 1;
    for (auto d : shapes[i]) m.numel *= d;
    m.max_abs_ref_index = m.numel ? (m.numel * 7 / 11) % m.numel : 0;
    t.metrics = m;
    r.tensors.push_back(std::move(t));
  }
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  const std::string text = render_json(r);
  ASSERT_FALSE(parser.parse(text).get(doc));
  std::size_t i = 0;
  for (simdjson::dom::element t : simdjson::dom::array(doc["tensors"])) {
    std::vector<std::uint64_t> index;
    for (simdjson::dom::element v : simdjson::dom::array(t["max_abs_ref_index"])) {
      index.push_back(std::uint64_t(v));
    }
    const Metrics& m = *r.tensors[i].metrics;
    EXPECT_EQ(index, unravel_index(shapes[i], m.max_abs_ref_index)) << "shape " << i;
    ++i;
  }
  EXPECT_EQ(i, shapes.size());
}

TEST(ReportTest, JunitHasOneCasePerTensorWithEscapedNames) {
  Report r;
  r.warnings = {"inputs differ <fingerprints>"};
  r.tensors = {result("a<b>&\"c\"", VerdictKind::kFail, 4.5, 3.0, 0),
               result("gone", VerdictKind::kError, std::nullopt, std::nullopt, 1),
               result("ok", VerdictKind::kPass, 1.0, 3.0, 2)};
  r.tensors[1].reason = "missing in test";
  const std::string xml = render_junit(r);
  EXPECT_TRUE(
      xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                      "<testsuites><testsuite name=\"numalign\" tests=\"3\" "
                      "failures=\"1\" errors=\"1\">\n"))
      << xml;
  EXPECT_TRUE(xml.ends_with("</testsuite></testsuites>\n")) << xml;
  EXPECT_NE(xml.find("<system-out>warning: inputs differ &lt;fingerprints&gt;\n</system-out>"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testcase classname=\"numalign.rmse\" name=\"a&lt;b&gt;&amp;&quot;c&quot;\">"
                     "<failure message=\"beyond the limit (ratio 4.5, limit 3)\"/></testcase>"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("name=\"gone\"><error message=\"missing in test\"/></testcase>"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("name=\"ok\"></testcase>"), std::string::npos) << xml;
  std::size_t cases = 0;
  for (auto at = xml.find("<testcase "); at != std::string::npos;
       at = xml.find("<testcase ", at + 1))
    ++cases;
  EXPECT_EQ(cases, 3u);
}

}  // namespace
}  // namespace numalign
