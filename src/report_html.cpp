// report_html.cpp: the report as one self-contained HTML page with inline SVG charts.
#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "format.hpp"
#include "numalign/report.hpp"

namespace numalign {

using detail::format_number;

namespace {

std::string escape(const std::string& s) { return detail::markup_escape(s, detail::Markup::kHtml); }

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// A log10 axis over [lo, hi] (decades), mapped to pixels [p0, p1].
struct LogAxis {
  double lo, hi, p0, p1;
  double at(double v) const {
    const double l = std::clamp(std::log10(v), lo, hi);
    return p0 + (l - lo) / (hi - lo) * (p1 - p0);
  }
};

// Decades covering [min, max] of positive values, at least one.
std::pair<double, double> decades(double min, double max) {
  double lo = std::floor(std::log10(min)), hi = std::ceil(std::log10(max));
  if (hi <= lo) hi = lo + 1;
  return {lo, hi};
}

constexpr double kWidth = 900, kHeight = 260, kLeft = 60, kRight = 20, kTop = 20, kBottom = 40;

std::string svg_open(const std::string& label) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"" + escape(label) +
         "\" width=\"" + num(kWidth) + "\" height=\"" + num(kHeight) + "\" viewBox=\"0 0 " +
         num(kWidth) + " " + num(kHeight) + "\">\n";
}

std::string y_decade_grid(const LogAxis& y) {
  std::string s;
  for (double d = y.lo; d <= y.hi + 1e-9; d += 1) {
    const double py = y.at(std::pow(10.0, d));
    s += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kWidth - kRight) +
         "\" y1=\"" + num(py) + "\" y2=\"" + num(py) + "\"/><text class=\"tick\" x=\"" +
         num(kLeft - 6) + "\" y=\"" + num(py + 4) + "\" text-anchor=\"end\">1e" +
         std::to_string(static_cast<int>(d)) + "</text>\n";
  }
  return s;
}

std::string axis_label(double x, double y, const std::string& text, bool vertical = false) {
  return "<text class=\"label\" x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"middle\"" +
         (vertical ? " transform=\"rotate(-90 " + num(x) + " " + num(y) + ")\"" : "") + ">" +
         escape(text) + "</text>\n";
}

// Ratio per tensor in execution order, log scale, each tensor's limit as a dash.
std::string ratio_chart(const Report& report) {
  std::vector<const TensorResult*> points;
  for (const auto& r : report.tensors) {
    if (r.ratio && r.limit && std::isfinite(*r.ratio)) points.push_back(&r);
  }
  if (points.empty()) return "<p>No tensor has a finite ratio to draw.</p>\n";
  std::sort(points.begin(), points.end(),
            [](const TensorResult* a, const TensorResult* b) { return a->order < b->order; });
  double lo = INFINITY, hi = 0;
  for (const TensorResult* r : points) {
    for (double v : {*r->ratio, *r->limit}) {
      if (v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  if (!(hi > 0)) lo = 0.1, hi = 10;
  const auto [dlo, dhi] = decades(lo, hi);
  const LogAxis y{dlo, dhi, kHeight - kBottom, kTop};
  const double step = (kWidth - kLeft - kRight) / static_cast<double>(points.size());
  std::string s = svg_open("ratio per tensor in execution order");
  s += y_decade_grid(y);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const TensorResult& r = *points[i];
    const double x = kLeft + step * (static_cast<double>(i) + 0.5);
    const double half = std::max(1.0, std::min(6.0, step * 0.45));
    if (*r.limit > 0) {
      const double ly = y.at(*r.limit);
      s += "<line class=\"limit\" x1=\"" + num(x - half) + "\" x2=\"" + num(x + half) + "\" y1=\"" +
           num(ly) + "\" y2=\"" + num(ly) + "\"/>";
    }
    const double v = *r.ratio > 0 ? *r.ratio : std::pow(10.0, dlo);
    s += "<circle class=\"" + std::string(verdict_word(r.verdict)) + "\" cx=\"" + num(x) +
         "\" cy=\"" + num(y.at(v)) + "\" r=\"3\"><title>" + escape(r.name) + ": ratio " +
         format_number(*r.ratio) + ", limit " + format_number(*r.limit) + "</title></circle>\n";
  }
  s += axis_label(kLeft + (kWidth - kLeft - kRight) / 2, kHeight - 10,
                  "tensors in execution order (dash: the limit)");
  s += axis_label(16, (kTop + kHeight - kBottom) / 2, "ratio", true);
  return s + "</svg>\n";
}

const char* ulp_bin_label(int b, std::string& buf) {
  if (b == kUlpInfBin) return "inf";
  if (b <= 2) return b == 0 ? "0" : b == 1 ? "1" : "2";
  // bin b: (2^(b-2), 2^(b-1)]
  buf = "2^" + std::to_string(b - 1);
  return buf.c_str();
}

// Bars of log10(count + 1) per ULP bin, over every tensor that has them.
std::string ulp_chart(const Report& report) {
  std::array<std::uint64_t, kUlpBins> hist{};
  for (const auto& r : report.tensors) {
    if (!r.metrics || !r.metrics->floating) continue;
    for (int b = 0; b < kUlpBins; ++b) hist[b] += r.metrics->ulp.hist[b];
  }
  int last = 0;
  for (int b = 0; b < kUlpBins; ++b) {
    if (hist[b]) last = b;
  }
  const std::uint64_t top = *std::max_element(hist.begin(), hist.end());
  if (top == 0) return "<p>No floating tensor was compared.</p>\n";
  const int bins = std::min(last + 1, kUlpBins);
  const LogAxis y{0, std::ceil(std::log10(static_cast<double>(top) + 1)), kHeight - kBottom, kTop};
  const double step = (kWidth - kLeft - kRight) / bins;
  std::string s = svg_open("ULP distance between test and ref, all tensors");
  s += y_decade_grid(y);
  std::string buf;
  for (int b = 0; b < bins; ++b) {
    const int bin = b;
    const double x = kLeft + step * b;
    const double top_y = hist[bin] ? y.at(static_cast<double>(hist[bin]) + 1) : y.p0;
    s += "<rect class=\"bar\" x=\"" + num(x + 1) + "\" y=\"" + num(top_y) + "\" width=\"" +
         num(std::max(1.0, step - 2)) + "\" height=\"" + num(y.p0 - top_y) + "\"><title>" +
         ulp_bin_label(bin, buf) + " ULP: " + std::to_string(hist[bin]) +
         " elements</title></rect>";
    // Labels about 30 px apart, whatever the number of bins.
    const int every = std::max(1, static_cast<int>(std::ceil(30 / step)));
    if (b % every == 0 || bin == kUlpInfBin) {
      s += "<text class=\"tick\" x=\"" + num(x + step / 2) + "\" y=\"" +
           num(kHeight - kBottom + 14) + "\" text-anchor=\"middle\">" + ulp_bin_label(bin, buf) +
           "</text>";
    }
    s += "\n";
  }
  s += axis_label(kLeft + (kWidth - kLeft - kRight) / 2, kHeight - 6,
                  "ULP distance (bins up to the value shown)");
  s += axis_label(16, (kTop + kHeight - kBottom) / 2, "elements + 1", true);
  return s + "</svg>\n";
}

// RMSE against the truth per magnitude bin of |truth|, test and ref, over every tensor.
std::string magnitude_chart(const Report& report) {
  MagnitudeProfile all;
  for (const auto& r : report.tensors) {
    if (r.metrics) all.add(r.metrics->magnitude);
  }
  if (all.empty()) {
    return "<p>Not measured: the error against magnitude is binned during the pass when asked "
           "for (<code>numalign judge --format html</code>, or <code>judge(..., "
           "magnitude_profile=True)</code> in Python).</p>\n";
  }
  int first = -1, last = -1;
  double lo = INFINITY, hi = 0;
  for (int b = 0; b < kMagnitudeBins; ++b) {
    if (!all.count[b]) continue;
    if (first < 0) first = b;
    last = b;
    for (double sq : {all.sq_err_test[b], all.sq_err_ref[b]}) {
      const double rmse = std::sqrt(sq / static_cast<double>(all.count[b]));
      if (rmse > 0) lo = std::min(lo, rmse), hi = std::max(hi, rmse);
    }
  }
  if (first < 0) return "<p>No finite element to bin.</p>\n";
  if (!(hi > 0)) lo = 1e-10, hi = 1;
  const auto [dlo, dhi] = decades(lo, hi);
  const LogAxis y{dlo, dhi, kHeight - kBottom, kTop};
  const int bins = last - first + 1;
  const double step = (kWidth - kLeft - kRight) / bins;
  std::string s = svg_open("RMSE against the truth per magnitude of the truth");
  s += y_decade_grid(y);
  std::string test_line, ref_line;
  for (int b = first; b <= last; ++b) {
    const double x = kLeft + step * (b - first + 0.5);
    s += "<text class=\"tick\" x=\"" + num(x) + "\" y=\"" + num(kHeight - kBottom + 14) +
         "\" text-anchor=\"middle\">2^" + std::to_string(b - kMagnitudeBias) + "</text>";
    if (!all.count[b]) continue;
    const double n = static_cast<double>(all.count[b]);
    for (auto [sq, line, cls] : {std::tuple{all.sq_err_test[b], &test_line, "test"},
                                 std::tuple{all.sq_err_ref[b], &ref_line, "ref"}}) {
      const double rmse = std::sqrt(sq / n);
      const double py = rmse > 0 ? y.at(rmse) : y.p0;
      *line += num(x) + "," + num(py) + " ";
      s += "<circle class=\"" + std::string(cls) + "\" cx=\"" + num(x) + "\" cy=\"" + num(py) +
           "\" r=\"3\"><title>" + cls + ": RMSE " + format_number(rmse) + " over " +
           std::to_string(all.count[b]) + " elements with |truth| in [2^" +
           std::to_string(b - kMagnitudeBias) + ", 2^" + std::to_string(b - kMagnitudeBias + 1) +
           ")</title></circle>\n";
    }
  }
  s += "<polyline class=\"test\" points=\"" + test_line + "\"/>\n";
  s += "<polyline class=\"ref\" points=\"" + ref_line + "\"/>\n";
  s += axis_label(kLeft + (kWidth - kLeft - kRight) / 2, kHeight - 6,
                  "|truth| (bins of one binary exponent); red: test, blue: ref");
  s += axis_label(16, (kTop + kHeight - kBottom) / 2, "RMSE vs truth", true);
  return s + "</svg>\n";
}

std::string cell(const std::string& text, const std::string& sort_key = "") {
  return "<td" + (sort_key.empty() ? "" : " data-key=\"" + escape(sort_key) + "\"") + ">" +
         escape(text) + "</td>";
}

std::string opt_cell(const std::optional<double>& v) {
  return v ? cell(format_number(*v), detail::json_number(*v)) : cell("-", "");
}

std::string table(const Report& report) {
  std::string s =
      "<table id=\"tensors\"><thead><tr><th>verdict</th><th>#</th><th>tensor</th><th>rule</th>"
      "<th>ratio</th><th>limit</th><th>max ulp</th><th>diff %</th><th>reason</th></tr></thead>"
      "<tbody>\n";
  for (const auto& r : report.tensors) {
    std::string max_ulp = "-", diff = "-";
    if (r.metrics && r.metrics->floating)
      max_ulp = r.metrics->ulp.any_inf ? "inf" : std::to_string(r.metrics->ulp.max);
    if (r.metrics && r.metrics->numel)
      diff = format_number(100.0 * static_cast<double>(r.metrics->values_differ) /
                           static_cast<double>(r.metrics->numel));
    s += "<tr class=\"" + std::string(verdict_word(r.verdict)) + "\">" +
         cell(verdict_word(r.verdict)) + cell(std::to_string(r.order)) + cell(r.name) +
         cell(r.rule) + opt_cell(r.ratio) + opt_cell(r.limit) + cell(max_ulp) + cell(diff) +
         cell(r.reason) + "</tr>\n";
  }
  return s + "</tbody></table>\n";
}

constexpr const char* kStyle = R"(<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1.fail { color: #b00020; } h1.pass { color: #1b5e20; }
.divergence { background: #fff3e0; border-left: 4px solid #e65100; padding: 8px 12px; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: 13px; } th, td { padding: 2px 8px; text-align: left; }
th { background: #eee; cursor: pointer; } tr.fail td, tr.error td { background: #ffebee; }
td:nth-child(5), td:nth-child(6), td:nth-child(7), td:nth-child(8) { text-align: right; }
svg { border: 1px solid #ddd; margin: 8px 0; } .grid { stroke: #eee; } .tick, .label { font-size: 11px; fill: #555; }
circle.pass { fill: #2e7d32; } circle.fail, circle.error { fill: #c62828; } .limit { stroke: #000; stroke-width: 2; }
.bar { fill: #5c6bc0; } polyline { fill: none; stroke-width: 1.5; } polyline.test { stroke: #c62828; } polyline.ref { stroke: #1565c0; }
circle.test { fill: #c62828; } circle.ref { fill: #1565c0; }
</style>
)";

// Sorting by a click on a column header; the page reads the same without it.
constexpr const char* kScript = R"(<script>
document.querySelectorAll('#tensors th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
    var down = th.dataset.dir !== 'down'; th.dataset.dir = down ? 'down' : 'up';
    function key(r) { var c = r.cells[col]; return c.dataset.key !== undefined ? c.dataset.key : c.textContent; }
    rows.sort(function (a, b) {
      var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return down ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
</script>
)";

}  // namespace

std::string render_html(const Report& report) {
  const bool aligned = report.aligned();
  const char* word = aligned                                ? "aligned"
                     : report.exit_code() == kCouldNotJudge ? "could not judge"
                                                            : "not aligned";
  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<title>numalign: " +
      std::string(word) + "</title>\n" + kStyle + "</head><body>\n";
  s += "<h1 class=\"" + std::string(aligned ? "pass" : "fail") + "\">" +
       escape(render_summary(report)) + "</h1>\n";
  if (!report.title.empty() || !report.settings.empty()) {
    s += "<pre>" + escape(report.title) + (report.title.empty() ? "" : "\n") +
         escape(report.settings.empty() ? "" : "settings: " + report.settings) + "</pre>\n";
  }
  if (!report.could_not_judge.empty()) {
    s += "<h2>Could not judge this run</h2>\n<ul id=\"could-not-judge\">";
    for (const auto& w : report.could_not_judge) s += "<li>" + escape(w) + "</li>";
    s += "</ul>\n";
  }
  if (report.first_divergence) {
    s += "<h2>First divergence</h2>\n<div class=\"divergence\" id=\"first-divergence\">" +
         escape(divergence_text(*report.first_divergence)) + "</div>\n";
  }
  if (!report.warnings.empty()) {
    s += "<h2>Warnings</h2>\n<ul>";
    for (const auto& w : report.warnings) s += "<li>" + escape(w) + "</li>";
    s += "</ul>\n";
  }
  s += "<h2>Ratio per tensor</h2>\n" + ratio_chart(report);
  s += "<h2>ULP distance, test vs ref</h2>\n" + ulp_chart(report);
  s += "<h2>Error against magnitude</h2>\n" + magnitude_chart(report);
  s += "<h2>Tensors</h2>\n<p>Could-not-judge first, then failures worst first, then passes in "
       "execution order; click a column to sort.</p>\n" +
       table(report);
  s += kScript;
  return s + "</body></html>\n";
}

}  // namespace numalign
