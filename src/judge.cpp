// judge.cpp: pairs tensors up, checks that a comparison is meaningful, runs the fused pass
// over all of them at once and applies the rules.
#include "numalign/judge.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "format.hpp"
#include "metrics_internal.hpp"
#include "numalign/divergence.hpp"
#include "numalign/fingerprint.hpp"
#include "numalign/map.hpp"
#include "numalign/op_sequence.hpp"
#include "numalign/upstream_gradient.hpp"
#include "page_populator.hpp"
#include "parallel.hpp"

namespace numalign {

namespace {

std::string settings_of(const JudgeOptions& o) {
  std::string s = "rule " + o.default_rule.spec() + ", tol " + detail::format_number(o.tol);
  if (o.equal_nan) s += ", equal_nan";
  if (o.larger_multiplier_for_small) s += ", larger multiplier for small tensors";
  if (o.force_max_multiplier) s += ", force max multiplier";
  if (o.check_bias) s += ", bias check";
  if (!o.overrides.empty()) s += ", " + std::to_string(o.overrides.size()) + " override(s)";
  if (!o.shared_randomness.empty()) s += ", randomness declared shared: " + o.shared_randomness;
  return s;
}

// One line for a cause that concerns `tensors` ((index, detail), in order): "NAME: CAUSE
// (DETAIL)" for one, else "CAUSE: N tensors: NAME (DETAIL), ... and M more" (the first three).
template <class NameOf>
std::string grouped_warning(const std::string& cause,
                            const std::vector<std::pair<std::size_t, std::string>>& tensors,
                            NameOf name_of) {
  auto one = [&](const std::pair<std::size_t, std::string>& t) {
    return name_of(t.first) + (t.second.empty() ? "" : " (" + t.second + ")");
  };
  if (tensors.size() == 1) {
    const auto& [k, detail] = tensors.front();
    return name_of(k) + ": " + cause + (detail.empty() ? "" : " (" + detail + ")");
  }
  constexpr std::size_t kShown = 3;
  std::string line = cause + ": " + std::to_string(tensors.size()) + " tensors: ";
  for (std::size_t i = 0; i < tensors.size() && i < kShown; ++i) {
    line += (i ? ", " : "") + one(tensors[i]);
  }
  if (tensors.size() > kShown) line += " and " + std::to_string(tensors.size() - kShown) + " more";
  return line;
}

// A problem found before any metric: returns true and fills `r` when it cannot go further.
bool precheck(const TensorTriple& t, TensorResult& r) {
  auto stop = [&](VerdictKind k, std::string why) {
    r.verdict = k;
    r.reason = std::move(why);
    return true;
  };
  if (!t.problem.empty()) return stop(VerdictKind::kError, t.problem);
  if (!t.failure.empty()) return stop(VerdictKind::kFail, t.failure);
  if (!t.test) return stop(VerdictKind::kFail, std::string(kMissingFromTest));
  if (t.test->dtype != t.ref->dtype) {
    return stop(VerdictKind::kFail, "dtype mismatch: test " + std::string(name(t.test->dtype)) +
                                        ", ref " + std::string(name(t.ref->dtype)));
  }
  if (t.test->shape != t.ref->shape) {
    return stop(VerdictKind::kFail, "shape mismatch: test " + format_shape(t.test->shape) +
                                        ", ref " + format_shape(t.ref->shape));
  }
  if (!is_judgeable(t.test->dtype)) {
    return stop(VerdictKind::kError, "judging " + std::string(name(t.test->dtype)) +
                                         " is not supported yet (numalign inspect reads it)");
  }
  if (t.truth) {
    if (t.truth->shape != t.ref->shape) {
      return stop(VerdictKind::kError, "shape mismatch: truth " + format_shape(t.truth->shape) +
                                           ", ref " + format_shape(t.ref->shape));
    }
    if (!is_judgeable(t.truth->dtype)) {
      return stop(VerdictKind::kError, "truth dtype " + std::string(name(t.truth->dtype)) +
                                           " cannot be read as numbers");
    }
  }
  return false;
}

}  // namespace

static Report judge_pairs(const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                          const ProgressFn& progress, const detail::PagePopulator& pages,
                          Report report, std::vector<TensorTriple>* release);
static Report judge_owned(std::vector<TensorTriple>* owned,
                          const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                          const ProgressFn& progress,
                          std::span<const std::span<const std::byte>> mapped);

Report judge_tensors(const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                     const ProgressFn& progress,
                     std::span<const std::span<const std::byte>> mapped) {
  return judge_owned(nullptr, tensors, options, progress, mapped);
}

// judge_tensors, freeing `owned` (the same as `tensors`, or null) once the results are set
// up from it: a million pairs are 150 MB not needed for the pass.
static Report judge_owned(std::vector<TensorTriple>* owned,
                          const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                          const ProgressFn& progress,
                          std::span<const std::span<const std::byte>> mapped) {
  check_override_reasons(options);
  Report report;
  report.settings = settings_of(options);
  // Tensors only in test have nothing to be judged against: listed, not judged. Usually
  // there are none, and the tensors are judged as given (a copy of a million is 150 MB).
  const auto only_in_test = [](const TensorTriple& t) { return !t.ref && t.test; };
  if (std::none_of(tensors.begin(), tensors.end(), only_in_test)) {
    return judge_pairs(tensors, options, progress, detail::PagePopulator(mapped), std::move(report),
                       owned);
  }
  std::vector<TensorTriple> judged;
  std::vector<std::string> extra;
  for (const auto& t : tensors) {
    if (only_in_test(t)) {
      extra.push_back(t.name);
    } else {
      judged.push_back(t);
    }
  }
  if (!extra.empty()) {  // the first few by name: a long list would bury the other warnings
    const std::vector<std::string> shown(extra.begin(),
                                         extra.begin() + std::min<std::size_t>(extra.size(), 5));
    report.warnings.push_back(
        std::to_string(extra.size()) + " tensor(s) only in test, not judged: " +
        detail::joined(shown, ", ") + (extra.size() > shown.size() ? ", ..." : ""));
  }
  if (owned) *owned = std::vector<TensorTriple>();
  return judge_pairs(judged, options, progress, detail::PagePopulator(mapped), std::move(report),
                     &judged);
}

static Report judge_pairs(const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                          const ProgressFn& progress, const detail::PagePopulator& pages,
                          Report report, std::vector<TensorTriple>* release) {
  // A result per tensor is about 600 bytes: for many tensors, megabytes first written here.
  std::vector<TensorResult> results;
  results.reserve(tensors.size());
  detail::populate_for_writing(results.data(), tensors.size() * sizeof(TensorResult));
  results.resize(tensors.size());
  std::vector<MetricsInput> inputs;
  std::vector<std::size_t> input_of;  // index into results for each input
  std::vector<RuleChoice> choices(tensors.size());
  const RuleSelector selector(options);
  // The results are set up on the judge's threads, a block of tensors at a time (a million
  // results are 600 MB to write); the tensors that go on to the pass are gathered after, in
  // order.
  std::vector<char> to_pass(tensors.size());
  constexpr std::size_t kSetUpBlock = 4096;
  detail::parallel_for((tensors.size() + kSetUpBlock - 1) / kSetUpBlock,
                       detail::resolve_threads(options.threads), [&](std::size_t block) {
                         const std::size_t end =
                             std::min(tensors.size(), (block + 1) * kSetUpBlock);
                         for (std::size_t i = block * kSetUpBlock; i < end; ++i) {
                           const TensorTriple& t = tensors[i];
                           TensorResult& r = results[i];
                           r.name = t.name;
                           r.order = i;
                           if (!t.source.empty()) r.tags.emplace("test_source", t.source);
                           const TensorView* any = t.test ? t.test : t.ref;
                           if (any) {
                             r.dtype = any->dtype;
                             r.shape = any->shape;
                           }
                           choices[i] = selector.choose(t.name, any ? any->dtype : DType::F32);
                           r.rule = choices[i].rule.spec();
                           if (choices[i].override) r.override_reason = choices[i].override->reason;
                           to_pass[i] = !precheck(t, r);
                         }
                       });
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!to_pass[i]) continue;
    const TensorTriple& t = tensors[i];
    // Truth is only read when the tensor can use it (a floating truth for a floating test).
    const TensorView* truth = (t.truth && is_floating(t.ref->dtype)) ? t.truth : nullptr;
    inputs.push_back({t.test, t.ref, truth});
    input_of.push_back(i);
  }
  const std::size_t judged = tensors.size();
  if (release) *release = std::vector<TensorTriple>();  // `tensors` may be gone from here on
  MetricOptions mo{options.tol, options.equal_nan};
  mo.magnitude_profile = options.magnitude_profile;
  // The pass moves each tensor's metrics straight into its result.
  const auto store = [&](std::size_t k, Metrics&& m) {
    results[input_of[k]].metrics.emplace(std::move(m));
  };
  if (mo.magnitude_profile && options.magnitude_profile_sum_only &&
      inputs.size() > kProfileSummedPast) {
    // In groups: each group's profiles summed into the report in execution order (the same
    // sum on every run, whatever the threads did) and dropped before the next group. A
    // profile is 1.5 KiB: 8,192 of them are 12 MiB at a time (65,536 were 96 MiB, and made
    // the HTML report's peak).
    constexpr std::size_t kGroup = 1 << 13;
    const auto bytes_of = [](const MetricsInput& in) {
      return static_cast<double>(in.test->nbytes() * 2 + (in.truth ? in.truth->nbytes() : 0));
    };
    double total = 0, done = 0;
    for (const auto& in : inputs) total += bytes_of(in);
    for (std::size_t g = 0; g < inputs.size(); g += kGroup) {
      const std::size_t n = std::min(kGroup, inputs.size() - g);
      ProgressFn group_progress;
      if (progress) group_progress = [&](double d, double) { progress(done + d, total); };
      detail::compute_metrics_into(
          std::span(inputs).subspan(g, n),
          [&](std::size_t k, Metrics&& m) { store(g + k, std::move(m)); }, mo, options.threads,
          group_progress, &pages);
      for (std::size_t k = g; k < g + n; ++k) {
        MagnitudeProfile& profile = results[input_of[k]].metrics->magnitude;
        report.magnitude.add(profile);
        profile = MagnitudeProfile();
        done += bytes_of(inputs[k]);
      }
    }
  } else {
    detail::compute_metrics_into(inputs, store, mo, options.threads, progress, &pages);
  }
  auto metrics_of = [&](std::size_t k) -> const Metrics& { return *results[input_of[k]].metrics; };
  // Rules run on the same threads as the pass: with many small tensors, formatting each
  // verdict's reason costs about as much as the pass over its data. Each verdict goes
  // straight into its result; the few warnings wait to be added in order.
  std::mutex warned;
  std::vector<std::pair<std::size_t, std::vector<TensorWarning>>> rule_warnings;
  detail::parallel_for(inputs.size(), detail::resolve_threads(options.threads), [&](std::size_t k) {
    Verdict v = evaluate(choices[input_of[k]], *inputs[k].test, *inputs[k].ref, inputs[k].truth,
                         metrics_of(k), options);
    TensorResult& r = results[input_of[k]];
    r.verdict = v.kind;
    r.reason = std::move(v.reason);
    r.ratio = v.ratio;
    r.limit = v.limit;
    r.bias_failed = v.bias_failed;
    if (!v.warnings.empty()) {
      const std::lock_guard lock(warned);
      rule_warnings.emplace_back(k, std::move(v.warnings));
    }
  });
  std::sort(rule_warnings.begin(), rule_warnings.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // The first tensor whose truth is not float64 is warned of once, after its own warnings.
  const auto not_f64 = std::find_if(inputs.begin(), inputs.end(), [](const MetricsInput& in) {
    return in.truth && in.truth->dtype != DType::F64;
  });
  const auto first_not_f64 = static_cast<std::size_t>(not_f64 - inputs.begin());
  const auto warn_not_f64 = [&] {
    report.warnings.push_back("truth is not float64 (" + std::string(name(not_f64->truth->dtype)) +
                              " in " + results[input_of[first_not_f64]].name +
                              "): the measured and same rules cannot judge against it");
  };
  // One line per cause, in the order of its first tensor: one biased bug upstream makes
  // every tensor after it biased, and a line each would bury the other warnings.
  struct Cause {
    std::size_t first;
    std::vector<std::pair<std::size_t, std::string>> tensors;  // (k, detail)
  };
  std::vector<std::pair<std::string, Cause>> causes;
  for (auto& [k, warnings] : rule_warnings) {
    for (auto& w : warnings) {
      auto it = std::find_if(causes.begin(), causes.end(),
                             [&](const auto& c) { return c.first == w.cause; });
      if (it == causes.end()) it = causes.insert(causes.end(), {w.cause, Cause{k, {}}});
      it->second.tensors.emplace_back(k, std::move(w.detail));
    }
  }
  bool warned_not_f64 = not_f64 == inputs.end();
  for (const auto& [cause, c] : causes) {
    if (!warned_not_f64 && c.first > first_not_f64) {
      warn_not_f64();
      warned_not_f64 = true;
    }
    report.warnings.push_back(grouped_warning(
        cause, c.tensors, [&](std::size_t k) { return results[input_of[k]].name; }));
  }
  if (!warned_not_f64) warn_not_f64();
  bool all_identical = !inputs.empty();
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    all_identical = all_identical && metrics_of(k).bits_differ == 0;
  }
  if (all_identical && inputs.size() == judged) {
    report.warnings.push_back(
        "test is bit-identical to ref in every tensor: was a run compared with itself?");
  }
  // A test run equal to its float64 truth in every tensor is the truth (its file given
  // twice, or the truth's own computation): it passes whatever ref did, and measures nothing.
  std::size_t floating = 0, equal_to_truth = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Metrics& m = metrics_of(k);
    if (!m.floating || !m.has_truth || m.numel == 0) continue;
    ++floating;
    equal_to_truth += inputs[k].test->dtype == inputs[k].truth->dtype && m.test_differs_truth == 0;
  }
  if (floating > 0 && equal_to_truth == floating && inputs.size() == judged) {
    report.could_not_judge.push_back(
        "test is bit-identical to the truth in every tensor (" + std::to_string(equal_to_truth) +
        "): it is the truth, not a run under test (was the truth's file given as test?)");
  }
  report.tensors = std::move(results);
  report.sort();
  return report;
}

namespace {

// A module path and the paths under it ("a.b" holds "a.b.c", not "a.bc").
bool within(const std::string& path, const std::string& module) {
  return path.size() >= module.size() && path.compare(0, module.size(), module) == 0 &&
         (path.size() == module.size() || path[module.size()] == '.');
}

// The truth is only as accurate as its least precise op: name where it computed in less
// than float64, and how many judged tensors were computed inside those modules.
void warn_truth_below_float64(const TraceMetadata& truth, Report& report) {
  if (truth.below_float64.empty()) return;
  std::vector<std::string> places;
  for (const auto& [module, ops] : truth.below_float64) {
    if (places.size() == 3) break;
    std::vector<std::string> first(ops.begin(), ops.begin() + std::min<std::size_t>(ops.size(), 3));
    places.push_back((module.empty() ? std::string("(model)") : module) + " (" +
                     detail::joined(first, ", ") + (ops.size() > 3 ? ", ..." : "") + ")");
  }
  std::size_t inside = 0;
  for (const auto& r : report.tensors) {
    const auto tags = truth.tags.find(r.name);
    if (tags == truth.tags.end()) continue;
    const auto module = tags->second.find("module");
    if (module == tags->second.end()) continue;
    for (const auto& [m, ops] : truth.below_float64) {
      if (!m.empty() && m != "(backward)" && within(module->second, m)) {
        ++inside;
        break;
      }
    }
  }
  const std::size_t n = truth.below_float64.size();
  report.warnings.push_back(
      "the truth computed in less than float64 in " + std::to_string(n) +
      (n == 1 ? " place: " : " places: ") + detail::joined(places, "; ") + (n > 3 ? "; ..." : "") +
      ". There it is only as accurate as that precision (" + std::to_string(inside) +
      " judged tensors come from those modules, and what follows them inherits it); numalign's "
      "capture keeps a float64 run float64 unless asked to watch only (float64_truth)");
}

// How a captured run's backward pass started: its seed and the recipe that drew the
// upstream gradient from it; empty for a trace that records no seed (not captured by numalign).
std::string backward_start(const TraceMetadata& m) {
  if (!m.seed) return "";
  const std::string_view recipe =
      m.upstream_gradient.empty() ? kUpstreamGradientBeforeRecipes : m.upstream_gradient;
  return "seed " + std::to_string(*m.seed) + ", " + std::string(recipe);
}

// Runs whose backward passes started from different upstream gradients compute different
// gradients by design: no ratio between them means anything (fail closed).
void refuse_different_backward_starts(const TraceMetadata* mt, const TraceMetadata* mr,
                                      const TraceMetadata* mu, Report& report) {
  const std::pair<const char*, const TraceMetadata*> runs[] = {
      {"test", mt}, {"ref", mr}, {"truth", mu}};
  std::vector<std::string> starts;
  std::string first;
  bool differ = false;
  for (const auto& [role, meta] : runs) {
    const std::string start = meta ? backward_start(*meta) : "";
    if (start.empty()) continue;
    if (!first.empty() && start != first) differ = true;
    if (first.empty()) first = start;
    starts.push_back(std::string(role) + ": " + start);
  }
  if (differ) {
    report.could_not_judge.push_back(
        "the runs' backward passes started from different upstream gradients (" +
        detail::joined(starts, "; ") +
        "): capture every run with the same seed and the same numalign version");
  }
}

// The truth must compute on the values the runs hold (their inputs, parameters and upstream
// gradient rounded to their dtype): else the rounding of the inputs, which ref and test share,
// counts as ref's error and widens the allowance. Said of truths numalign's capture made (they
// record their upstream gradient); a file from elsewhere says nothing of its values. Runs in
// float32 are not warned about: their models and inputs are float32 almost always, so rounding
// to float32 changes nothing (float64 inputs handed to a float32 run are the exception), and the
// upstream gradient is on a grid every dtype holds.
// A run under autocast ("float32+autocast(bfloat16)") holds its values in the dtype before the
// "+": that is what its truth rounds to.
void warn_truth_on_other_values(const TraceMetadata& truth, const TraceMetadata& ref,
                                Report& report) {
  const std::string held = ref.dtype_recipe.substr(0, ref.dtype_recipe.find('+'));
  if (truth.upstream_gradient.empty() || truth.dtype_recipe != "float64" || held.empty() ||
      held == "float64" || held == "float32" || truth.truth_of == held)
    return;
  report.warnings.push_back(
      truth.truth_of.empty()
          ? "the truth computed on inputs, parameters and an upstream gradient that ref ('" +
                ref.dtype_recipe +
                "') never held: their rounding, shared by ref and test, widens the allowance and "
                "can hide errors several times larger (capture the truth with truth_of=the runs' "
                "dtype)"
          : "the truth computed on values rounded to '" + truth.truth_of + "', but ref ran '" +
                ref.dtype_recipe + "': capture it with truth_of=the runs' dtype");
}

}  // namespace

void add_metadata_warnings(const TraceMetadata* mt, const TraceMetadata* mr,
                           const TraceMetadata* mu, Report& report) {
  if (mu) warn_truth_below_float64(*mu, report);
  refuse_different_backward_starts(mt, mr, mu, report);
  if (mt && mr) {
    if (!mt->dtype_recipe.empty() && !mr->dtype_recipe.empty() &&
        mt->dtype_recipe != mr->dtype_recipe) {
      report.warnings.push_back("ref and test ran different precision recipes (ref '" +
                                mr->dtype_recipe + "', test '" + mt->dtype_recipe +
                                "'): the ratio compares unlike things");
    }
    std::vector<std::string> differ, unlike;
    for (const auto& [input, hash] : mr->fingerprints) {
      const auto it = mt->fingerprints.find(input);
      if (it == mt->fingerprints.end() || it->second == hash) continue;
      if (fingerprint_algorithm(it->second) != fingerprint_algorithm(hash)) {
        unlike.push_back(input);
      } else {
        differ.push_back(input);
      }
    }
    if (!unlike.empty()) {
      report.warnings.push_back(
          "the inputs of ref and test were not compared: their fingerprints were made by "
          "different algorithms (ref " +
          std::string(fingerprint_algorithm(mr->fingerprints.at(unlike.front()))) + ", test " +
          std::string(fingerprint_algorithm(mt->fingerprints.at(unlike.front()))) +
          "; traces captured by different numalign versions)");
    }
    if (!differ.empty()) {
      std::string list;
      for (std::size_t i = 0; i < differ.size() && i < 5; ++i) list += (i ? ", " : "") + differ[i];
      report.warnings.push_back("inputs differ between ref and test (fingerprints of " + list +
                                (differ.size() > 5 ? ", ..." : "") + ")");
    }
  }
  if (mr && !mr->not_recorded.empty()) {
    std::vector<std::string> left;
    for (const auto& [name, why] : mr->not_recorded) {
      if (left.size() == 3) break;
      left.push_back(name + " (" + why + ")");
    }
    const std::size_t n = mr->not_recorded.size();
    report.warnings.push_back(
        "left out of the traces by the recorder's rule, so not judged: " + std::to_string(n) +
        (n == 1 ? " value: " : " values: ") + detail::joined(left, ", ") + (n > 3 ? ", ..." : ""));
  }
  const std::pair<const char*, const TraceMetadata*> runs[] = {
      {"test", mt}, {"ref", mr}, {"truth", mu}};
  for (const auto& [role, meta] : runs) {
    if (!meta) continue;
    for (const auto& [flag, on] : meta->tf32) {
      if (on) {
        report.warnings.push_back(std::string(role) + " ran with TF32 on (" + flag +
                                  "): float32 matmuls were computed at 10-bit precision");
      }
    }
  }
  if (mu && mr && !mr->dtype_recipe.empty() && mu->dtype_recipe == mr->dtype_recipe) {
    report.warnings.push_back("truth has the same precision recipe as ref ('" + mr->dtype_recipe +
                              "'): it is no higher-precision truth");
  }
  if (mu && mr) warn_truth_on_other_values(*mu, *mr, report);
}

std::vector<TensorTriple> pair_tensors(const Trace& test, const Trace& ref, const Trace* truth,
                                       const std::vector<std::string>& only) {
  // Judge in execution order when ref records one, else in file order.
  const std::vector<TraceEntry>& ref_entries = ref.entries();
  std::vector<const TraceEntry*> ordered;
  ordered.reserve(ref_entries.size());
  std::vector<bool> placed(ref_entries.size(), false);
  auto place = [&](const TraceEntry* e) {
    const auto k = static_cast<std::size_t>(e - ref_entries.data());
    if (!placed[k]) {
      placed[k] = true;
      ordered.push_back(e);
    }
  };
  // Runs recorded alike list their tensors in the same order, and a file usually lists them
  // in the order they ran: the entry at the expected position is tried first, and the name
  // looked up only when it is another tensor.
  const auto namesake = [](const Trace& in, const std::string& name, std::size_t at) {
    const std::vector<TraceEntry>& e = in.entries();
    return at < e.size() && e[at].name == name ? &e[at] : in.find(name);
  };
  if (ref.metadata()) {
    const std::vector<std::string>& order = ref.metadata()->order;
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (const TraceEntry* e = namesake(ref, order[k], k)) place(e);
    }
  }
  for (const auto& e : ref_entries) place(&e);
  std::vector<TensorTriple> triples;
  triples.reserve(ordered.size());
  std::size_t test_found = 0;  // test's tensors paired with one of ref's
  for (const TraceEntry* r : ordered) {
    const std::string& n = r->name;
    if (!selected_by(only, n)) continue;
    const auto at = static_cast<std::size_t>(r - ref_entries.data());
    const TraceEntry* t = namesake(test, n, at);
    const TraceEntry* u = truth ? namesake(*truth, n, at) : nullptr;
    test_found += t != nullptr;
    triples.push_back({n, t ? &t->view : nullptr, &r->view, u ? &u->view : nullptr});
  }
  // Names are unique in a trace: when every tensor of test found its namesake, none is only
  // in test.
  if (test_found < test.entries().size()) {
    for (const auto& e : test.entries()) {
      if (!ref.find(e.name) && selected_by(only, e.name))
        triples.push_back({e.name, &e.view, nullptr, nullptr});
    }
  }
  return triples;
}

namespace {

// One line per run read from a file; none for runs held in memory (a front end's tensors).
std::string title_of(const Trace& test, const Trace& ref, const Trace* truth) {
  if (test.path().empty() && ref.path().empty() && (!truth || truth->path().empty())) return "";
  auto label = [](const Trace* t) {
    return !t ? std::string("(none)") : t->path().empty() ? std::string("(in memory)") : t->path();
  };
  return "test:  " + label(&test) + "\nref:   " + label(&ref) + "\ntruth: " + label(truth);
}

// Why no tensor of ref was judged ("" when some was): a judgement of nothing is no pass.
std::string nothing_judged(const Trace& ref, const std::vector<TensorTriple>& triples,
                           const JudgeOptions& options) {
  for (const auto& t : triples) {
    if (t.ref) return "";
  }
  if (ref.entries().empty()) return "nothing was judged: ref holds no tensors";
  const std::string map = options.map ? options.map->origin : "";
  if (options.only.empty()) {  // only a map leaves out tensors of ref without --only
    return "nothing was judged: " + map + " ignores or leaves out every tensor of ref";
  }
  return "nothing was judged: no tensor of ref matches only / --only (" +
         detail::joined(options.only, ", ") + ")" +
         (map.empty() ? "" : " that " + map + " does not ignore");
}

// Appends the items of `more` that `to` does not hold yet, in order.
void add_new(std::vector<std::string>& to, const std::vector<std::string>& more) {
  for (const auto& item : more) {
    if (std::find(to.begin(), to.end(), item) == to.end()) to.push_back(item);
  }
}

// Runs that consumed random numbers compute on their own draws: ref's distance to the truth
// then measures the draws, not precision, and the allowance means nothing. Could not judge,
// unless the user stated (with a reason) that the runs share their draws.
void check_randomness(const TraceMetadata* mt, const TraceMetadata* mr, const TraceMetadata* mu,
                      const JudgeOptions& options, Report& report) {
  std::vector<std::string> roles;
  std::vector<std::string> generators, dropout;
  const std::pair<const char*, const TraceMetadata*> runs[] = {
      {"truth", mu}, {"ref", mr}, {"test", mt}};
  for (const auto& [role, meta] : runs) {
    if (!meta || !meta->random || !meta->random->used()) continue;
    roles.push_back(role);
    add_new(generators, meta->random->generators);
    add_new(dropout, meta->random->dropout);
  }
  if (roles.empty()) return;
  std::string what = detail::joined(roles, ", ") + " consumed random numbers (";
  if (!generators.empty()) what += "generator " + detail::joined(generators, ", ");
  if (!dropout.empty()) {
    if (!generators.empty()) what += "; ";
    const std::vector<std::string> shown(
        dropout.begin(), dropout.begin() + std::min<std::size_t>(dropout.size(), 3));
    what += std::to_string(dropout.size()) +
            " dropout module(s) in training mode: " + detail::joined(shown, ", ") +
            (dropout.size() > 3 ? ", ..." : "");
  }
  what += ")";
  if (!options.shared_randomness.empty()) {
    report.warnings.push_back(
        what + "; judged, as the draws were declared shared: " + options.shared_randomness);
    return;
  }
  report.could_not_judge.push_back(
      what +
      ": each run drew its own numbers, so ref's distance to the truth measures the "
      "draws, not its precision. Run in eval mode (model.eval()) without random ops, "
      "or, if every run makes the same draws, say why with --shared-randomness REASON "
      "(Python: shared_randomness=REASON)");
}

// The roundoff a reference's tensor may carry: half the spacing of its dtype's numbers near
// 1, and at least bf16's, since a float32 tensor may hold a result computed in bf16
// (autocast, master-weight gradients) or TF32. 0 for what the bound below does not judge
// (float64 refs, integers, E8M0).
double roundoff_of_ref(DType dt) {
  if (!is_floating(dt) || dt == DType::F64 || dt == DType::F8_E8M0) return 0;
  return std::max(unit_roundoff(dt), 0x1p-8);
}

// A reference that is not a rendition of the truth (its own dropout masks, other inputs)
// makes the allowance as large as its error. Traces made elsewhere say nothing of that;
// the data does. Measured (bench/ref_vs_truth.py, docs/architecture.md): tensor by tensor,
// legitimate refs can be any distance from truth (gradients that are zero in exact
// arithmetic, sums that cancel), but run by run, at most 1% of a legitimate run's tensors
// are more than kFarOff roundoffs from the truth, and at least 67% of a non-rendition's
// are. So: could not judge when most tensors, and enough of them to outvote a few
// cancelling ones, are that far off.
constexpr double kFarOff = 32;          // roundoffs: a relative error of 12.5% at bf16's
constexpr std::size_t kFarTensors = 8;  // and at least this many of them

void check_reference_renders_truth(const JudgeOptions& options, Report& report) {
  std::size_t considered = 0;
  std::vector<std::pair<double, std::string>> far;  // (relative error, name)
  for (const auto& r : report.tensors) {
    if (!r.metrics || !r.metrics->has_truth || !allowance_from_ref(r.rule)) continue;
    // Measured, so test and ref had one dtype, the result's (no map by name: a million
    // names hashed cost more than the check).
    const double u = r.dtype ? roundoff_of_ref(*r.dtype) : 0;
    const Metrics& m = *r.metrics;
    // Within same()'s tol of the truth, a ref raises no question.
    if (u == 0 || !(m.baseline > options.tol) || !std::isfinite(m.baseline)) continue;
    if (!(m.rms_truth > 0) || !std::isfinite(m.rms_truth)) continue;
    ++considered;
    const double relative = m.baseline / m.rms_truth;
    if (relative > kFarOff * u) far.emplace_back(relative, r.name);
  }
  if (far.size() < kFarTensors || 2 * far.size() <= considered) return;
  std::sort(far.begin(), far.end(), std::greater<>());
  std::vector<std::string> named;
  for (std::size_t i = 0; i < far.size() && i < 3; ++i)
    named.push_back(far[i].second + " " + detail::format_number(far[i].first));
  report.could_not_judge.push_back(
      "ref is far from the truth in " + std::to_string(far.size()) + " of " +
      std::to_string(considered) + " tensors (relative error above " +
      detail::format_number(kFarOff) +
      " roundoffs of its dtype, 12.5% for bf16, fp16 and fp32; worst: " +
      detail::joined(named, ", ") +
      "): it computed something other than the truth (its own random draws, other inputs, "
      "other weights), so its distance to the truth measures that, not its precision");
}

void adopt_tags(const TraceMetadata& ref, Report& report) {
  if (ref.tags.empty()) return;
  for (auto& r : report.tensors) {
    if (const auto it = ref.tags.find(r.name); it != ref.tags.end()) {
      r.tags.insert(it->second.begin(), it->second.end());
    }
  }
}

}  // namespace

Pairing pair_runs(const std::vector<const Trace*>& test_ranks, const Trace& ref, const Trace* truth,
                  const JudgeOptions& options) {
  if (options.map) return pair_with_map(test_ranks, ref, truth, *options.map, options.only);
  if (test_ranks.size() > 1)
    return pair_with_map(test_ranks, ref, truth, TensorMap{}, options.only);
  Pairing p;
  p.triples = pair_tensors(*test_ranks.front(), ref, truth, options.only);
  return p;
}

Report judge(const Trace& test, const Trace& ref, const Trace* truth, const JudgeOptions& options,
             const ProgressFn& progress) {
  return judge(std::vector<const Trace*>{&test}, ref, truth, options, progress);
}

Report judge(const std::vector<const Trace*>& test_ranks, const Trace& ref, const Trace* truth,
             const JudgeOptions& options, const ProgressFn& progress) {
  if (test_ranks.empty()) fail("test", "no trace given");
  const Trace& test = *test_ranks.front();
  Pairing pairing = pair_runs(test_ranks, ref, truth, options);
  // What the report needs of the pairs is taken first: they are freed once judging starts.
  std::size_t missing_truth = 0;
  if (truth) {
    for (const auto& t : pairing.triples) missing_truth += t.ref && !t.truth;
  }
  const std::string why_nothing = nothing_judged(ref, pairing.triples, options);
  std::vector<std::span<const std::byte>> mapped;
  std::vector<const Trace*> runs = test_ranks;
  runs.push_back(&ref);
  runs.push_back(truth);
  for (const Trace* t : runs) {
    if (!t) continue;
    const auto more = t->mappings();
    mapped.insert(mapped.end(), more.begin(), more.end());
  }
  Report report = judge_owned(&pairing.triples, pairing.triples, options, progress, mapped);
  mark_unpaired_ops(test, ref, truth, report);  // ops of runs whose op sequences differ
  report.title = title_of(test, ref, truth);
  if (test_ranks.size() > 1 && !report.title.empty()) {
    const std::size_t eol = report.title.find('\n');
    report.title.insert(eol, " and " + std::to_string(test_ranks.size() - 1) + " more rank(s)");
  }
  report.warnings.insert(report.warnings.end(), pairing.warnings.begin(), pairing.warnings.end());
  report.could_not_judge.insert(report.could_not_judge.end(), pairing.could_not_judge.begin(),
                                pairing.could_not_judge.end());
  if (missing_truth) {
    report.warnings.push_back(std::to_string(missing_truth) +
                              " tensor(s) of ref are missing from truth");
  }
  if (!why_nothing.empty()) report.could_not_judge.push_back(why_nothing);
  auto meta = [](const Trace* t) { return t && t->metadata() ? &*t->metadata() : nullptr; };
  add_metadata_warnings(meta(&test), meta(&ref), meta(truth), report);
  check_randomness(meta(&test), meta(&ref), meta(truth), options, report);
  if (truth) check_reference_renders_truth(options, report);
  if (ref.metadata()) {
    adopt_tags(*ref.metadata(), report);
    if (!options.sections.module_ranking) {
      report.first_divergence = find_first_divergence(*ref.metadata(), report);
    }
  }
  if (options.sections.module_ranking) report.ranking = rank_modules(report);
  if (options.sections.first_failing) report.first_failing = first_failing(report);
  return report;
}

}  // namespace numalign
