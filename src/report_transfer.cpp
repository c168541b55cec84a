// report_transfer.cpp: a report's bytes (every field, fixed-width little-endian) and the
// merge of several reports into one.
#include "numalign/report_transfer.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <type_traits>

#include "numalign/version.hpp"

namespace numalign {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the report encoding copies integers in the machine's byte order");

// A field added to these structs must be added to the encoding too: these sizes trip first.
static_assert(sizeof(Metrics) == 288 && sizeof(TensorResult) == 552,
              "Metrics or TensorResult changed: update encode_report/decode_report");

constexpr std::string_view kMagic = "numalign-report/" NUMALIGN_VERSION "\n";

class Writer {
 public:
  template <class T>
  requires std::is_arithmetic_v<T>
  void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void put(std::string_view s) {
    put<std::uint64_t>(s.size());
    out_.append(s);
  }
  void put(bool b) { put<std::uint8_t>(b ? 1 : 0); }
  template <class T>
  void put(const std::optional<T>& v) {
    put(v.has_value());
    if (v) put(*v);
  }
  void raw(std::string_view s) { out_.append(s); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& where) : in_(bytes), where_(where) {}

  template <class T>
  requires std::is_arithmetic_v<T> T get() {
    need(sizeof(T), "a number");
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  bool flag() {
    const auto b = get<std::uint8_t>();
    if (b > 1) bad("a flag is " + std::to_string(b));
    return b == 1;
  }
  std::string text() {
    const auto n = count(1);
    std::string s(in_.substr(at_, n));
    at_ += n;
    return s;
  }
  std::optional<double> optional_number() {
    return flag() ? std::optional(get<double>()) : std::nullopt;
  }
  // A count of items of at least `item_bytes` each: one the remaining bytes can hold.
  std::uint64_t count(std::size_t item_bytes) {
    const auto n = get<std::uint64_t>();
    if (n > (in_.size() - at_) / item_bytes)
      bad("a count of " + std::to_string(n) + " runs past the end");
    return n;
  }
  void expect(std::string_view s, const char* what) {
    if (in_.substr(at_, s.size()) != s) bad(what);
    at_ += s.size();
  }
  bool done() const { return at_ == in_.size(); }
  [[noreturn]] void bad(const std::string& problem) const {
    fail(where_, "not a report this numalign (" NUMALIGN_VERSION ") encoded: " + problem +
                     " (at byte " + std::to_string(at_) + " of " + std::to_string(in_.size()) +
                     ")");
  }

 private:
  void need(std::size_t n, const char* what) const {
    if (in_.size() - at_ < n) bad(std::string("truncated where ") + what + " should be");
  }
  std::string_view in_;
  const std::string& where_;
  std::size_t at_ = 0;
};

void put_counts(Writer& w, const NonFinite& n) {
  w.put(n.nan);
  w.put(n.inf);
}

NonFinite get_counts(Reader& r) {
  NonFinite n;
  n.nan = r.get<std::uint64_t>();
  n.inf = r.get<std::uint64_t>();
  return n;
}

template <class List>
void put_list(Writer& w, const List& v) {
  w.put<std::uint64_t>(v.size());
  for (const auto& x : v) w.put(x);
}

// One member of each element, as put_list writes a list of them.
template <class T, class M>
void put_member_list(Writer& w, const std::vector<T>& v, M T::*member) {
  w.put<std::uint64_t>(v.size());
  for (const auto& x : v) w.put(x.*member);
}

template <class T>
std::vector<T> get_list(Reader& r) {
  std::vector<T> v(r.count(sizeof(T)));
  for (auto& x : v) x = r.get<T>();
  return v;
}

void put_metrics(Writer& w, const Metrics& m) {
  w.put(m.numel);
  w.put(m.floating);
  w.put(m.has_truth);
  for (double v : {m.error, m.baseline, m.max_abs_truth, m.max_abs_ref_truth, m.rms_truth}) {
    w.put(v);
  }
  w.put(m.max_abs_truth_index);
  for (double v : {m.rel_l2, m.cosine, m.mean_error, m.eb_test, m.eb_ref}) w.put(v);
  w.put(m.test_differs_truth);
  w.put(m.ref_differs_truth);
  w.put(m.max_abs_ref);
  for (auto v : {m.max_abs_ref_index, m.not_close, m.bits_differ, m.values_differ}) w.put(v);
  w.put(m.ulp.max);
  w.put(m.ulp.any_inf);
  w.put(m.ulp.both_nan);
  w.put(m.ulp.max_index);
  for (int b = 0; b < kUlpBins; ++b) w.put(m.ulp.hist[b]);
  for (const auto* n : {&m.test_nonfinite, &m.ref_nonfinite, &m.truth_nonfinite}) put_counts(w, *n);
  // As three lists (counts, then each sum), as before bins were one vector.
  put_member_list(w, m.magnitude.bins, &MagnitudeBin::count);
  put_member_list(w, m.magnitude.bins, &MagnitudeBin::sq_err_test);
  put_member_list(w, m.magnitude.bins, &MagnitudeBin::sq_err_ref);
}

Metrics get_metrics(Reader& r) {
  Metrics m;
  m.numel = r.get<std::uint64_t>();
  m.floating = r.flag();
  m.has_truth = r.flag();
  for (double* v : {&m.error, &m.baseline, &m.max_abs_truth, &m.max_abs_ref_truth, &m.rms_truth}) {
    *v = r.get<double>();
  }
  m.max_abs_truth_index = r.get<std::uint64_t>();
  for (double* v : {&m.rel_l2, &m.cosine, &m.mean_error, &m.eb_test, &m.eb_ref}) {
    *v = r.get<double>();
  }
  m.test_differs_truth = r.get<std::uint64_t>();
  m.ref_differs_truth = r.get<std::uint64_t>();
  m.max_abs_ref = r.get<double>();
  for (auto* v : {&m.max_abs_ref_index, &m.not_close, &m.bits_differ, &m.values_differ}) {
    *v = r.get<std::uint64_t>();
  }
  m.ulp.max = r.get<std::uint64_t>();
  m.ulp.any_inf = r.flag();
  m.ulp.both_nan = r.get<std::uint64_t>();
  m.ulp.max_index = r.get<std::uint64_t>();
  for (int b = 0; b < kUlpBins; ++b) m.ulp.hist.set(b, r.get<std::uint64_t>());
  for (auto* n : {&m.test_nonfinite, &m.ref_nonfinite, &m.truth_nonfinite}) *n = get_counts(r);
  const auto counts = get_list<std::uint64_t>(r);
  const auto sq_err_test = get_list<double>(r);
  const auto sq_err_ref = get_list<double>(r);
  const std::size_t bins = counts.size();
  if ((bins != 0 && bins != static_cast<std::size_t>(kMagnitudeBins)) ||
      sq_err_test.size() != bins || sq_err_ref.size() != bins) {
    r.bad("a magnitude profile of " + std::to_string(bins) + " bins");
  }
  for (std::size_t b = 0; b < bins; ++b)
    m.magnitude.bins.push_back({counts[b], sq_err_test[b], sq_err_ref[b]});
  return m;
}

void put_map(Writer& w, const std::map<std::string, std::string>& m) {
  w.put<std::uint64_t>(m.size());
  for (const auto& [k, v] : m) {
    w.put(k);
    w.put(v);
  }
}

std::map<std::string, std::string> get_map(Reader& r) {
  std::map<std::string, std::string> m;
  for (auto n = r.count(2 * sizeof(std::uint64_t)); n > 0; --n) {
    std::string k = r.text();
    m[std::move(k)] = r.text();
  }
  return m;
}

void put_result(Writer& w, const TensorResult& t) {
  w.put(t.name);
  w.put(static_cast<std::uint8_t>(t.verdict));
  w.put(t.rule);
  w.put(t.reason);
  w.put(t.override_reason);
  w.put(t.dtype.has_value());
  if (t.dtype) w.put(static_cast<std::uint8_t>(*t.dtype));
  put_list(w, t.shape);
  w.put(t.metrics.has_value());
  if (t.metrics) put_metrics(w, *t.metrics);
  w.put(t.ratio);
  w.put(t.limit);
  w.put(t.bias_failed);
  w.put<std::uint64_t>(t.order);
  put_map(w, t.tags);
}

TensorResult get_result(Reader& r) {
  TensorResult t;
  t.name = r.text();
  const auto verdict = r.get<std::uint8_t>();
  if (verdict > static_cast<std::uint8_t>(VerdictKind::kError)) {
    r.bad("verdict " + std::to_string(verdict));
  }
  t.verdict = static_cast<VerdictKind>(verdict);
  t.rule = r.text();
  t.reason = r.text();
  t.override_reason = r.text();
  if (r.flag()) {
    const auto d = r.get<std::uint8_t>();
    if (d >= kDTypeCount) r.bad("dtype " + std::to_string(d));
    t.dtype = static_cast<DType>(d);
  }
  t.shape = Shape(get_list<std::uint64_t>(r));
  if (r.flag()) t.metrics = get_metrics(r);
  t.ratio = r.optional_number();
  t.limit = r.optional_number();
  t.bias_failed = r.flag();
  t.order = r.get<std::uint64_t>();
  t.tags = get_map(r);
  return t;
}

void put_point(Writer& w, const std::optional<DivergencePoint>& p) {
  w.put(p.has_value());
  if (!p) return;
  w.put(p->tensor);
  w.put(p->module);
  w.put(p->op);
  w.put(p->inputs_aligned);
  w.put<std::uint64_t>(p->failing_inputs.size());
  for (const auto& s : p->failing_inputs) w.put(s);
}

std::optional<DivergencePoint> get_point(Reader& r) {
  if (!r.flag()) return std::nullopt;
  DivergencePoint p;
  p.tensor = r.text();
  p.module = r.text();
  p.op = r.text();
  if (r.flag()) p.inputs_aligned = r.flag();
  p.failing_inputs.resize(r.count(sizeof(std::uint64_t)));
  for (auto& s : p.failing_inputs) s = r.text();
  return p;
}

}  // namespace

std::string encode_report(const Report& report) {
  Writer w;
  w.raw(kMagic);
  w.put(report.title);
  w.put(report.settings);
  w.put<std::uint64_t>(report.warnings.size());
  for (const auto& s : report.warnings) w.put(s);
  w.put<std::uint64_t>(report.could_not_judge.size());
  for (const auto& s : report.could_not_judge) w.put(s);
  w.put(report.first_divergence.has_value());
  if (report.first_divergence) {
    put_point(w, report.first_divergence->forward);
    put_point(w, report.first_divergence->backward);
  }
  w.put<std::uint64_t>(report.ranking.size());
  for (const auto& m : report.ranking) {
    w.put(m.module);
    w.put(m.tensor);
    w.put(m.ratio);
    w.put(m.limit);
    w.put(m.aligned);
  }
  w.put(report.first_failing);
  w.put<std::uint64_t>(report.tensors.size());
  for (const auto& t : report.tensors) put_result(w, t);
  return w.take();
}

Report decode_report(std::string_view bytes, const std::string& where) {
  Reader r(bytes, where);
  r.expect(kMagic, "it does not start with \"numalign-report/" NUMALIGN_VERSION "\"");
  Report report;
  report.title = r.text();
  report.settings = r.text();
  report.warnings.resize(r.count(sizeof(std::uint64_t)));
  for (auto& s : report.warnings) s = r.text();
  report.could_not_judge.resize(r.count(sizeof(std::uint64_t)));
  for (auto& s : report.could_not_judge) s = r.text();
  if (r.flag()) {
    FirstDivergence d;
    d.forward = get_point(r);
    d.backward = get_point(r);
    report.first_divergence = std::move(d);
  }
  report.ranking.resize(r.count(2 * sizeof(std::uint64_t)));
  for (auto& m : report.ranking) {
    m.module = r.text();
    m.tensor = r.text();
    m.ratio = r.optional_number();
    m.limit = r.optional_number();
    m.aligned = r.flag();
  }
  if (r.flag()) report.first_failing = r.text();
  // The smallest encoded result is well above 16 bytes: the count check stays conservative.
  report.tensors.resize(r.count(16));
  for (auto& t : report.tensors) t = get_result(r);
  if (!r.done()) r.bad("bytes left after the last tensor");
  return report;
}

namespace {

void prefix_point(const std::string& prefix, std::optional<DivergencePoint>& p) {
  if (!p) return;
  p->tensor = prefix + p->tensor;
  p->module = prefix + p->module;
  for (auto& n : p->failing_inputs) n = prefix + n;
}

}  // namespace

Report merge_reports(std::vector<ReportPart> parts, std::string title) {
  Report merged;
  merged.title = std::move(title);
  if (!parts.empty()) merged.settings = parts.front().report.settings;
  std::size_t order_base = 0;
  for (auto& [prefix, report, part_tags] : parts) {
    // "rank1/" -> "rank1: " ahead of the part's own warnings.
    std::string label = prefix;
    while (!label.empty() && label.back() == '/') label.pop_back();
    if (report.settings != merged.settings) {
      merged.warnings.push_back(label + ": judged with other settings (" + report.settings +
                                ") than " + parts.front().prefix + " (" + merged.settings + ")");
    }
    for (const auto& w : report.warnings) merged.warnings.push_back(label + ": " + w);
    for (const auto& w : report.could_not_judge) merged.could_not_judge.push_back(label + ": " + w);
    if (report.first_divergence) {
      // Ranks run side by side: the first divergence is the lowest rank's that has one.
      FirstDivergence d = std::move(*report.first_divergence);
      prefix_point(prefix, d.forward);
      prefix_point(prefix, d.backward);
      if (!merged.first_divergence) merged.first_divergence = FirstDivergence{};
      if (!merged.first_divergence->forward) merged.first_divergence->forward = d.forward;
      if (!merged.first_divergence->backward) merged.first_divergence->backward = d.backward;
    }
    std::size_t part_orders = 0;
    if (report.first_failing && !merged.first_failing)
      merged.first_failing = prefix + *report.first_failing;
    for (auto& t : report.tensors) {
      t.name = prefix + t.name;
      for (const auto& [k, v] : part_tags) t.tags[k] = v;
      part_orders = std::max(part_orders, t.order + 1);
      t.order += order_base;
      merged.tensors.push_back(std::move(t));
    }
    order_base += part_orders;
  }
  merged.sort();
  return merged;
}

}  // namespace numalign
