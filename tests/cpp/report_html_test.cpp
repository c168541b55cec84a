// report_html_test.cpp: the HTML report is self-contained, escapes every name, and shows
// the first divergence and the three charts. (tests/python/test_html_report.py renders it
// in headless Chromium.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "numalign/divergence.hpp"
#include "numalign/judge.hpp"
#include "tensor_store.hpp"

namespace numalign {
namespace {

class HtmlReportTest : public ::testing::Test {
 protected:
  // Two tensors: one matching the reference, one off by a tenth of each value.
  Report judge_two(const std::string& bad_name, bool profile) {
    std::vector<TensorTriple> triples;
    for (const std::string& name : {std::string("good"), bad_name}) {
      const bool bad = name == bad_name;
      std::vector<float> t(64), r(64);
      std::vector<double> u(64);
      for (int i = 0; i < 64; ++i) {
        u[i] = std::ldexp(1.0 + i / 64.0 + 1e-9, i % 8 - 4);  // not a float: ref errs too
        r[i] = static_cast<float>(u[i]);
        t[i] = static_cast<float>(bad ? u[i] * 1.1 : u[i]);
      }
      triples.push_back({name, view(DType::F32, t), view(DType::F32, r), view(DType::F64, u)});
    }
    JudgeOptions o;
    o.magnitude_profile = profile;
    return judge_tensors(triples, o);
  }

  template <typename T>
  const TensorView* view(DType dt, const std::vector<T>& values) {
    return store_.view(dt, values);
  }

  static std::size_t count(const std::string& s, const std::string& what) {
    std::size_t n = 0;
    for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  }

  testing::TensorStore store_;
};

TEST_F(HtmlReportTest, NamesAreEscapedEverywhere) {
  const std::string hostile = "<script>alert('x')</script>&\"layer\"";
  const std::string html = render_html(judge_two(hostile, true));
  EXPECT_EQ(html.find(hostile), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&apos;x&apos;)&lt;/script&gt;&amp;&quot;layer&quot;"),
            std::string::npos);
  EXPECT_EQ(count(html, "<script>"), 1u) << "only the page's own sorting script";
  // In module paths too: the tree's summaries and the layer ticks.
  Report r = judge_two("bad", false);
  for (auto& t : r.tensors) t.tags = {{"module", hostile + ".layers.1.<b>"}, {"kind", "output"}};
  const std::string tree = render_html(r);
  EXPECT_EQ(tree.find(hostile), std::string::npos);
  EXPECT_EQ(tree.find("<b><b>"), std::string::npos);
  EXPECT_NE(tree.find(".layers.1.&lt;b&gt;</b> <span"), std::string::npos);
  EXPECT_EQ(count(tree, "<script>"), 1u);
}

TEST_F(HtmlReportTest, SelfContainedWithChartsAndTable) {
  Report r = judge_two("bad", true);
  TraceMetadata m;
  m.order = {"good", "bad"};
  m.tags = {{"good", {{"module", "a"}, {"kind", "output"}}},
            {"bad", {{"module", "b"}, {"kind", "output"}}}};
  r.first_divergence = find_first_divergence(m, r);
  const std::string html = render_html(r);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg")) << "no link but SVG's";
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos) << "nothing loaded";
  EXPECT_NE(html.find("<h1 class=\"fail\">NOT ALIGNED: 1 of 2 tensors pass"), std::string::npos);
  EXPECT_NE(html.find("first divergence, forward: bad (module b)"), std::string::npos);
  EXPECT_EQ(count(html, "<svg "), 3u);
  const std::string table = html.substr(html.find("<table id=\"tensors\">"));
  EXPECT_EQ(count(table, "<tr class="), 2u);
  EXPECT_LT(table.find("<tr class=\"fail\">"), table.find("<tr class=\"pass\">"))
      << "failures first";
  // Two tensors, two ratio points and two limit dashes; the magnitude chart has 8 bins of
  // |truth| (2^-4 .. 2^3) for test and ref.
  EXPECT_EQ(count(html, "<line class=\"limit\""), 2u);
  EXPECT_EQ(count(html, "<circle class=\"test\""), 8u);
  EXPECT_EQ(count(html, "<circle class=\"ref\""), 8u);
  EXPECT_NE(html.find("2^-4"), std::string::npos);
}

// Past 20,000 tensors the CLI keeps only the profiles' sum (1.5 KiB a tensor otherwise): the
// sum of what each tensor's profile would be, and the page still draws it.
TEST_F(HtmlReportTest, ManyTensorsKeepOnlyTheSumOfTheirMagnitudeProfiles) {
  std::vector<float> t(4), r(4);
  std::vector<double> u(4);
  for (int i = 0; i < 4; ++i) {
    u[i] = std::ldexp(1.0 + i / 8.0 + 1e-9, i - 2);
    r[i] = static_cast<float>(u[i]);
    t[i] = static_cast<float>(u[i] * 1.001);
  }
  const TensorView *tv = view(DType::F32, t), *rv = view(DType::F32, r), *uv = view(DType::F64, u);
  std::vector<TensorTriple> triples;
  for (std::size_t i = 0; i <= kProfileSummedPast; ++i)
    triples.push_back({"t" + std::to_string(i), tv, rv, uv});
  JudgeOptions o;
  o.magnitude_profile = true;
  const Report each = judge_tensors(triples, o);
  EXPECT_TRUE(each.magnitude.empty());
  o.magnitude_profile_sum_only = true;
  const Report summed = judge_tensors(triples, o);
  MagnitudeProfile all;
  for (const auto& x : each.tensors) all.add(x.metrics->magnitude);
  ASSERT_FALSE(summed.magnitude.empty());
  for (int b = 0; b < kMagnitudeBins; ++b)
    EXPECT_EQ(summed.magnitude.bins[b].count, all.bins[b].count) << b;
  for (int b = 0; b < kMagnitudeBins; ++b) {
    EXPECT_NEAR(summed.magnitude.bins[b].sq_err_test, all.bins[b].sq_err_test,
                1e-12 * all.bins[b].sq_err_test);
    EXPECT_NEAR(summed.magnitude.bins[b].sq_err_ref, all.bins[b].sq_err_ref,
                1e-12 * all.bins[b].sq_err_ref);
  }
  for (const auto& x : summed.tensors) EXPECT_TRUE(x.metrics->magnitude.empty());
  EXPECT_EQ(render_html(summed).find("Not measured"), std::string::npos);
}

TEST_F(HtmlReportTest, WithoutTheProfileTheChartSaysHowToGetIt) {
  const std::string html = render_html(judge_two("bad", false));
  EXPECT_NE(html.find("Not measured"), std::string::npos);
  EXPECT_EQ(count(html, "<svg "), 2u);
}

TEST_F(HtmlReportTest, MagnitudeProfileCountsEveryElementOnce) {
  const Report r = judge_two("bad", true);
  for (const auto& t : r.tensors) {
    ASSERT_TRUE(t.metrics);
    std::uint64_t n = 0;
    for (const auto& bin : t.metrics->magnitude.bins) n += bin.count;
    EXPECT_EQ(n, 64u) << t.name;
    // Bin of |truth| in [1, 2): 8 elements, test error 0.1 u on the bad tensor.
    EXPECT_EQ(t.metrics->magnitude.bins[kMagnitudeBias].count, 8u);
  }
}

// A model-sized report: `layers` layers of 5 modules of 5 tensors, forward then backward,
// everything from layer `bad` on failing (its MLP the culprit).
Report model_report(int layers, int bad) {
  Report r;
  std::size_t order = 0;
  for (const char* kind : {"output", "grad"}) {
    const bool backward = std::string(kind) == "grad";
    for (int j = 0; j < layers; ++j) {
      const int l = backward ? layers - 1 - j : j;
      for (const char* m :
           {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp", "mlp.down_proj"}) {
        const std::string module = "model.layers." + std::to_string(l) + "." + m;
        for (int t = 0; t < 5; ++t) {
          TensorResult x;
          x.name = module + (backward ? ".grad" : ".out") + std::to_string(t);
          const bool fails = l >= bad;
          x.verdict = fails ? VerdictKind::kFail : VerdictKind::kPass;
          x.rule = "rmse";
          x.reason = fails ? "beyond the limit" : "within the limit";
          x.ratio = fails ? 40.0 + t : 1.0 + 0.1 * t;
          x.limit = 3.0;
          x.order = order++;
          x.tags = {{"module", module}, {"kind", kind}};
          r.tensors.push_back(std::move(x));
        }
      }
    }
  }
  r.sort();
  FirstDivergence d;
  d.forward = DivergencePoint{"model.layers." + std::to_string(bad) + ".mlp.out0",
                              "model.layers." + std::to_string(bad) + ".mlp",
                              true,
                              {},
                              ""};
  r.first_divergence = d;
  return r;
}

// The x positions and texts of the tick labels under the first chart.
std::vector<std::pair<double, std::string>> ratio_ticks(const std::string& html) {
  const std::size_t begin = html.find("<svg "), end = html.find("</svg>", begin);
  const std::string svg = html.substr(begin, end - begin);
  std::vector<std::pair<double, std::string>> out;
  const std::string tag = "<text class=\"tick\" x=\"";
  for (auto at = svg.find(tag); at != std::string::npos; at = svg.find(tag, at + 1)) {
    const double x = std::stod(svg.substr(at + tag.size()));
    const std::size_t text = svg.find('>', at) + 1;
    const std::string label = svg.substr(text, svg.find('<', text) - text);
    if (label.rfind("1e", 0) != 0) out.emplace_back(x, label);  // not the y axis's decades
  }
  return out;
}

TEST(HtmlReportScaleTest, TenThousandTensorsMakeASmallPageWithLayerTicksAndBands) {
  const Report r = model_report(80, 30);  // 80 x 5 x 5 x 2 = 4,000 tensors
  ASSERT_EQ(r.tensors.size(), 4000u);
  Report big = model_report(200, 70);  // 10,000
  const std::string html = render_html(big);
  std::printf("page for %zu tensors: %zu bytes\n", big.tensors.size(), html.size());
  EXPECT_LT(html.size(), 3'000'000u);
  // The ratio chart: one bar per pixel column at most, no point per tensor.
  const std::size_t chart_end = html.find("</svg>");
  const std::string chart = html.substr(0, chart_end);
  std::size_t bars = 0;
  for (auto at = chart.find("<line class=\"fail\""); at != std::string::npos;
       at = chart.find("<line class=\"fail\"", at + 1))
    ++bars;
  for (auto at = chart.find("<line class=\"pass\""); at != std::string::npos;
       at = chart.find("<line class=\"pass\"", at + 1))
    ++bars;
  EXPECT_GT(bars, 400u);
  EXPECT_LE(bars, 820u);
  EXPECT_EQ(chart.find("<circle"), std::string::npos);
  // Forward and backward marked, each once.
  EXPECT_NE(chart.find("<rect class=\"fwd\""), std::string::npos);
  EXPECT_NE(chart.find("<rect class=\"bwd\""), std::string::npos);
  EXPECT_NE(chart.find(">forward</text>"), std::string::npos);
  EXPECT_NE(chart.find(">backward</text>"), std::string::npos);
  // The first divergence marked where it is: layer 70's MLP, forward (tensor 70 x 25 + 15).
  const std::string first_tag = "<line class=\"first\" x1=\"";
  const std::size_t first = chart.find(first_tag);
  ASSERT_NE(first, std::string::npos);
  EXPECT_NEAR(std::stod(chart.substr(first + first_tag.size())),
              60 + 820.0 * (70 * 25 + 15 + 0.5) / 10000, 0.01);
  EXPECT_NE(chart.find("<title>first divergence, forward: model.layers.70.mlp.out0 (module "
                       "model.layers.70.mlp)</title>"),
            std::string::npos);
  // Layer numbers under the axis, never overlapping (about 7 px per digit).
  const auto ticks = ratio_ticks(html);
  ASSERT_GT(ticks.size(), 10u);
  EXPECT_EQ(ticks.front().second, "0");
  for (std::size_t i = 1; i < ticks.size(); ++i) {
    const double need =
        3.5 * static_cast<double>(ticks[i - 1].second.size() + ticks[i].second.size()) + 4;
    EXPECT_GE(ticks[i].first - ticks[i - 1].first, need)
        << ticks[i - 1].second << " and " << ticks[i].second;
  }
  // The module tree: the way to the culprit open, other layers folded.
  EXPECT_NE(html.find("<details open><summary><span class=\"v fail\">FAIL</span> <b>layers.70</b>"),
            std::string::npos);
  EXPECT_NE(html.find("<details><summary><span class=\"v pass\">pass</span> <b>layers.3</b> "
                      "<span class=\"m\">50 tensors; worst 1.4 / 3 (model.layers.3."),
            std::string::npos);
  EXPECT_NE(html.find("<b>mlp</b> <span class=\"m\">20 tensors, 20 not passing; worst 44 / 3"),
            std::string::npos);
  // The flat table stops at 2,000 rows and says where the rest are.
  EXPECT_NE(html.find("8000 more tensors (10000 in all)"), std::string::npos);
}

// Past 20,000 tensors the page aggregates: bounded whatever the count, it still names the
// worst tensor and opens the way to it, and says what it left out.
TEST(HtmlReportScaleTest, AHundredThousandTensorsMakeABoundedPageNamingTheWorst) {
  Report r;
  for (std::size_t i = 0; i < 100'000; ++i) {
    TensorResult t;
    t.name = "layers." + std::to_string(i / 50) + ".t" + std::to_string(i % 50);
    const bool fails = i % 10 == 3;  // 10,000 failing: more than the page lists
    t.verdict = fails ? VerdictKind::kFail : VerdictKind::kPass;
    t.rule = "rmse";
    t.reason = fails ? "beyond the limit" : "within the limit";
    t.ratio = i == 77'773 ? 1e6 : fails ? 10.0 : 1.0;
    t.limit = 3.0;
    t.order = i;
    r.tensors.push_back(std::move(t));
  }
  r.sort();
  r.warnings.assign(5'000, "a warning");
  const std::string html = render_html(r);
  std::printf("page for %zu tensors: %zu bytes\n", r.tensors.size(), html.size());
  EXPECT_LT(html.size(), 3'000'000u);
  EXPECT_NE(html.find("id=\"tree-aggregated\">100000 tensors"), std::string::npos);
  EXPECT_NE(html.find("<b>layers.1555</b>"), std::string::npos) << "the way to the worst, open";
  EXPECT_NE(html.find("<td class=\"fail\">fail</td><td>t23</td><td>1e+06 / 3</td>"),
            std::string::npos)
      << "the worst tensor listed in its module";
  EXPECT_NE(html.find("more modules, not drawn"), std::string::npos);
  EXPECT_NE(html.find("not listed (aggregated above)"), std::string::npos);
  EXPECT_NE(html.find("counted in the module tree above"), std::string::npos);
  EXPECT_NE(html.find("4000 more, not listed here"), std::string::npos);
  // The root still counts every tensor.
  EXPECT_NE(html.find("100000 tensors, 10000 not passing; worst 1e+06 / 3 (layers.1555.t23)"),
            std::string::npos);
}

TEST(HtmlReportScaleTest, FewTensorsAreDotsAndEveryLayerIsLabelled) {
  const std::string html = render_html(model_report(3, 1));  // 150 tensors
  const std::string chart = html.substr(0, html.find("</svg>"));
  std::size_t dots = 0;
  for (auto at = chart.find("<circle"); at != std::string::npos; at = chart.find("<circle", at + 1))
    ++dots;
  EXPECT_EQ(dots, 150u);
  std::vector<std::string> labels;
  for (const auto& [x, label] : ratio_ticks(html)) labels.push_back(label);
  EXPECT_EQ(labels, (std::vector<std::string>{"0", "1", "2", "2", "1", "0"}));
  EXPECT_EQ(html.find("table-cut"), std::string::npos);
}

TEST(HtmlReportScaleTest, AVeryDeepModulePathIsAShallowTree) {
  // 200,000 components, each level with a tensor of its own: rendered without a recursion
  // that deep (the tree stops at 64 levels, the rest of the path one node).
  Report r;
  std::string path;
  for (int depth = 0; depth < 4; ++depth) {
    TensorResult t;
    path += std::string(depth ? "." : "") + "m";
    t.name = path + ".out";
    t.ratio = 1.0;
    t.limit = 3.0;
    t.order = static_cast<std::size_t>(depth);
    t.tags = {{"module", path}, {"kind", "output"}};
    r.tensors.push_back(t);
  }
  std::string deep = "m";
  for (int i = 1; i < 200'000; ++i) deep += i % 2 ? ".n" : ".m";
  r.tensors.back().tags["module"] = deep;
  const std::string html = render_html(r);
  std::size_t nodes = 0;
  for (auto at = html.find("<details"); at != std::string::npos; at = html.find("<details", at + 1))
    ++nodes;
  EXPECT_LE(nodes, 70u);
  EXPECT_NE(html.find("n.m.n.m"), std::string::npos) << "the rest of the path, as one node";
}

TEST(HtmlReportScaleTest, AModulesManyOwnTensorsFoldSoItsChildrenStayInView) {
  // The model's own results: logits and a cache of two tensors per layer.
  auto report_of = [](bool one_fails) {
    Report r;
    for (int i = 0; i < 20; ++i) {
      TensorResult t;
      t.name = "out.cache.layers." + std::to_string(i) + ".keys";
      t.ratio = one_fails && i == 7 ? 9.0 : 1.0;
      t.limit = 3.0;
      t.verdict = one_fails && i == 7 ? VerdictKind::kFail : VerdictKind::kPass;
      t.order = static_cast<std::size_t>(i);
      t.tags = {{"module", ""}, {"kind", "output"}};
      r.tensors.push_back(t);
    }
    TensorResult child;
    child.name = "layers.0.out";
    child.ratio = 1.0;
    child.limit = 3.0;
    child.order = 20;
    child.tags = {{"module", "layers.0"}, {"kind", "output"}};
    r.tensors.push_back(child);
    return render_html(r);
  };
  const std::string quiet = report_of(false);
  EXPECT_NE(quiet.find("<details><summary><span class=\"m\">20 tensors of its own</span>"),
            std::string::npos);
  const std::string failing = report_of(true);
  EXPECT_NE(failing.find("<details open><summary><span class=\"m\">20 tensors of its own, 1 not "
                         "passing</span>"),
            std::string::npos)
      << "open where one fails";
  // A few own tensors are shown as they are.
  EXPECT_EQ(render_html(model_report(3, 1)).find("tensors of its own"), std::string::npos);
}

TEST(HtmlReportScaleTest, DecadeLabelsNeverOverlap) {
  // Ratios from 1e-30 to 1e3: 33 decades in 200 px, labelled at most every 14 px.
  Report r;
  for (int i = 0; i < 34; ++i) {
    TensorResult t;
    t.name = "t" + std::to_string(i);
    t.ratio = std::pow(10.0, i - 30);
    t.limit = 3.0;
    t.order = static_cast<std::size_t>(i);
    r.tensors.push_back(t);
  }
  const std::string html = render_html(r);
  const std::string svg = html.substr(0, html.find("</svg>"));
  std::vector<double> ys;
  const std::string tag = "<text class=\"tick\" x=\"54.00\" y=\"";
  for (auto at = svg.find(tag); at != std::string::npos; at = svg.find(tag, at + 1))
    ys.push_back(std::stod(svg.substr(at + tag.size())));
  ASSERT_GE(ys.size(), 5u);
  EXPECT_LT(ys.size(), 34u);
  for (std::size_t i = 1; i < ys.size(); ++i) EXPECT_GE(ys[i - 1] - ys[i], 14.0 - 1e-9);
  EXPECT_NE(svg.find(">1e-30</text>"), std::string::npos) << "the lowest decade is labelled";
}

TEST(HtmlReportScaleTest, MagnitudeLabelsNeverOverlap) {
  Report r;
  TensorResult t;
  t.name = "x";
  t.ratio = 1.0;
  t.limit = 3.0;
  Metrics m;
  m.magnitude.bins.assign(kMagnitudeBins, MagnitudeBin{1, 1e-6, 1e-6});
  t.metrics = m;
  r.tensors.push_back(t);
  const std::string html = render_html(r);
  const std::size_t begin = html.find("<h2>Error against magnitude</h2>");
  const std::string svg = html.substr(begin, html.find("</svg>", begin) - begin);
  std::vector<double> xs;
  const std::string tag = "<text class=\"tick\" x=\"";
  for (auto at = svg.find(tag); at != std::string::npos; at = svg.find(tag, at + 1)) {
    if (svg.compare(svg.find('>', at) + 1, 2, "2^") == 0)
      xs.push_back(std::stod(svg.substr(at + tag.size())));
  }
  ASSERT_GT(xs.size(), 5u);
  EXPECT_LT(xs.size(), 64u) << "64 bins: labels thinned";
  for (std::size_t i = 1; i < xs.size(); ++i) EXPECT_GE(xs[i] - xs[i - 1], 36.0);
}

}  // namespace
}  // namespace numalign
