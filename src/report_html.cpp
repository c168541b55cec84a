// report_html.cpp: the report as one self-contained HTML page with inline SVG charts.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "format.hpp"
#include "numalign/divergence.hpp"
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

// Past this many tensors the page aggregates instead of listing every tensor (a million
// tensors listed made a 437 MB page): the module tree draws at most kSummaryModules modules
// (the way to the worst tensor and the first divergence always) and kSummaryRows tensors, the
// ones that do not pass; the rest are counted in their module's line.
constexpr std::size_t kListedTensors = 20'000;
constexpr std::size_t kSummaryModules = 2'000, kSummaryRows = 2'000;
// Warnings listed at most (one per tensor is possible): the rest are counted.
constexpr std::size_t kListedWarnings = 1'000;

constexpr double kWidth = 900, kHeight = 260, kLeft = 60, kRight = 20, kTop = 20, kBottom = 40;

std::string svg_open(const std::string& label) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"" + escape(label) +
         "\" width=\"" + num(kWidth) + "\" height=\"" + num(kHeight) + "\" viewBox=\"0 0 " +
         num(kWidth) + " " + num(kHeight) + "\">\n";
}

// A grid line per decade, labelled every 1, 2, 3... decades so that labels stay 14 px apart.
std::string y_decade_grid(const LogAxis& y) {
  std::string s;
  const double per_decade = std::abs(y.p0 - y.p1) / std::max(1.0, y.hi - y.lo);
  const int every = std::max(1, static_cast<int>(std::ceil(14 / per_decade)));
  for (double d = y.lo; d <= y.hi + 1e-9; d += 1) {
    const double py = y.at(std::pow(10.0, d));
    s += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kWidth - kRight) +
         "\" y1=\"" + num(py) + "\" y2=\"" + num(py) + "\"/>";
    if (static_cast<long>(std::lround(d - y.lo)) % every == 0) {
      s += "<text class=\"tick\" x=\"" + num(kLeft - 6) + "\" y=\"" + num(py + 4) +
           "\" text-anchor=\"end\">1e" + std::to_string(static_cast<int>(d)) + "</text>";
    }
    s += "\n";
  }
  return s;
}

std::string axis_label(double x, double y, const std::string& text, bool vertical = false) {
  return "<text class=\"label\" x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"middle\"" +
         (vertical ? " transform=\"rotate(-90 " + num(x) + " " + num(y) + ")\"" : "") + ">" +
         escape(text) + "</text>\n";
}

// Forward ('f') or backward ('b') by a tensor's kind tag; 0 when untagged.
char direction_of(const TensorResult& r) {
  const auto k = r.tags.find("kind");
  if (k == r.tags.end()) return 0;
  const std::string& v = k->second;
  if (v == "input" || v == "output" || v == "op") return 'f';
  if (v == "grad" || v == "grad-output" || v == "param-grad" || v == "input-grad" || v == "op-grad")
    return 'b';
  return 0;
}

// A tensor's module path: its "module" tag, else its name less the last component.
std::string module_of(const TensorResult& r) {
  const auto m = r.tags.find("module");
  if (m != r.tags.end()) return m->second;
  const std::size_t dot = r.name.rfind('.');
  return dot == std::string::npos ? "" : r.name.substr(0, dot);
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The layer of a module path: the path through its first all-digit component ("model.layers.11"
// of "model.layers.11.mlp", with the number's position), or "" when it has none.
std::pair<std::string, std::string> layer_of(const std::string& path) {
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    std::string_view part(path.data() + start, dot - start);
    const std::size_t hash = part.find('#');  // "layers.0#1": a call index is not a layer
    if (all_digits(part.substr(0, hash))) return {path.substr(0, dot), std::string(part)};
    start = dot + 1;
  }
  return {"", ""};
}

// Ticks and bands under and over the ratio chart: a tick where the layer changes (labelled
// by its number, labels thinned so that they never overlap) and a band per run of forward or
// backward tensors. `xs(i)` is the left edge of position i in [0, n].
std::string layer_ticks(const std::vector<const TensorResult*>& points,
                        const std::function<double(std::size_t)>& xs, bool& any_layer) {
  std::string s;
  const double y_axis = kHeight - kBottom;
  // Where each layer starts: its position and number.
  struct Start {
    double x;
    std::string number;
  };
  std::vector<Start> starts;
  std::string prev_layer;
  std::size_t widest = 1;
  // Aggregated: at most one tick per pixel, so that the chart stays bounded.
  const bool per_pixel = points.size() > kListedTensors;
  for (std::size_t i = 0; i < points.size(); ++i) {
    auto [layer, number] = layer_of(module_of(*points[i]));
    // Backward starts again where forward ended: a new tick.
    if (!layer.empty()) layer = direction_of(*points[i]) + layer;
    if (layer == prev_layer || layer.empty()) {
      prev_layer = layer;
      continue;
    }
    prev_layer = layer;
    if (per_pixel && !starts.empty() && xs(i) - starts.back().x < 1) continue;
    starts.push_back({xs(i), number});
    widest = std::max(widest, number.size());
  }
  any_layer = !starts.empty();
  if (starts.empty()) return s;
  // Labels every 1, 2, 5, 10, 20, ... layers, as many as fit at about 7 px per digit and
  // 4 px between; a label that would still touch the one before is left out.
  const double room = (xs(points.size()) - xs(0)) / static_cast<double>(starts.size());
  const double need = 7 * static_cast<double>(widest) + 4;
  const long stride = [&] {
    for (long decade = 1;; decade *= 10) {
      for (long m : {1L, 2L, 5L}) {
        if (room * static_cast<double>(m * decade) >= need || decade > 1'000'000) return m * decade;
      }
    }
  }();
  double last_label_end = -1e9;
  for (const Start& st : starts) {
    const long layer = std::strtol(st.number.c_str(), nullptr, 10);
    const double width = 7 * static_cast<double>(st.number.size());
    const bool label =
        layer % stride == 0 && st.x - width / 2 >= last_label_end + 4 && st.x + width / 2 < kWidth;
    // Every start gets a mark on the axis; labelled ones a grid line too.
    s += "<line class=\"layer\" x1=\"" + num(st.x) + "\" x2=\"" + num(st.x) + "\" y1=\"" +
         num(label ? kTop : y_axis) + "\" y2=\"" + num(y_axis + 4) + "\"/>";
    if (label) {
      s += "<text class=\"tick\" x=\"" + num(st.x) + "\" y=\"" + num(y_axis + 15) +
           "\" text-anchor=\"middle\">" + escape(st.number) + "</text>";
      last_label_end = st.x + width / 2;
    }
    s += "\n";
  }
  // Forward and backward runs as bands over the plot.
  std::size_t run = 0;
  for (std::size_t i = 1; i <= points.size(); ++i) {
    if (i < points.size() && direction_of(*points[i]) == direction_of(*points[run])) continue;
    const char d = direction_of(*points[run]);
    if (d && !(per_pixel && xs(i) - xs(run) < 1)) {
      const double x0 = xs(run), x1 = xs(i);
      const char* cls = d == 'f' ? "fwd" : "bwd";
      s += "<rect class=\"" + std::string(cls) + "\" x=\"" + num(x0) + "\" y=\"" + num(kTop - 14) +
           "\" width=\"" + num(std::max(1.0, x1 - x0)) + "\" height=\"10\"><title>" +
           (d == 'f' ? "forward" : "backward") + ": tensors " + std::to_string(run) + " to " +
           std::to_string(i - 1) + "</title></rect>";
      if (x1 - x0 >= 70) {
        s += "<text class=\"band\" x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num(kTop - 6) +
             "\" text-anchor=\"middle\">" + (d == 'f' ? "forward" : "backward") + "</text>";
      }
      if (run > 0) {
        s += "<line class=\"direction\" x1=\"" + num(x0) + "\" x2=\"" + num(x0) + "\" y1=\"" +
             num(kTop - 14) + "\" y2=\"" + num(y_axis) + "\"/>";
      }
      s += "\n";
    }
    run = i;
  }
  return s;
}

// Ratio per tensor in execution order, log scale, each tensor's limit as a dash; ticks at
// layer boundaries and bands marking forward and backward. Beyond one point per 2 pixels,
// the tensors of each pixel column are drawn as one bar from their lowest to their highest
// ratio (red when one fails, its title naming the worst), so the page stays small.
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
  const double plot = kWidth - kLeft - kRight;
  const std::size_t n = points.size();
  const double step = plot / static_cast<double>(n);
  const auto xs = [&](std::size_t i) { return kLeft + step * static_cast<double>(i); };
  const double bottom = std::pow(10.0, dlo);  // a ratio of 0 sits on the axis
  auto ratio_y = [&](double v) { return y.at(v > 0 ? v : bottom); };
  std::string s = svg_open("ratio per tensor in execution order");
  s += y_decade_grid(y);
  bool any_layer = false;
  s += layer_ticks(points, xs, any_layer);
  // Where the run first goes wrong, forward and backward: a line through the plot.
  if (report.first_divergence) {
    for (const auto& [point, label] :
         {std::pair{&report.first_divergence->forward, "first divergence, forward"},
          std::pair{&report.first_divergence->backward, "first divergence, backward"}}) {
      if (!*point) continue;
      const std::string& tensor = (*point)->tensor;
      const auto at = std::find_if(points.begin(), points.end(),
                                   [&](const TensorResult* r) { return r->name == tensor; });
      if (at == points.end()) continue;
      const double x = xs(static_cast<std::size_t>(at - points.begin())) + step / 2;
      s += "<line class=\"first\" x1=\"" + num(x) + "\" x2=\"" + num(x) + "\" y1=\"" + num(kTop) +
           "\" y2=\"" + num(kHeight - kBottom) + "\"><title>" + label + ": " +
           escape((*point)->tensor) + " (module " +
           escape((*point)->module.empty() ? "(model)" : (*point)->module) + ")</title></line>\n";
    }
  }
  if (step >= 2) {
    for (std::size_t i = 0; i < n; ++i) {
      const TensorResult& r = *points[i];
      const double x = xs(i) + step / 2;
      const double half = std::max(1.0, std::min(6.0, step * 0.45));
      if (*r.limit > 0) {
        const double ly = y.at(*r.limit);
        s += "<line class=\"limit\" x1=\"" + num(x - half) + "\" x2=\"" + num(x + half) +
             "\" y1=\"" + num(ly) + "\" y2=\"" + num(ly) + "\"/>";
      }
      s += "<circle class=\"" + std::string(verdict_word(r.verdict)) + "\" cx=\"" + num(x) +
           "\" cy=\"" + num(ratio_y(*r.ratio)) + "\" r=\"" + (step >= 6 ? "3" : "2") +
           "\"><title>" + escape(r.name) + ": ratio " + format_number(*r.ratio) + ", limit " +
           format_number(*r.limit) + "</title></circle>\n";
    }
  } else {
    // One bar per pixel column: [first, last) tensors whose centre falls in it.
    const auto columns = static_cast<std::size_t>(plot);
    std::string limits;
    std::size_t first = 0;
    for (std::size_t c = 0; c < columns && first < n; ++c) {
      std::size_t last = first;
      while (last < n && (static_cast<double>(last) + 0.5) * step < static_cast<double>(c + 1))
        ++last;
      if (last == first) continue;
      double rlo = INFINITY, rhi = -INFINITY, llo = INFINITY, lhi = -INFINITY;
      const TensorResult* worst = points[first];
      std::size_t failing = 0;
      for (std::size_t i = first; i < last; ++i) {
        const TensorResult& r = *points[i];
        rlo = std::min(rlo, *r.ratio), rhi = std::max(rhi, *r.ratio);
        llo = std::min(llo, *r.limit), lhi = std::max(lhi, *r.limit);
        failing += r.verdict != VerdictKind::kPass;
        if (severity(r) > severity(*worst)) worst = &r;
      }
      const double x = kLeft + static_cast<double>(c) + 0.5;
      for (double l : {llo, lhi}) {
        if (l > 0 && (l == llo || lhi != llo))
          limits += "M" + num(x - 0.5) + " " + num(y.at(l)) + "h1";
      }
      const double y0 = ratio_y(rlo), y1 = std::min(ratio_y(rhi), y0 - 2);
      s += "<line class=\"" + std::string(failing ? "fail" : "pass") + "\" x1=\"" + num(x) +
           "\" x2=\"" + num(x) + "\" y1=\"" + num(y0) + "\" y2=\"" + num(y1) + "\"><title>" +
           "tensors " + std::to_string(first) + " to " + std::to_string(last - 1) + ": ratio " +
           format_number(rlo) + " to " + format_number(rhi) + ", " + std::to_string(failing) +
           " failing; worst " + escape(worst->name) + " (ratio " + format_number(*worst->ratio) +
           ", limit " + format_number(*worst->limit) + ")</title></line>\n";
      first = last;
    }
    s += "<path class=\"limit\" d=\"" + limits + "\"/>\n";
  }
  s += axis_label(kLeft + plot / 2, kHeight - 6,
                  std::string(any_layer ? "tensors in execution order, ticks where a layer starts "
                                          "(its number)"
                                        : "tensors in execution order") +
                      (step >= 2 ? "; dash: the limit"
                                 : "; bar: the range of a pixel's tensors, "
                                   "dash: the limit") +
                      (report.first_divergence ? "; purple: first divergence" : ""));
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
  MagnitudeProfile all = report.magnitude;
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
    if (!all.bins[b].count) continue;
    if (first < 0) first = b;
    last = b;
    for (double sq : {all.bins[b].sq_err_test, all.bins[b].sq_err_ref}) {
      const double rmse = std::sqrt(sq / static_cast<double>(all.bins[b].count));
      if (rmse > 0) lo = std::min(lo, rmse), hi = std::max(hi, rmse);
    }
  }
  if (first < 0) return "<p>No finite element to bin.</p>\n";
  if (!(hi > 0)) lo = 1e-10, hi = 1;
  const auto [dlo, dhi] = decades(lo, hi);
  const LogAxis y{dlo, dhi, kHeight - kBottom, kTop};
  const int bins = last - first + 1;
  const double step = (kWidth - kLeft - kRight) / bins;
  const int every = std::max(1, static_cast<int>(std::ceil(36 / step)));
  std::string s = svg_open("RMSE against the truth per magnitude of the truth");
  s += y_decade_grid(y);
  std::string test_line, ref_line;
  for (int b = first; b <= last; ++b) {
    const double x = kLeft + step * (b - first + 0.5);
    // Labels at least 36 px apart ("2^-126" is about 34 px wide), whatever the number of bins.
    if ((b - first) % every == 0) {
      s += "<text class=\"tick\" x=\"" + num(x) + "\" y=\"" + num(kHeight - kBottom + 14) +
           "\" text-anchor=\"middle\">2^" + std::to_string(b - kMagnitudeBias) + "</text>";
    }
    if (!all.bins[b].count) continue;
    const double n = static_cast<double>(all.bins[b].count);
    for (auto [sq, line, cls] : {std::tuple{all.bins[b].sq_err_test, &test_line, "test"},
                                 std::tuple{all.bins[b].sq_err_ref, &ref_line, "ref"}}) {
      const double rmse = std::sqrt(sq / n);
      const double py = rmse > 0 ? y.at(rmse) : y.p0;
      *line += num(x) + "," + num(py) + " ";
      s += "<circle class=\"" + std::string(cls) + "\" cx=\"" + num(x) + "\" cy=\"" + num(py) +
           "\" r=\"3\"><title>" + cls + ": RMSE " + format_number(rmse) + " over " +
           std::to_string(all.bins[b].count) + " elements with |truth| in [2^" +
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

// Where a tensor paired through a map was read in test, after its reason.
std::string test_source(const TensorResult& r) {
  const auto src = r.tags.find("test_source");
  return src == r.tags.end() ? "" : " (test: " + src->second + ")";
}

// Rows of the flat table at most: a model's tensors are all in the module tree; the table
// keeps the first of them in its order (could-not-judge, failures worst first, passes).
constexpr std::size_t kTableRows = 2000;

std::string table(const Report& report) {
  std::string s =
      "<table id=\"tensors\"><thead><tr><th>verdict</th><th>#</th><th>tensor</th><th>rule</th>"
      "<th>ratio</th><th>limit</th><th>max ulp</th><th>diff %</th><th>reason</th></tr></thead>"
      "<tbody>\n";
  const std::size_t rows = std::min(report.tensors.size(), kTableRows);
  for (std::size_t i = 0; i < rows; ++i) {
    const TensorResult& r = report.tensors[i];
    std::string max_ulp = "-", diff = "-";
    if (r.metrics && r.metrics->floating)
      max_ulp = r.metrics->ulp.any_inf ? "inf" : std::to_string(r.metrics->ulp.max);
    if (r.metrics && r.metrics->numel)
      diff = format_number(100.0 * static_cast<double>(r.metrics->values_differ) /
                           static_cast<double>(r.metrics->numel));
    s += "<tr class=\"" + std::string(verdict_word(r.verdict)) + "\">" +
         cell(verdict_word(r.verdict)) + cell(std::to_string(r.order)) + cell(r.name) +
         cell(r.rule) + opt_cell(r.ratio) + opt_cell(r.limit) + cell(max_ulp) + cell(diff) +
         cell(r.reason + test_source(r)) + "</tr>\n";
  }
  s += "</tbody></table>\n";
  if (rows < report.tensors.size()) {
    s += "<p id=\"table-cut\">" + std::to_string(report.tensors.size() - rows) + " more tensors (" +
         std::to_string(report.tensors.size()) +
         (report.tensors.size() > kListedTensors
              ? " in all): counted in the module tree above; the JSON report lists every one.</p>\n"
              : " in all): every one is in the module tree above, with its verdict and "
                "ratio.</p>\n");
  }
  return s;
}

// The module tree: tensors grouped by module path, each module with its worst ratio / limit
// and its verdict, in execution order; <details> folds it without script.
struct ModuleNode {
  std::string name;  // its path component(s)
  std::vector<std::size_t> children;
  std::map<std::string, std::size_t, std::less<>> child_at;
  std::vector<const TensorResult*> tensors;
  std::size_t total = 0, failing = 0;
  const TensorResult* worst = nullptr;  // its, or a descendant's, worst tensor with a ratio
};

std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> out;
  if (path.empty()) return out;
  for (std::size_t start = 0;;) {
    const std::size_t dot = path.find('.', start);
    out.push_back(path.substr(start, dot == std::string_view::npos ? path.npos : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

void aggregate(std::vector<ModuleNode>& nodes, std::size_t at) {
  ModuleNode& n = nodes[at];
  // The worst is a failing tensor where one fails (a pass can have a high ratio: within the
  // tolerance), then by ratio / limit.
  auto take = [&](const TensorResult* t) {
    if (!t) return;
    auto rank = [](const TensorResult* r) {
      return std::pair(r->verdict != VerdictKind::kPass, severity(*r));
    };
    if (!n.worst || rank(t) > rank(n.worst)) n.worst = t;
  };
  for (const TensorResult* t : n.tensors) {
    ++n.total;
    n.failing += t->verdict != VerdictKind::kPass;
    take(t);
  }
  for (std::size_t c : n.children) {
    aggregate(nodes, c);
    nodes[at].total += nodes[c].total;
    nodes[at].failing += nodes[c].failing;
    take(nodes[c].worst);
  }
}

std::string verdict_span(bool pass) {
  return pass ? "<span class=\"v pass\">pass</span>" : "<span class=\"v fail\">FAIL</span>";
}

std::string ratio_text(const TensorResult& t) {
  return t.ratio && t.limit ? format_number(*t.ratio) + " / " + format_number(*t.limit) : "-";
}

constexpr std::size_t kOwnShown = 12;

// What an aggregated tree may still draw (unbounded when the report is small), and the
// tensors it always lists: the worst and those where the run first diverges.
struct TreeBudget {
  std::size_t modules = SIZE_MAX, rows = SIZE_MAX;
  std::set<const TensorResult*> always;
  bool bounded() const { return rows != SIZE_MAX; }
};

void render_node(const std::vector<ModuleNode>& nodes, std::size_t at, const std::string& path,
                 const std::set<std::string, std::less<>>& open, TreeBudget& budget, std::string& s,
                 const std::string& parent = "") {
  if (budget.modules && budget.modules != SIZE_MAX) --budget.modules;
  // A chain of modules with one child each and no tensor of their own reads as one line; a
  // number reads with its parent's name ("layers.11").
  std::string name = all_digits(nodes[at].name) && !parent.empty() ? parent + "." + nodes[at].name
                                                                   : nodes[at].name,
              full = path;
  const bool root = at == 0;
  while (nodes[at].tensors.empty() && nodes[at].children.size() == 1) {
    at = nodes[at].children.front();
    name = (at == nodes[0].children.front() && root ? "" : name + ".") + nodes[at].name;
    full += (full.empty() ? "" : ".") + nodes[at].name;
  }
  const ModuleNode& n = nodes[at];
  s += std::string("<details") + (root || open.count(full) ? " open" : "") + "><summary>" +
       verdict_span(n.failing == 0) + " <b>" + escape(name) + "</b> <span class=\"m\">" +
       std::to_string(n.total) + (n.total == 1 ? " tensor" : " tensors");
  if (n.failing) s += ", " + std::to_string(n.failing) + " not passing";
  if (n.worst) s += "; worst " + ratio_text(*n.worst) + " (" + escape(n.worst->name) + ")";
  s += "</span></summary>\n";
  // A module's own tensors past a screenful (the model's cache: two per layer) fold, so that
  // its children stay in view; open when one of them does not pass.
  const bool fold_own = n.tensors.size() > kOwnShown;
  if (fold_own) {
    std::size_t bad = 0;
    for (const TensorResult* t : n.tensors) bad += t->verdict != VerdictKind::kPass;
    s += std::string("<details") + (bad ? " open" : "") + "><summary><span class=\"m\">" +
         std::to_string(n.tensors.size()) + " tensors of its own" +
         (bad ? ", " + std::to_string(bad) + " not passing" : std::string()) +
         "</span></summary>\n";
  }
  std::size_t unlisted = 0;
  if (!n.tensors.empty()) {
    s += "<table class=\"leaf\">";
    for (const TensorResult* t : n.tensors) {
      if (budget.bounded() && !budget.always.count(t)) {
        if (t->verdict == VerdictKind::kPass || budget.rows == 0) {
          ++unlisted;
          continue;
        }
        --budget.rows;
      }
      // The tensor's name less its module's path, which the summary above shows.
      std::string_view shown = t->name;
      if (!full.empty() && shown.size() > full.size() + 1 && shown.starts_with(full) &&
          shown[full.size()] == '.')
        shown.remove_prefix(full.size() + 1);
      const std::string word = verdict_word(t->verdict);
      s += "<tr><td class=\"" + word + "\">" + word + "</td><td>" + escape(std::string(shown)) +
           "</td><td>" + escape(ratio_text(*t)) + "</td></tr>";
    }
    s += "</table>\n";
    if (unlisted) {
      s += "<p class=\"m\">" + std::to_string(unlisted) + (unlisted == 1 ? " tensor" : " tensors") +
           " not listed (aggregated above)</p>\n";
    }
  }
  if (fold_own) s += "</details>\n";
  std::size_t more = 0, more_tensors = 0, more_failing = 0;
  for (std::size_t c : n.children) {
    const std::string child = full + (full.empty() ? "" : ".") + nodes[c].name;
    if (budget.modules == 0 && !open.count(child)) {
      ++more;
      more_tensors += nodes[c].total;
      more_failing += nodes[c].failing;
      continue;
    }
    render_node(nodes, c, child, open, budget, s, nodes[at].name);
  }
  if (more) {
    s += "<p class=\"m\">" + std::to_string(more) +
         " more modules, not drawn: " + std::to_string(more_tensors) + " tensors, " +
         std::to_string(more_failing) + " not passing (counted above)</p>\n";
  }
  s += "</details>\n";
}

constexpr std::size_t kMaxDepth = 64;

std::string module_tree(const Report& report) {
  std::vector<const TensorResult*> in_order;
  for (const auto& r : report.tensors) in_order.push_back(&r);
  std::stable_sort(
      in_order.begin(), in_order.end(),
      [](const TensorResult* a, const TensorResult* b) { return a->order < b->order; });
  std::vector<ModuleNode> nodes(1);
  nodes[0].name = "(model)";
  for (const TensorResult* r : in_order) {
    std::size_t at = 0;
    const std::string module = module_of(*r);
    std::vector<std::string_view> parts = components(module);
    // A tree at most kMaxDepth deep (the recursion that renders it too): the rest of a deeper
    // path is one node.
    if (parts.size() > kMaxDepth) {
      const std::size_t from =
          static_cast<std::size_t>(parts[kMaxDepth - 1].data() - module.data());
      parts.resize(kMaxDepth - 1);
      parts.push_back(std::string_view(module).substr(from));
    }
    for (std::string_view part : parts) {
      const auto it = nodes[at].child_at.find(part);
      if (it != nodes[at].child_at.end()) {
        at = it->second;
        continue;
      }
      const std::size_t next = nodes.size();
      nodes[at].child_at.emplace(std::string(part), next);
      nodes[at].children.push_back(next);
      nodes.emplace_back();
      nodes.back().name = std::string(part);
      at = next;
    }
    nodes[at].tensors.push_back(r);
  }
  aggregate(nodes, 0);
  // Open: the model, and the way to where it first went wrong and to its worst tensor.
  std::set<std::string, std::less<>> open{""};
  auto open_path = [&](const std::string& module) {
    std::string prefix;
    for (std::string_view part : components(module)) {
      prefix += (prefix.empty() ? "" : ".") + std::string(part);
      open.insert(prefix);
    }
  };
  if (report.first_divergence) {
    for (const auto* p : {&report.first_divergence->forward, &report.first_divergence->backward})
      if (*p) open_path((*p)->module);
  }
  TreeBudget budget;
  const TensorResult* worst = report.worst();
  if (worst) open_path(module_of(*worst));
  std::string s = "<div class=\"tree\" id=\"modules\">\n";
  if (report.tensors.size() > kListedTensors) {
    budget.modules = kSummaryModules;
    budget.rows = kSummaryRows;
    if (worst) budget.always.insert(worst);
    if (report.first_divergence) {
      for (const auto* p :
           {&report.first_divergence->forward, &report.first_divergence->backward}) {
        if (!*p) continue;
        for (const auto& r : report.tensors)
          if (r.name == (*p)->tensor) budget.always.insert(&r);
      }
    }
    s += "<p id=\"tree-aggregated\">" + std::to_string(report.tensors.size()) +
         " tensors, more than " + std::to_string(kListedTensors) +
         ": aggregated. Each module's line counts all of its tensors; drawn are at most " +
         std::to_string(kSummaryModules) + " modules and " + std::to_string(kSummaryRows) +
         " tensors that do not pass, the worst and the way to it always. The JSON report lists "
         "every tensor.</p>\n";
  }
  render_node(nodes, 0, "", open, budget, s);
  return s + "</div>\n";
}

constexpr const char* kStyle = R"(<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h1.fail { color: #b00020; } h1.pass { color: #1b5e20; }
.divergence { background: #fff3e0; border-left: 4px solid #e65100; padding: 8px 12px; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: 13px; } th, td { padding: 2px 8px; text-align: left; }
th { background: #eee; cursor: pointer; } tr.fail td, tr.error td { background: #ffebee; }
td:nth-child(5), td:nth-child(6), td:nth-child(7), td:nth-child(8) { text-align: right; }
#tensors td:nth-child(9) { min-width: 22em; }
svg { border: 1px solid #ddd; margin: 8px 0; } .grid { stroke: #eee; } .tick, .label { font-size: 11px; fill: #555; }
circle.pass { fill: #2e7d32; } circle.fail, circle.error { fill: #c62828; } .limit { stroke: #000; stroke-width: 2; }
.bar { fill: #5c6bc0; } polyline { fill: none; stroke-width: 1.5; } polyline.test { stroke: #c62828; } polyline.ref { stroke: #1565c0; }
circle.test { fill: #c62828; } circle.ref { fill: #1565c0; }
line.pass { stroke: #2e7d32; stroke-width: 1; } line.fail, line.error { stroke: #c62828; stroke-width: 1; }
path.limit { fill: none; stroke-width: 1.5; } .layer { stroke: #d0d0d0; } .direction { stroke: #e65100; stroke-dasharray: 4 3; }
line.first { stroke: #6a1b9a; stroke-width: 2; stroke-dasharray: 2 2; } rect.fwd { fill: #bbdefb; } rect.bwd { fill: #ffe0b2; } .band { font-size: 10px; fill: #333; }
.tree details { margin-left: 18px; } .tree > details { margin-left: 0; } .tree summary { cursor: pointer; }
.tree .m { color: #555; font-size: 12px; } .v { font-size: 11px; font-weight: bold; padding: 0 4px; }
.v.pass { color: #1b5e20; } .v.fail { color: #fff; background: #c62828; }
table.leaf { margin: 2px 0 4px 22px; } table.leaf td { padding: 0 6px; font-size: 12px; }
table.leaf td.fail, table.leaf td.error { color: #fff; background: #c62828; }
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
    const auto [forward, backward] = unjudged_by_direction(report);
    s += "<h2>First divergence</h2>\n<div class=\"divergence\" id=\"first-divergence\">" +
         escape(divergence_text(*report.first_divergence, forward, backward)) + "</div>\n";
  }
  if (!report.warnings.empty()) {
    // A model's warnings can run to hundreds: past the first few, folded.
    constexpr std::size_t kShown = 5;
    const std::size_t n = report.warnings.size();
    s += "<h2>Warnings (" + std::to_string(n) + ")</h2>\n<ul id=\"warnings\">";
    for (std::size_t i = 0; i < n && i < kShown; ++i)
      s += "<li>" + escape(report.warnings[i]) + "</li>";
    s += "</ul>\n";
    if (n > kShown) {
      s += "<details><summary>" + std::to_string(n - kShown) + " more warnings</summary><ul>";
      const std::size_t listed = std::min(n, kListedWarnings);
      for (std::size_t i = kShown; i < listed; ++i)
        s += "<li>" + escape(report.warnings[i]) + "</li>";
      if (listed < n) {
        s += "<li>" + std::to_string(n - listed) +
             " more, not listed here (the text and JSON reports list every one)</li>";
      }
      s += "</ul></details>\n";
    }
  }
  s += "<h2>Ratio per tensor</h2>\n" + ratio_chart(report);
  s += "<h2>Modules</h2>\n<p>Tensors by module, in execution order; each module with its worst "
       "ratio / limit (click to fold).</p>\n" +
       module_tree(report);
  s += "<h2>ULP distance, test vs ref</h2>\n" + ulp_chart(report);
  s += "<h2>Error against magnitude</h2>\n" + magnitude_chart(report);
  s += "<h2>Tensors</h2>\n<p>Could-not-judge first, then failures worst first, then passes in "
       "execution order; click a column to sort.</p>\n" +
       table(report);
  s += kScript;
  return s + "</body></html>\n";
}

}  // namespace numalign
