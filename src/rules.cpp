// rules.cpp: rule specs, same()'s multiplier table and pass inequality, overrides, policy.
#include "numalign/rules.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>

#include "allclose.hpp"
#include "exact_rmse.hpp"
#include "format.hpp"
#include "json_keys.hpp"
#include "measured.hpp"
#include "numalign/error.hpp"
#include "numalign/layout.hpp"
#include "regular_file.hpp"

namespace numalign {

std::string Rule::spec() const {
  switch (kind) {
    case RuleKind::kSame:
      return param > 0 ? "same:" + detail::format_number(param) : "same";
    case RuleKind::kUlp:
      return "ulp:" + detail::format_number(param);
    case RuleKind::kExact:
      return "exact";
    case RuleKind::kAbs:
      return "abs:" + detail::format_number(param);
    case RuleKind::kMeasured:
      return param > 0 ? "measured:" + detail::format_number(param) : "measured";
    case RuleKind::kAllclose:
      return param < 0
                 ? "allclose"
                 : "allclose:" + detail::format_number(param) + "," + detail::format_number(rtol);
  }
  return "?";
}

namespace {

double parse_param(std::string_view text, std::string_view spec, const std::string& where) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 0) {
    fail(where, "bad rule '" + std::string(spec) + "': '" + std::string(text) +
                    "' is not a non-negative number");
  }
  return v;
}

}  // namespace

bool allowance_from_ref(std::string_view spec) {
  return spec.starts_with("same") || spec.starts_with("rmse") || spec.starts_with("measured");
}

Rule parse_rule(std::string_view spec, const std::string& where) {
  const auto colon = spec.find(':');
  const std::string_view head = spec.substr(0, colon);
  const bool has_param = colon != std::string_view::npos;
  const std::string_view tail = has_param ? spec.substr(colon + 1) : std::string_view();
  Rule r;
  // "rmse" is same's former name, still read from older policy files and scripts.
  if (head == "same" || head == "rmse" || head == "measured") {
    r.kind = head == "measured" ? RuleKind::kMeasured : RuleKind::kSame;
    if (has_param) {
      r.param = parse_param(tail, spec, where);
      if (r.param == 0) fail(where, "bad rule '" + std::string(spec) + "': multiplier must be > 0");
    }
  } else if (head == "exact" && !has_param) {
    r.kind = RuleKind::kExact;
  } else if (head == "allclose") {
    r.kind = RuleKind::kAllclose;
    r.param = -1;  // assert_close's defaults for the dtype
    if (has_param) {
      const auto comma = tail.find(',');
      if (comma == std::string_view::npos) {
        fail(where, "bad rule '" + std::string(spec) +
                        "': expected allclose:ATOL,RTOL (or allclose for assert_close's defaults)");
      }
      r.param = parse_param(tail.substr(0, comma), spec, where);
      r.rtol = parse_param(tail.substr(comma + 1), spec, where);
    }
  } else if ((head == "ulp" || head == "abs") && has_param) {
    r.kind = head == "ulp" ? RuleKind::kUlp : RuleKind::kAbs;
    r.param = parse_param(tail, spec, where);
    if (r.kind == RuleKind::kUlp && r.param != std::floor(r.param)) {
      fail(where, "bad rule '" + std::string(spec) + "': K of ulp:K must be an integer");
    }
  } else {
    fail(where, "bad rule '" + std::string(spec) +
                    "': expected measured, measured:LIMIT, same, same:MULTIPLIER, ulp:K, exact, "
                    "abs:X, allclose or allclose:ATOL,RTOL");
  }
  return r;
}

bool selected_by(const std::vector<std::string>& only, std::string_view name) {
  return only.empty() || std::any_of(only.begin(), only.end(),
                                     [&](const std::string& g) { return glob_match(g, name); });
}

double rmse_multiplier(DType dtype, const Shape& shape, double tol, bool larger_for_small,
                       bool force_max) {
  if (force_max) return 10.0;
  std::uint64_t numel = 1;
  for (auto d : shape) numel *= d;
  double m = is_low_precision(dtype) ? 3.0 : 2.0;
  if (larger_for_small && numel <= 10) {
    m = 10.0;
  } else if (larger_for_small && numel <= 500) {
    m = 8.0;
  } else if (numel < 1000 || (shape.size() == 4 && shape[2] == 1 && shape[3] == 1) || tol >= 2e-2) {
    m = 3.0;
  }
  return m;
}

namespace {

// The most a same multiplier may be without a written reason: same()'s largest default.
constexpr double kMaxDefaultMultiplier = 3.0;
constexpr double kMaxUlpWithoutReason = 1.0;

std::optional<std::string> loosening(const Rule& r) {
  if (r.kind == RuleKind::kUlp && r.param > kMaxUlpWithoutReason) {
    return "ulp:" + detail::format_number(r.param) + " allows more than 1 ULP";
  }
  if (r.kind == RuleKind::kSame && r.param > kMaxDefaultMultiplier) {
    return "multiplier " + detail::format_number(r.param) + " is above same()'s largest (3)";
  }
  // assert_close's loosest defaults are bf16's (its rtol is the largest; every atol but
  // float64's is the same).
  const auto [loosest_atol, loosest_rtol] = detail::assert_close_defaults(DType::BF16);
  if (r.kind == RuleKind::kAllclose && (r.param > loosest_atol || r.rtol > loosest_rtol)) {
    return "allclose:" + detail::format_number(r.param) + "," + detail::format_number(r.rtol) +
           " is beyond assert_close's loosest defaults (atol " +
           detail::format_number(loosest_atol) + ", rtol " + detail::format_number(loosest_rtol) +
           ")";
  }
  if (r.kind == RuleKind::kMeasured && r.param > kMeasuredLimit) {
    return "limit " + detail::format_number(r.param) + " is above the measured rule's (" +
           detail::format_number(kMeasuredLimit) + ")";
  }
  return std::nullopt;
}

}  // namespace

bool is_blank(std::string_view reason) {
  return reason.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

void check_override_reasons(const JudgeOptions& options) {
  auto check = [](const Rule& rule, const std::string& reason, const std::string& origin,
                  const std::string& what) {
    if (!reason.empty()) return;
    if (auto why = loosening(rule)) {
      fail(origin, what + " loosens the default (" + *why +
                       ") and has no reason: give one in a policy file "
                       "(\"reason\": \"...\") so the report can say why");
    }
  };
  check(options.default_rule, "", "--rule", "default rule '" + options.default_rule.spec() + "'");
  for (const auto& o : options.overrides) {
    check(o.rule, o.reason, o.origin, "override '" + o.glob + "=" + o.rule.spec() + "'");
  }
}

RuleChoice choose_rule(const std::string& name, DType dtype, const JudgeOptions& options) {
  return RuleSelector(options).choose(name, dtype);
}

RuleSelector::RuleSelector(const JudgeOptions& options) : options_(options) {
  globs_.reserve(options.overrides.size());
  for (const auto& o : options.overrides) globs_.emplace_back(o.glob);
  for (std::size_t i = 0; i < globs_.size(); ++i) {
    const Glob& g = globs_[i];  // globs_ no longer grows: the views stay valid
    if (!g.literal_prefix().empty()) {
      by_prefix_[g.literal_prefix()].push_back(i);
      prefix_lengths_.push_back(g.literal_prefix().size());
    } else if (!g.literal_suffix().empty()) {
      by_suffix_[g.literal_suffix()].push_back(i);
      suffix_lengths_.push_back(g.literal_suffix().size());
    } else {
      unanchored_.push_back(i);
    }
  }
  for (auto* v : {&prefix_lengths_, &suffix_lengths_}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
}

RuleChoice RuleSelector::choose(std::string_view name, DType dtype) const {
  // The last override that matches wins: gather those that can, try them from the last.
  thread_local std::vector<std::size_t> candidates;
  candidates.assign(unanchored_.begin(), unanchored_.end());
  for (std::size_t len : prefix_lengths_) {
    if (len > name.size()) break;
    if (auto it = by_prefix_.find(name.substr(0, len)); it != by_prefix_.end())
      candidates.insert(candidates.end(), it->second.begin(), it->second.end());
  }
  for (std::size_t len : suffix_lengths_) {
    if (len > name.size()) break;
    if (auto it = by_suffix_.find(name.substr(name.size() - len)); it != by_suffix_.end())
      candidates.insert(candidates.end(), it->second.begin(), it->second.end());
  }
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  RuleChoice c{options_.default_rule, nullptr};
  for (std::size_t i : candidates) {
    if (globs_[i].match(name)) {
      c = {options_.overrides[i].rule, &options_.overrides[i]};
      break;
    }
  }
  // Integers and bools have no rounding: same means exact for them, as in same(), and so do
  // measured and allclose (assert_close's defaults for them are (0, 0)).
  if (!is_floating(dtype) && c.rule.kind != RuleKind::kUlp && c.rule.kind != RuleKind::kAbs)
    c.rule = Rule{RuleKind::kExact, 0};
  return c;
}

bool distance_within(std::uint64_t distance, double bound) {
  if (!(bound >= 0)) return false;
  if (bound >= 18446744073709551616.0) return true;  // 2^64: beyond every distance
  return distance <= static_cast<std::uint64_t>(std::floor(bound));
}

bool bias_check_fails(const Metrics& m) {
  if (!m.has_truth || m.test_differs_truth == 0) return false;
  const double noise = 4.0 / std::sqrt(static_cast<double>(m.test_differs_truth));
  const double eb = std::fabs(m.eb_test);
  return eb > noise && eb > 2.0 * std::fabs(m.eb_ref) + 0.05;
}

namespace {

using detail::format_number;

// A ULP count explodes where values cancel to near zero: a difference of one ULP of the
// tensor's large values is thousands of ULPs of a tiny output. Says so when the largest
// |test - ref| is within one ULP at 4 times the truth's RMS (about the largest values of
// normally distributed data).
std::string cancellation_note(DType dt, const Metrics& m) {
  if (!m.has_truth || !(m.rms_truth > 0) || !std::isfinite(m.rms_truth)) return "";
  const double large = 4 * m.rms_truth;
  const std::uint64_t b = round_to_bits(dt, large);
  const double ulp = float_from_bits(dt, b + 1) - float_from_bits(dt, b);
  if (!(ulp > 0) || !std::isfinite(ulp) || m.max_abs_ref > ulp) return "";
  return "; yet the largest |test - ref|, " + format_number(m.max_abs_ref) +
         ", is within 1 ULP at 4x the tensor's RMS magnitude (" + format_number(large) +
         "): the ULP count explodes where values cancel to near zero (ulp:K suits results of "
         "one identical rounding; same and measured judge kernels that round at different points)";
}

// Why a ULP distance is infinite: NaN on one side only, or NaN in both (NaN != NaN unless
// equal_nan, as in torch).
std::string nan_words(const Metrics& m, bool equal_nan) {
  const std::uint64_t infinite = m.ulp.hist[kUlpInfBin];
  const std::uint64_t both = equal_nan ? 0 : m.ulp.both_nan;
  std::string s;
  if (both > 0) {
    s = "NaN in both test and ref at " + std::to_string(both) +
        " element(s) (unequal without equal_nan); ";
  }
  if (infinite > both) s += "NaN against a number; ";
  return s;
}

// Every element of test, ref and truth is a number (what the exact inequality needs; the
// RMSEs can still overflow to inf).
bool all_finite(const Metrics& m) {
  for (const NonFinite& nf : {m.test_nonfinite, m.ref_nonfinite, m.truth_nonfinite}) {
    if (nf.nan + nf.inf > 0) return false;
  }
  return m.numel > 0 && !std::isnan(m.error) && !std::isnan(m.baseline);
}

Verdict evaluate_rmse(const Rule& rule, const TensorView& test, const TensorView& ref,
                      const TensorView* truth, const Metrics& m, const JudgeOptions& o) {
  Verdict v;
  const double multiplier =
      rule.param > 0 ? rule.param
                     : rmse_multiplier(test.dtype, test.shape, o.tol, o.larger_multiplier_for_small,
                                       o.force_max_multiplier);
  v.limit = multiplier;
  if (m.has_truth) v.ratio = m.baseline > 0 ? m.error / m.baseline : (m.error > 0 ? INFINITY : 0.0);
  if (m.has_truth && std::isnan(m.error) && m.numel > 0) v.ratio = NAN;
  if (m.not_close == 0) {
    v.reason = "allclose to ref at tol " + format_number(o.tol);
    return v;
  }
  if (truth == nullptr) {
    v.kind = VerdictKind::kError;
    v.reason = "rule same needs a float64 truth trace (or choose ulp:K, exact or abs:X)";
    return v;
  }
  if (truth->dtype != DType::F64) {
    v.kind = VerdictKind::kError;
    v.reason = "truth is " + std::string(name(truth->dtype)) + ", not F64: rule same cannot judge";
    return v;
  }
  if (m.truth_nonfinite.nan == 0 && m.test_nonfinite.nan == 0 && m.ref_nonfinite.nan > 0 &&
      loosely_close_to_truth(ContiguousView(test).get(), ContiguousView(*truth).get(),
                             o.equal_nan)) {
    v.reason = "ref has NaN; test is allclose to truth at 4e-2 (same()'s NaN escape)";
    return v;
  }
  if (std::isnan(m.baseline)) {
    v.warnings.push_back({m.ref_nonfinite.nan > 0
                              ? "found NaN in reference: run it in higher precision"
                              : "RMSE of ref against truth is NaN: ref and truth hold Inf at the "
                                "same element (Inf - Inf), so the allowance is undefined",
                          ""});
  }
  const double bound = multiplier * m.baseline + o.tol / 10.0;
  bool pass = m.error <= bound;
  // On the line, float64 rounding (same()'s or ours) could decide: exact arithmetic does.
  const bool exact = all_finite(m) && !detail::rmse_verdict_certain(m.error, bound, multiplier);
  if (exact)
    pass = detail::rmse_inequality_holds(
        detail::exact_squares(ContiguousView(test).get(), ContiguousView(ref).get(),
                              ContiguousView(*truth).get()),
        multiplier, o.tol);
  if (!pass && o.equal_nan && std::isnan(m.error) && std::isnan(m.baseline)) pass = true;
  if (m.baseline == 0 && m.error >= 0) {
    v.warnings.push_back({"baseline RMSE is 0 (ref equals truth): the allowance is only tol/10 = " +
                              format_number(o.tol / 10.0),
                          ""});
  }
  if (pass) {
    v.reason = "error " + format_number(m.error) + " <= " + format_number(multiplier) +
               " x baseline " + format_number(m.baseline) + " + tol/10";
  } else {
    v.kind = VerdictKind::kFail;
    v.reason = "RMSE vs truth " + format_number(m.error) + " > " + format_number(multiplier) +
               " x ref's " + format_number(m.baseline) + " + tol/10";
  }
  if (exact) {
    v.reason += std::isfinite(m.error) && std::isfinite(bound)
                    ? " (too close to call in float64: decided in exact arithmetic)"
                    : " (float64 overflows: decided in exact arithmetic)";
  }
  return v;
}

// assert_close's test, element by element, and its message's figures: how many elements lie
// beyond the bound, the greatest absolute and relative differences and where they are. The
// ratio is the worst element's |test - ref| over its bound (at most 1 passes).
Verdict evaluate_allclose(const Rule& rule, const TensorView& test, const TensorView& ref,
                          const JudgeOptions& o) {
  const auto [atol, rtol] =
      rule.param < 0 ? detail::assert_close_defaults(test.dtype) : std::pair{rule.param, rule.rtol};
  const detail::CloseStats s = detail::close_stats(
      ContiguousView(test).get(), ContiguousView(ref).get(), atol, rtol, o.equal_nan);
  Verdict v;
  v.limit = 1;
  v.ratio = s.worst;
  v.kind = s.beyond == 0 ? VerdictKind::kPass : VerdictKind::kFail;
  const std::uint64_t n = test.numel();
  const std::string bound =
      "|test - ref| <= " + format_number(atol) + " + " + format_number(rtol) + " |ref|";
  v.reason = std::to_string(s.beyond) + " / " + std::to_string(n) + " elements (" +
             format_number(n ? 100.0 * static_cast<double>(s.beyond) / static_cast<double>(n) : 0) +
             "%) beyond " + bound;
  if ((s.beyond > 0) == (s.worst <= 1)) {  // the ratio on the other side of 1 than the verdict
    v.reason +=
        " (at the bound: decided as torch.isclose rounds in " + std::string(name(test.dtype)) + ")";
  }
  if (s.max_abs > 0) {
    v.reason += "; greatest absolute difference " + format_number(s.max_abs) + " at " +
                format_index(test.shape, s.max_abs_index) + ", greatest relative difference " +
                format_number(s.max_rel) + " at " + format_index(test.shape, s.max_rel_index);
  }
  return v;
}

std::uint64_t nonfinite(const NonFinite& nf) { return nf.nan + nf.inf; }

double ratio_of(double error, double allowed) {
  return allowed > 0 ? error / allowed : (error > 0 ? INFINITY : 0.0);
}

// measured[:LIMIT]: test's error against the truth may be at most LIMIT times ref's, over the
// whole tensor (RMSE) and at its worst element, ref's floored at half a unit roundoff of the
// truth's RMS magnitude; and test may not be biased in sign where ref is not (the bias check,
// with |EB(test)| above kMeasuredBiasFloor). No absolute tolerance: small values are judged
// as large ones.
// The measured rule on finite metrics: `index_of` maps a metric's element index to the
// tensor's (the finite elements when NaN or Inf were left out).
// `shift`: the power of two the values were scaled by (the floor is printed unscaled).
Verdict measured_on_finite(double limit, DType dtype, const Shape& shape, const Metrics& m,
                           const std::function<std::uint64_t(std::uint64_t)>& index_of,
                           int shift = 0) {
  Verdict v;
  v.limit = limit;
  const double floor = 0.5 * unit_roundoff(dtype) * m.rms_truth;
  const double whole = ratio_of(m.error, std::max(m.baseline, floor));
  const double worst = ratio_of(m.max_abs_truth, std::max(m.max_abs_ref_truth, floor));
  const bool biased = bias_check_fails(m) && std::fabs(m.eb_test) > kMeasuredBiasFloor;
  v.ratio = std::max(whole, worst);
  const std::string figures =
      "RMSE " + format_number(whole) + "x ref's, worst element " + format_number(worst) +
      "x ref's at " + format_index(shape, index_of(m.max_abs_truth_index)) + ", error balance " +
      format_number(m.eb_test) + " (ref " + format_number(m.eb_ref) + ")";
  std::vector<std::string> failed;
  if (whole > limit) failed.push_back("RMSE vs truth above " + format_number(limit) + "x ref's");
  if (worst > limit) failed.push_back("worst element above " + format_number(limit) + "x ref's");
  if (biased) failed.push_back("biased in sign where ref is not");
  v.kind = failed.empty() ? VerdictKind::kPass : VerdictKind::kFail;
  v.reason = (failed.empty() ? "" : detail::joined(failed, "; ") + ": ") + figures;
  if (m.baseline < floor || m.max_abs_ref_truth < floor) {
    v.reason += " (ref's error floored at half a roundoff of the truth's RMS, " +
                format_number(std::ldexp(floor, -shift)) + ")";
  }
  v.bias_failed = biased;  // the rule's own bias check (--check-bias adds nothing to it)
  return v;
}

std::string nonfinite_word(std::uint64_t count) {
  return std::to_string(count) + (count == 1 ? " element" : " elements");
}

// Whether float64's squares lost the tensor's sums: they overflowed (an RMSE or norm that is
// not finite, a truth whose norm swamps its error) or underflowed (an error nonzero element
// by element whose RMSE is 0), or come near either end of float64's range.
bool squares_out_of_range(const Metrics& m) {
  constexpr double kLow = 0x1p-450, kHigh = 0x1p+450;
  const auto extreme = [&](double x) { return x > 0 && (x < kLow || x > kHigh); };
  // (A relative L2 of Inf is a truth of zeros, not an overflow: its RMS is 0, as taken.)
  return !std::isfinite(m.error) || !std::isfinite(m.baseline) || std::isnan(m.rel_l2) ||
         (m.error == 0 && m.max_abs_truth > 0) || (m.baseline == 0 && m.max_abs_ref_truth > 0) ||
         !std::isfinite(m.rms_truth) || extreme(m.rms_truth) || extreme(m.max_abs_truth) ||
         extreme(m.max_abs_ref_truth) || extreme(m.error) || extreme(m.baseline);
}

// The measured rule's figures are ratios, unchanged when every value is scaled by a power of
// two: the finite values are scaled so that the largest is near 1 (exactly, but for values
// 2^1000 below it, which add nothing to the sums) and their metrics taken again.
Metrics metrics_near_one(detail::NonfiniteSplit& s, int& shift) {
  double largest = 0;
  for (const auto* values : {&s.test, &s.ref, &s.truth}) {
    for (double x : *values) largest = std::max(largest, std::fabs(x));
  }
  shift = 0;
  if (largest > 0) {
    shift = -std::ilogb(largest);
    for (auto* values : {&s.test, &s.ref, &s.truth}) {
      for (double& x : *values) x = std::ldexp(x, shift);
    }
  }
  const Shape flat{static_cast<std::uint64_t>(s.finite.size())};
  const auto view = [&](const std::vector<double>& values) {
    return TensorView{DType::F64, flat, reinterpret_cast<const std::byte*>(values.data())};
  };
  const TensorView t = view(s.test), r = view(s.ref), u = view(s.truth);
  const MetricsInput in{&t, &r, &u};
  return compute_metrics(std::span(&in, 1), MetricOptions{}, 1)[0];
}

// NaN or Inf somewhere, or sums out of float64's range: the places where test, ref and
// truth hold NaN or Inf alike are left out and the finite rest judged near 1; ref
// disagreeing with its truth there cannot be judged, test disagreeing with both fails.
Verdict measured_on_copies(double limit, const TensorView& test, const TensorView& ref,
                           const TensorView& truth) {
  detail::NonfiniteSplit s = detail::split_nonfinite(
      ContiguousView(test).get(), ContiguousView(ref).get(), ContiguousView(truth).get());
  Verdict v;
  v.limit = limit;
  if (s.ref_off > 0) {
    v.kind = VerdictKind::kError;
    v.reason = "ref and truth differ in NaN or Inf at " + nonfinite_word(s.ref_off) +
               " (first at " + format_index(test.shape, s.first_ref_off) +
               "): ref's error there is unbounded, so it sets no allowance";
    return v;
  }
  if (s.test_off > 0) {
    v.kind = VerdictKind::kFail;
    v.ratio = INFINITY;
    v.reason = "test differs from ref and truth in NaN or Inf at " + nonfinite_word(s.test_off) +
               " (first at " + format_index(test.shape, s.first_test_off) + ")";
    return v;
  }
  const std::string left_out = s.alike ? " (" + nonfinite_word(s.alike) +
                                             " NaN or Inf alike in test, ref and truth left out)"
                                       : std::string();
  if (s.finite.empty()) {
    v.kind = VerdictKind::kPass;
    v.ratio = 0;
    v.reason = "all " + nonfinite_word(s.alike) + " NaN or Inf alike in test, ref and truth";
    return v;
  }
  int shift = 0;
  const Metrics m = metrics_near_one(s, shift);
  v = measured_on_finite(
      limit, test.dtype, test.shape, m, [&](std::uint64_t i) { return s.finite[i]; }, shift);
  v.reason += left_out;
  return v;
}

Verdict evaluate_measured(const Rule& rule, const TensorView& test, const TensorView& ref,
                          const TensorView* truth, const Metrics& m) {
  const double limit = rule.param > 0 ? rule.param : kMeasuredLimit;
  if (truth == nullptr || truth->dtype != DType::F64) {
    Verdict v;
    v.limit = limit;
    v.kind = VerdictKind::kError;
    v.reason = truth ? "truth is " + std::string(name(truth->dtype)) +
                           ", not F64: rule measured cannot judge"
                     : "rule measured needs a float64 truth trace (or choose ulp:K, exact, "
                       "abs:X or allclose)";
    return v;
  }
  if (m.numel == 0) {
    Verdict v;
    v.limit = limit;
    v.ratio = 0;
    v.reason = "empty: no elements to differ";
    return v;
  }
  if (nonfinite(m.test_nonfinite) + nonfinite(m.ref_nonfinite) + nonfinite(m.truth_nonfinite) > 0 ||
      squares_out_of_range(m)) {
    return measured_on_copies(limit, test, ref, *truth);
  }
  return measured_on_finite(limit, test.dtype, test.shape, m, [](std::uint64_t i) { return i; });
}

}  // namespace

Verdict evaluate(const RuleChoice& choice, const TensorView& test, const TensorView& ref,
                 const TensorView* truth, const Metrics& m, const JudgeOptions& o) {
  const Rule& rule = choice.rule;
  Verdict v;
  switch (rule.kind) {
    case RuleKind::kSame:
      v = evaluate_rmse(rule, test, ref, truth, m, o);
      break;
    case RuleKind::kUlp: {
      v.limit = rule.param;
      // Integers too: ulp.max is their exact largest difference (K is an integer).
      v.ratio = m.ulp.any_inf ? INFINITY : static_cast<double>(m.ulp.max);
      const bool pass = !m.ulp.any_inf && distance_within(m.ulp.max, rule.param);
      v.kind = pass ? VerdictKind::kPass : VerdictKind::kFail;
      v.reason = (m.ulp.any_inf ? nan_words(m, o.equal_nan) : std::string()) + "max ULP " +
                 format_number(*v.ratio) + (pass ? " <= " : " > ") + format_number(rule.param);
      if (!pass && m.floating && !m.ulp.any_inf) v.reason += cancellation_note(test.dtype, m);
      break;
    }
    case RuleKind::kExact: {
      v.limit = 0;
      v.ratio = static_cast<double>(m.bits_differ);
      const bool pass = m.bits_differ == 0;
      v.kind = pass ? VerdictKind::kPass : VerdictKind::kFail;
      v.reason = pass ? "bitwise equal"
                      : std::to_string(m.bits_differ) + " of " + std::to_string(m.numel) +
                            " elements differ bitwise";
      break;
    }
    case RuleKind::kAllclose:
      v = evaluate_allclose(rule, test, ref, o);
      break;
    case RuleKind::kMeasured:
      return evaluate_measured(rule, test, ref, truth, m);  // its bias check is its own
    case RuleKind::kAbs: {
      v.limit = rule.param;
      const bool has_nan = m.test_nonfinite.nan + m.ref_nonfinite.nan > 0;
      const bool nan_ok = o.equal_nan && m.ulp.hist[kUlpInfBin] == 0;
      v.ratio = (has_nan && !nan_ok) ? NAN : m.max_abs_ref;
      const bool within_x =
          m.floating ? m.max_abs_ref <= rule.param : distance_within(m.ulp.max, rule.param);
      const bool pass = !(has_nan && !nan_ok) && within_x;
      v.kind = pass ? VerdictKind::kPass : VerdictKind::kFail;
      v.reason = (has_nan && !nan_ok) ? std::string("NaN in test or ref")
                                      : "max |test - ref| " + format_number(m.max_abs_ref) +
                                            (pass ? " <= " : " > ") + format_number(rule.param);
      break;
    }
  }
  if (rule.kind == RuleKind::kSame && rule.param > 0 && choice.override &&
      choice.override->reason.empty() && v.kind != VerdictKind::kError) {
    const double dflt = rmse_multiplier(test.dtype, test.shape, o.tol,
                                        o.larger_multiplier_for_small, o.force_max_multiplier);
    if (rule.param > dflt) {
      v.kind = VerdictKind::kError;
      v.reason = "override '" + choice.override->glob + "=" + rule.spec() +
                 "' raises the multiplier from " + format_number(dflt) +
                 " without a reason (give one in a policy file)";
      return v;
    }
  }
  if (m.floating && m.has_truth && bias_check_fails(m)) {
    v.bias_failed = true;
    if (o.check_bias && v.kind == VerdictKind::kPass) {
      v.kind = VerdictKind::kFail;
      v.reason = "biased: error balance " + format_number(m.eb_test) + " (ref " +
                 format_number(m.eb_ref) + "); " + v.reason;
    } else if (!o.check_bias && v.kind == VerdictKind::kPass) {  // a failure says enough
      v.warnings.push_back({"biased in sign where ref is not: --check-bias would fail it",
                            "error balance " + format_number(m.eb_test) + " against ref's " +
                                format_number(m.eb_ref)});
    }
  }
  return v;
}

void parse_policy(std::string_view json, const std::string& path, JudgeOptions& options) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(simdjson::padded_string(json)).get(doc)) {
    fail(path, std::string("policy is not valid JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::object root;
  if (doc.get(root)) fail(path, "policy must be a JSON object");
  detail::refuse_repeated_keys(root, path, "the policy");
  auto need_string = [&](simdjson::dom::element e, const std::string& what) {
    std::string_view s;
    if (e.get(s)) fail(path, what + " must be a string");
    return std::string(s);
  };
  for (auto field : root) {
    const std::string key(field.key);
    if (key == "default") {
      options.default_rule = parse_rule(need_string(field.value, "\"default\""), path);
    } else if (key == "tol") {
      double tol;
      if (field.value.get(tol) || !(tol >= 0)) fail(path, "\"tol\" must be a non-negative number");
      options.tol = tol;
    } else if (key == "check_bias" || key == "equal_nan") {
      bool b;
      if (field.value.get(b)) fail(path, "\"" + key + "\" must be true or false");
      (key == "check_bias" ? options.check_bias : options.equal_nan) = b;
    } else if (key == "shared_randomness") {
      options.shared_randomness = need_string(field.value, "\"shared_randomness\"");
      if (is_blank(options.shared_randomness))
        fail(path, "\"shared_randomness\" needs a written reason");
    } else if (key == "overrides") {
      simdjson::dom::array list;
      if (field.value.get(list)) fail(path, "\"overrides\" must be an array");
      std::size_t i = 0;
      for (auto item : list) {
        const std::string where = "\"overrides\"[" + std::to_string(i++) + "]";
        simdjson::dom::object obj;
        if (item.get(obj)) fail(path, where + " must be an object");
        detail::refuse_repeated_keys(obj, path, where);
        Override o;
        o.origin = path;
        bool has_match = false, has_rule = false;
        for (auto f : obj) {
          const std::string k(f.key);
          if (k == "match") {
            o.glob = need_string(f.value, where + ".match");
            has_match = true;
          } else if (k == "rule") {
            o.rule = parse_rule(need_string(f.value, where + ".rule"), path);
            has_rule = true;
          } else if (k == "reason") {
            o.reason = need_string(f.value, where + ".reason");
            if (is_blank(o.reason)) o.reason.clear();
          } else {
            fail(path, where + ": unknown field \"" + k + "\" (expected match, rule, reason)");
          }
        }
        if (!has_match || !has_rule) fail(path, where + " needs \"match\" and \"rule\"");
        options.overrides.push_back(std::move(o));
      }
    } else {
      fail(path,
           "unknown policy field \"" + key +
               "\" (expected default, tol, check_bias, equal_nan, shared_randomness, overrides)");
    }
  }
}

void load_policy(const std::string& path, JudgeOptions& options) {
  parse_policy(detail::read_regular_file(path, "policy file", detail::kMaxSettingsFile), path,
               options);
}

}  // namespace numalign
