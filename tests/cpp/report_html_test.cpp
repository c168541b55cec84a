// report_html_test.cpp: the HTML report is self-contained, escapes every name, and shows
// the first divergence and the three charts. (tests/python/test_html_report.py renders it
// in headless Chromium.)
#include <gtest/gtest.h>

#include <cmath>

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
  EXPECT_EQ(count(html, "<tr class="), 2u);
  EXPECT_LT(html.find("<tr class=\"fail\">"), html.find("<tr class=\"pass\">")) << "failures first";
  // Two tensors, two ratio points and two limit dashes; the magnitude chart has 8 bins of
  // |truth| (2^-4 .. 2^3) for test and ref.
  EXPECT_EQ(count(html, "<line class=\"limit\""), 2u);
  EXPECT_EQ(count(html, "<circle class=\"test\""), 8u);
  EXPECT_EQ(count(html, "<circle class=\"ref\""), 8u);
  EXPECT_NE(html.find("2^-4"), std::string::npos);
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
    for (auto c : t.metrics->magnitude.count) n += c;
    EXPECT_EQ(n, 64u) << t.name;
    // Bin of |truth| in [1, 2): 8 elements, test error 0.1 u on the bad tensor.
    EXPECT_EQ(t.metrics->magnitude.count[kMagnitudeBias], 8u);
  }
}

}  // namespace
}  // namespace numalign
