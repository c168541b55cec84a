// sensitivity.cpp: plants known bugs in copies of the test tensors and judges each copy.
#include "numalign/sensitivity.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <set>

#include "format.hpp"
#include "json.hpp"
#include "numalign/layout.hpp"
#include "numalign/map.hpp"
#include "numalign/text.hpp"

namespace numalign {

namespace {

void store_bits(std::byte* dst, std::size_t size, std::uint64_t bits) {
  for (std::size_t b = 0; b < size; ++b) dst[b] = static_cast<std::byte>(bits >> (8 * b));
}

// k representable values away from zero: the magnitude bits of a sign-magnitude format
// grow by k. A step past the largest finite value keeps the element as it was.
std::uint64_t away_from_zero(DType dt, std::uint64_t bits, std::uint64_t k) {
  if (is_nan_bits(dt, bits)) return bits;
  const std::uint64_t moved = bits + k;
  return std::isfinite(float_from_bits(dt, moved)) ? moved : bits;
}

// The truth rounded toward zero: round to nearest, then one step back when that went past.
std::uint64_t truncated(DType dt, double u) {
  std::uint64_t b = round_to_bits(dt, u);
  const double v = float_from_bits(dt, b);
  if (std::isfinite(v) && std::fabs(v) > std::fabs(u) &&
      (b & ~(std::uint64_t{1} << (bits(dt) - 1))))
    --b;
  return b;
}

double rms_of(const TensorView& v) {
  const std::size_t es = element_size(v.dtype);
  double s = 0;
  std::uint64_t n = 0;
  for (std::uint64_t i = 0; i < v.numel(); ++i) {
    const double x = to_double(v.dtype, v.data + i * es);
    if (std::isfinite(x)) s += x * x, ++n;
  }
  return n ? std::sqrt(s / static_cast<double>(n)) : 0.0;
}

const char* description(PlantedBug bug) {
  switch (bug) {
    case PlantedBug::kDroppedTerm:
      return "one reduction term dropped";
    case PlantedBug::kUlpBias:
      return "2 ULP away from zero, every element";
    case PlantedBug::kOneNan:
      return "one element NaN";
    case PlantedBug::kTruncation:
      return "truncation toward zero";
    case PlantedBug::kSparseUlp:
      return "2 ULP on 1% of the elements";
  }
  return "?";
}

// A copy of `test` with `bug` planted; `truth` may be null (then truncation is not made).
std::vector<std::byte> plant(PlantedBug bug, const TensorView& test, const TensorView* truth,
                             const std::string& name, const SensitivityOptions& sopt) {
  const DType dt = test.dtype;
  const std::size_t es = element_size(dt);
  const std::uint64_t n = test.numel();
  std::vector<std::byte> out(test.data, test.data + n * es);
  std::mt19937_64 rng(sopt.seed ^ std::hash<std::string>{}(name));
  std::normal_distribution<double> normal;
  const double term =
      bug == PlantedBug::kDroppedTerm
          ? rms_of(truth ? *truth : test) /
                std::sqrt(static_cast<double>(std::max<std::uint64_t>(1, sopt.reduction_terms)))
          : 0;
  const std::size_t us = truth ? element_size(truth->dtype) : 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::byte* p = out.data() + i * es;
    const std::uint64_t b = load_bits(dt, p);
    std::uint64_t planted = b;
    switch (bug) {
      case PlantedBug::kDroppedTerm:
        planted = round_to_bits(dt, float_from_bits(dt, b) - term * normal(rng));
        break;
      case PlantedBug::kUlpBias:
        planted = away_from_zero(dt, b, 2);
        break;
      case PlantedBug::kOneNan:
        if (i == n / 2) planted = round_to_bits(dt, NAN);
        break;
      case PlantedBug::kTruncation:
        planted = truncated(dt, to_double(truth->dtype, truth->data + i * us));
        break;
      case PlantedBug::kSparseUlp:
        if (rng() % 100 == 0) planted = away_from_zero(dt, b, 2);
        break;
    }
    store_bits(p, es, planted);
  }
  return out;
}

// "name (ratio R, limit L)" of a result.
std::string describe(const TensorResult& r) {
  std::string s = r.name;
  if (r.ratio && r.limit) {
    s += " (ratio " + detail::format_number(*r.ratio) + ", limit " +
         detail::format_number(*r.limit) + ")";
  }
  return s;
}

SensitivityRow row_as_is(const Report& report) {
  SensitivityRow row;
  row.bug = "(none: the run as it is)";
  row.caught = !report.aligned();
  row.failing = report.count(VerdictKind::kFail) + report.count(VerdictKind::kError);
  if (const TensorResult* w = report.worst()) row.worst = describe(*w);
  return row;
}

// A planted run's row: only the planted tensors count, and only those that passed as they
// were can show the bug caught (a tensor failing already fails whatever is planted).
SensitivityRow row_of(const std::string& bug, const Report& report,
                      const std::set<std::string>& planted, const std::set<std::string>& passed) {
  SensitivityRow row;
  row.bug = bug;
  row.planted = planted.size();
  const TensorResult* worst = nullptr;
  std::size_t can_tell = 0;
  for (const auto& r : report.tensors) {
    if (!planted.count(r.name)) continue;
    const bool was_passing = passed.count(r.name) > 0;
    can_tell += was_passing;
    if (r.verdict == VerdictKind::kPass) continue;
    ++row.failing;
    row.caught = row.caught || was_passing;
    if (was_passing && (!worst || severity(r) > severity(*worst))) worst = &r;
  }
  if (worst) row.worst = describe(*worst);
  if (can_tell == 0) {
    row.applicable = false;
    row.caught = false;
    row.why_not = planted.empty() ? "no floating tensor to plant it in"
                                  : "every tensor it was planted in fails as it is";
  }
  return row;
}

}  // namespace

std::vector<PlantedBug> all_planted_bugs() {
  return {PlantedBug::kDroppedTerm, PlantedBug::kUlpBias, PlantedBug::kOneNan,
          PlantedBug::kTruncation, PlantedBug::kSparseUlp};
}

Sensitivity sensitivity(const Trace& test, const Trace& ref, const Trace* truth,
                        const JudgeOptions& options, const SensitivityOptions& sopt) {
  const Pairing pairing = pair_runs({&test}, ref, truth, options);
  return sensitivity(pairing.triples, options, sopt);
}

Sensitivity sensitivity(const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                        const SensitivityOptions& sopt) {
  Sensitivity result;
  std::vector<SensitivityRow>& rows = result.rows;
  const Report as_is = judge_tensors(tensors, options);
  result.settings = as_is.settings;
  rows.push_back(row_as_is(as_is));
  std::set<std::string> passed;
  for (const auto& r : as_is.tensors) {
    if (r.verdict == VerdictKind::kPass) passed.insert(r.name);
  }
  const bool any_truth = std::any_of(tensors.begin(), tensors.end(),
                                     [](const TensorTriple& t) { return t.truth != nullptr; });
  for (PlantedBug bug : all_planted_bugs()) {
    std::string what = description(bug);
    if (bug == PlantedBug::kDroppedTerm)
      what += " (K = " + std::to_string(sopt.reduction_terms) + ")";
    if (bug == PlantedBug::kTruncation && !any_truth) {
      SensitivityRow r;
      r.bug = what;
      r.applicable = false;
      r.why_not = "needs a truth";
      rows.push_back(r);
      continue;
    }
    // One bug at a time: the copies of one planted run, then its judgement.
    std::vector<std::vector<std::byte>> copies;
    std::vector<TensorView> views;
    copies.reserve(tensors.size());
    views.reserve(tensors.size());
    std::vector<TensorTriple> planted = tensors;
    std::set<std::string> planted_names;
    for (TensorTriple& t : planted) {
      if (!t.test || !t.ref || !is_floating(t.test->dtype) || t.test->dtype != t.ref->dtype ||
          t.test->shape != t.ref->shape)
        continue;
      const TensorView* truth =
          t.truth && t.truth->shape == t.test->shape && is_judgeable(t.truth->dtype) ? t.truth
                                                                                     : nullptr;
      if (bug == PlantedBug::kTruncation && !truth) continue;
      // A mapped piece is gathered here: the planted copy is a whole tensor anyway.
      const ContiguousView test_data(*t.test);
      const std::optional<ContiguousView> truth_data =
          truth ? std::optional<ContiguousView>(std::in_place, *truth) : std::nullopt;
      copies.push_back(
          plant(bug, test_data.get(), truth_data ? &truth_data->get() : nullptr, t.name, sopt));
      views.push_back(TensorView{t.test->dtype, t.test->shape, copies.back().data()});
      t.test = &views.back();
      planted_names.insert(t.name);
    }
    rows.push_back(row_of(what, judge_tensors(planted, options), planted_names, passed));
  }
  return result;
}

std::string render_sensitivity_text(const Sensitivity& s) {
  const std::vector<SensitivityRow>& rows = s.rows;
  const std::string& settings = s.settings;
  std::string out = "numalign sensitivity: would this rule catch these bugs in this run?\n";
  if (!settings.empty()) out += "  settings: " + printable(settings) + "\n";
  out += "\nplanted bug                             caught  failing   worst\n";
  for (const auto& r : rows) {
    std::string bug = r.bug;
    if (bug.size() < 40) bug += std::string(40 - bug.size(), ' ');
    if (!r.applicable) {
      out += bug + "n/a     (" + r.why_not + ")\n";
      continue;
    }
    const bool baseline = &r == &rows.front();
    std::string caught = baseline ? "-" : r.caught ? "yes" : "NO";
    caught += std::string(8 - caught.size(), ' ');
    std::string failing = std::to_string(r.failing);
    if (!baseline) failing += "/" + std::to_string(r.planted);
    failing += std::string(failing.size() < 10 ? 10 - failing.size() : 1, ' ');
    out += bug + caught + failing + (r.worst.empty() ? "-" : printable(r.worst)) + "\n";
  }
  std::size_t missed = 0, told = 0;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    missed += rows[i].applicable && !rows[i].caught;
    told += rows[i].applicable;
  }
  if (!rows.empty() && rows.front().caught) {
    out += "\nThe run fails as it is (" + std::to_string(rows.front().failing) +
           " tensor(s)): only tensors that passed as they were count as catching a bug.\n";
  }
  if (told == 0) {
    return out + "\nNo tensor passes as it is: this table means nothing; fix the failures first.\n";
  }
  out += "\n" +
         (missed ? std::to_string(missed) + " planted bug(s) would pass this rule unnoticed"
                 : std::string("every planted bug would fail this rule")) +
         "\n";
  return out;
}

std::string render_sensitivity_json(const Sensitivity& s) {
  detail::JsonWriter w(detail::JsonStyle::kTerminalSafe);
  w.begin_object();
  w.key("settings").string(s.settings);
  w.key("bugs").begin_array();
  for (const auto& r : s.rows) {
    w.begin_object();
    w.key("bug").string(r.bug);
    w.key("applicable").boolean(r.applicable);
    if (!r.applicable) w.key("why_not").string(r.why_not);
    w.key("caught").boolean(r.caught);
    w.key("failing").integer(r.failing);
    w.key("planted").integer(r.planted);
    w.key("worst");
    if (r.worst.empty())
      w.null();
    else
      w.string(r.worst);
    w.end_object();
  }
  w.end_array();
  w.end_object();
  return w.take() + "\n";
}

}  // namespace numalign
