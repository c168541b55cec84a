// numalign/report.hpp: per-tensor results, their order (could-not-judge, failures worst
// first, passes in trace order) and the text, JSON and JUnit renderings.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/metrics.hpp"
#include "numalign/rules.hpp"

namespace numalign {

struct TensorResult {
  // Provided, so that a vector of results is not zeroed first (a result holds a whole
  // Metrics: a report of many tensors would clear megabytes only to write them again).
  TensorResult() {}
  // (The small members side by side: a report holds a result per tensor.)
  std::string name;
  VerdictKind verdict = VerdictKind::kPass;
  std::optional<DType> dtype;  // test dtype (ref's when test is missing)
  bool bias_failed = false;
  std::string rule;             // spec of the rule applied ("" when none could apply)
  std::string reason;           // why it failed / could not be judged / passed
  std::string override_reason;  // the written reason of the override that chose the rule
  Shape shape;
  std::optional<Metrics> metrics;
  std::optional<double> ratio, limit;
  std::size_t order = 0;  // position in the reference trace
  // The reference trace's tags of this tensor (module, kind, ...; "rank" once merged).
  std::map<std::string, std::string> tags;
};

// The reason of a tensor ref holds and test does not.
inline constexpr std::string_view kMissingFromTest = "missing from test";

// Whether the runs' values were compared (or found to be of another dtype or shape): false
// for a tensor that could not be judged and for one missing from test, which fail unseen.
bool was_judged(const TensorResult& r);

// Where a run first goes wrong, in one direction of execution (forward or backward).
struct DivergencePoint {
  std::string tensor;  // the first failing tensor in that order
  std::string module;  // the module that produced it ("" for the model itself)
  // Whether every tensor it was computed from passed: true, the module (op) is the culprit;
  // false, it inherited the error; empty when the trace records none of its inputs.
  std::optional<bool> inputs_aligned;
  std::vector<std::string> failing_inputs;
  std::string op;  // the op that produced it ("aten.mm") when recorded op by op, else ""
};

struct FirstDivergence {
  std::optional<DivergencePoint> forward, backward;  // empty: nothing fails that way
};

// A module's own worst tensor when every module ran on the truth's inputs (isolation).
struct ModuleRank {
  std::string module;  // "" for the model itself
  std::string tensor;  // its worst tensor
  std::optional<double> ratio, limit;
  bool aligned = true;  // every tensor of the module passes
};

struct Report {
  std::string title;     // "test.safetensors vs ref.safetensors (truth: truth.safetensors)"
  std::string settings;  // "rule measured, tol 1e-04"
  std::vector<TensorResult> tensors;
  std::vector<std::string> warnings;
  // Why the run as a whole cannot be judged, whatever its tensors say (nothing was judged,
  // the computations were random, ...): any reason here makes the verdict COULD NOT JUDGE.
  std::vector<std::string> could_not_judge;
  // Present when the reference trace records modules and execution order.
  std::optional<FirstDivergence> first_divergence;
  // Modules by their own worst ratio / limit, worst first (ReportSections::module_ranking).
  std::vector<ModuleRank> ranking;
  // The first tensor in execution order that does not pass (ReportSections::first_failing).
  std::optional<std::string> first_failing;
  // The tensors' magnitude profiles summed, when the judge kept only their sum
  // (JudgeOptions::magnitude_profile_sum_only); empty otherwise.
  MagnitudeProfile magnitude;

  std::size_t count(VerdictKind k) const;
  bool aligned() const {
    return could_not_judge.empty() && count(VerdictKind::kFail) == 0 &&
           count(VerdictKind::kError) == 0;
  }
  ExitCode exit_code() const;
  // The failing (or erroring) tensor with the largest ratio/limit; null when none.
  const TensorResult* worst() const;
  void sort();  // errors, then failures by ratio/limit descending, then passes by order
};

// Verdicts counted per value of the tensors' tags (e.g. {"path", "m"}): groups in the order
// their first tensor comes in execution order; untagged tensors count under "" values.
struct TagGroup {
  std::vector<std::string> values;  // one per key
  std::size_t tensors = 0, passed = 0, failed = 0, errors = 0;
  std::optional<double> max_ratio;
};
std::vector<TagGroup> group_by_tags(const Report& report, const std::vector<std::string>& keys);

// ratio / limit, the number failures are sorted by (inf when the limit is 0 and ratio > 0).
double severity(const TensorResult& r);

// "pass", "fail" or "error", as the JSON report writes verdicts.
const char* verdict_word(VerdictKind k);

std::string render_text(const Report& report, bool verbose = false);
// Two lines, forward and backward: the first failing tensor, its module, and whether its
// inputs passed (the module is the culprit) or not (it inherited the error).
// `unjudged_forward`, `unjudged_backward`: how many tensors of each direction were not judged
// (was_judged; divergence.hpp counts them): a direction where nothing was judged to fail then
// says so, rather than "every tensor passes".
std::string divergence_text(const FirstDivergence& d, std::size_t unjudged_forward = 0,
                            std::size_t unjudged_backward = 0);
// The verdict line that ends the text report: "ALIGNED: 3 of 3 tensors pass".
std::string render_summary(const Report& report);
std::string render_json(const Report& report);
// render_json's text handed to `sink` in pieces as it is produced (the tensors' objects in
// blocks of 1,024, formatted on `threads` threads, all cores when <= 0): a million tensors
// make hundreds of megabytes of JSON, never held whole. The text is the same whatever the
// threads.
void render_json(const Report& report, const std::function<void(std::string_view)>& sink,
                 int threads = 0);
// render_json's text written to `path` as it is produced, atomically (as the CLI's -o: a
// temporary file renamed into place once complete; "-" is stdout).
void write_json_file(const Report& report, const std::string& path, int threads = 0);
std::string render_junit(const Report& report);
// Several reports as one JUnit document, one <testsuite> each, named (e.g. by the test that
// judged it: the pytest plugin's session report, by pytest node id), and each test case (a
// tensor) with that name as its classname. render_junit is one suite named "numalign", its
// test cases classed "numalign.<rule>".
struct JunitSuite {
  std::string name;
  const Report* report;
};
std::string render_junit_suites(const std::vector<JunitSuite>& suites);
// One self-contained HTML page (no network, no external script; readable without
// JavaScript): the verdict, the first divergence, warnings, an SVG chart of ratio per
// tensor in execution order with each limit, the ULP histogram, the error against
// magnitude (when the pass binned it: JudgeOptions::magnitude_profile) and the table,
// which a small inline script makes sortable. At model scale: the ratio chart has ticks
// where a layer starts and bands over forward and backward (tags "kind"), draws one bar per
// pixel column past one point per 2 pixels, a module tree (<details>, tags "module") lists
// every tensor, and the table stops at 2,000 rows. Past 20,000 tensors the page aggregates
// (bounded whatever the count): the tree draws at most 2,000 modules and 2,000 tensors that
// do not pass, always the worst and the way to it, and counts the rest. Every name is escaped.
std::string render_html(const Report& report);

}  // namespace numalign
