// main.cpp: the `numalign` command line (judge, compare, inspect, names, dump, pack) on the core.
#include <signal.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <future>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "numalign/consistency.hpp"
#include "numalign/judge.hpp"
#include "numalign/map.hpp"
#include "numalign/metrics.hpp"
#include "numalign/names.hpp"
#include "numalign/options.hpp"
#include "numalign/sensitivity.hpp"
#include "numalign/text.hpp"
#include "numalign/trace.hpp"
#include "numalign/version.hpp"

namespace {

using namespace numalign;

constexpr const char* kFooter = R"(Examples:
  numalign judge test.safetensors ref.safetensors truth.safetensors
  numalign judge test.st ref.st truth.st --rule 'decoder.*=ulp:1' --format json -o report.json
  numalign judge test.st ref.st truth.st --policy policy.json --check-bias
  numalign compare gpu.safetensors npu.safetensors --rule ulp:1
  numalign inspect model.safetensors.index.json

Exit codes: 0 aligned, 1 not aligned, 2 could not judge (bad file, bad arguments).)";

// glibc raises its thresholds for giving freed memory back (up to 32 MiB for mmap, 64 MiB
// kept free at the top of each arena) once a large block is freed, as opening a trace
// does with its parsed header. A judge of a million tensors then keeps about 60 MiB of freed
// memory resident at its peak. Fixed thresholds stop that raise.
void keep_malloc_thresholds_fixed() {
#if defined(__GLIBC__)
  constexpr int kThreshold = 1 << 20;
  ::mallopt(M_MMAP_THRESHOLD, kThreshold);
  ::mallopt(M_TRIM_THRESHOLD, kThreshold);
#endif
}

// A progress bar on stderr, only when it is a terminal and the work takes a while.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled && ::isatty(STDERR_FILENO)) {}
  ~Progress() {
    if (drawn_) std::fprintf(stderr, "\r%60s\r", "");
  }
  ProgressFn callback() {
    if (!enabled_) return {};
    return [this](double done, double total) {
      if (total < 256e6) return;  // small jobs finish before a bar helps
      const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
      if (pct == last_) return;
      last_ = pct;
      drawn_ = true;
      const int filled = pct * 30 / 100;
      std::fprintf(stderr, "\rjudging [%-30.*s] %3d%% of %.2f GB", filled,
                   "==============================", pct, total / 1e9);
      std::fflush(stderr);
    };
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  int last_ = -1;
};

// Options of the report-writing commands.
struct OutputOptions {
  std::string format = "text";
  std::string output = "-";
  bool verbose = false;
  bool no_progress = false;
};

void add_output_options(CLI::App* cmd, JudgeArguments& args, OutputOptions& out) {
  cmd->add_option("--only", args.only, "judge only tensors matching this glob (repeatable)");
  cmd->add_option("--format", out.format, "report format")
      ->check(CLI::IsMember({"text", "json", "junit", "html"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", out.output,
                  "write the report here (atomically) instead of stdout");
  cmd->add_flag("-v,--verbose", out.verbose, "list every tensor with its reason");
  cmd->add_flag("--no-progress", out.no_progress, "never draw a progress bar");
  cmd->add_option("--threads", args.threads, "threads (default: all cores)");
}

// Commands whose output is a table in text or JSON (sensitivity, consistent).
void add_table_options(CLI::App* cmd, JudgeArguments& args, OutputOptions& out) {
  cmd->add_option("--only", args.only, "only tensors matching this glob (repeatable)");
  cmd->add_option("--format", out.format, "report format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", out.output, "write it here (atomically) instead of stdout");
  cmd->add_option("--threads", args.threads, "threads (default: all cores)");
}

// The traces and rule options of judge and sensitivity. Each option the user gives
// overrides the policy file; one not given leaves the policy's value (resolve_options).
struct TraceArguments {
  std::string test, ref, truth;
  std::vector<std::string> rules;
  std::size_t ranks = 0;  // --ranks N: test is N traces, one per tensor-parallel rank
};

void add_judge_options(CLI::App* cmd, TraceArguments& traces, JudgeArguments& args) {
  cmd->add_option("test", traces.test, "trace of the implementation under test")->required();
  cmd->add_option("ref", traces.ref, "trace of the reference implementation")->required();
  cmd->add_option("truth", traces.truth,
                  "float64 truth trace (needed by the measured and same rules)");
  cmd->add_option(
      "--rule", traces.rules,
      "SPEC or GLOB=SPEC: measured[:LIMIT] (default), same[:MULT], ulp:K, exact, abs:X, "
      "allclose[:ATOL,RTOL] (repeatable)");
  cmd->add_option("--policy", args.policy_path, "JSON policy file of overrides with reasons");
  cmd->add_option("--ranks", traces.ranks,
                  "N: test is N traces of tensor-parallel ranks, named as "
                  "numalign.distributed.save names them (TEST.rank0.safetensors, ...)");
  cmd->add_option("--map", args.map_path,
                  "JSON map from test's tensors to ref's, where names or layouts differ "
                  "(fused projections, another module tree)");
  cmd->add_option("--tol", args.tol, "tolerance of same() (fast path, tol/10 slack; default 1e-4)");
  auto flag = [&](const char* name, std::optional<bool>& field, const char* help) {
    cmd->add_flag_callback(
        name, [&field] { field = true; }, help);
  };
  cmd->add_option("--shared-randomness", args.shared_randomness,
                  "REASON: judge runs that drew random numbers (dropout, RNG), declaring why "
                  "their draws are shared");
  flag("--equal-nan", args.equal_nan, "NaN equals NaN");
  flag("--check-bias", args.check_bias, "fail tensors with biased rounding");
  flag("--larger-multiplier-for-small", args.larger_multiplier_for_small,
       "same()'s use_larger_multiplier_for_smaller_tensor");
  flag("--force-max-multiplier", args.force_max_multiplier,
       "same()'s force_max_multiplier (multiplier 10)");
}

void add_rule_arguments(const std::vector<std::string>& rules, JudgeArguments& args) {
  for (const auto& r : rules) args.rules.push_back(parse_rule_argument(r, "--rule"));
}

// The three headers parse at once (a header can list tens of thousands of tensors); errors
// still surface in argument order, as a sequential open would report them.
struct OpenedTraces {
  Trace test, ref;
  std::optional<Trace> truth;
  const Trace* truth_or_null() const { return truth ? &*truth : nullptr; }
};

OpenedTraces open_traces(const std::string& test, const std::string& ref,
                         const std::string& truth) {
  auto opening = [](const std::string& path) {
    return std::async(std::launch::async, [path] { return Trace::open(path); });
  };
  auto test_opening = opening(test), ref_opening = opening(ref);
  std::optional<std::future<Trace>> truth_opening;
  if (!truth.empty()) truth_opening = opening(truth);
  OpenedTraces t{test_opening.get(), ref_opening.get(), std::nullopt};
  if (truth_opening) t.truth = truth_opening->get();
  return t;
}

// Refuses an output that is one of the inputs (the paths given, and every file read through
// them: shards, an index), before any work is done.
void refuse_clobbering(const std::string& output, std::vector<std::string> inputs,
                       std::initializer_list<const Trace*> traces) {
  for (const Trace* t : traces) {
    if (t) inputs.insert(inputs.end(), t->files().begin(), t->files().end());
  }
  refuse_output_over_input(output, inputs);
}

// `threads`: those the judge was given (0: all cores), for formatting JSON too.
int emit(const Report& report, const OutputOptions& c, int threads = 0) {
  if (c.format == "json") {
    write_json_file(report, c.output, threads);  // as it is produced: it can be hundreds of MB
  } else {
    write_file_atomic(c.output, c.format == "junit"  ? render_junit(report)
                                : c.format == "html" ? render_html(report)
                                                     : render_text(report, c.verbose));
  }
  if (c.output != "-") {
    // The report went to a file: still tell the person at the terminal the outcome.
    std::fprintf(stderr, "%s\n", render_summary(report).c_str());
  }
  return report.exit_code();
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

int inspect(const std::string& path) {
  const Trace t = Trace::open(path);
  std::printf("%s: %zu tensors, %s of data\n", printable(path).c_str(), t.entries().size(),
              human_bytes(static_cast<double>(t.data_bytes())).c_str());
  for (const auto& [k, v] : t.raw_metadata()) {
    std::printf("metadata %s = %s\n", printable(k).c_str(), cut_columns(printable(v), 200).c_str());
  }
  std::printf("%-40s %-12s %-18s %10s %12s %12s %12s %s\n", "tensor", "dtype", "shape", "size",
              "min", "max", "mean", "nonfinite");
  for (const auto& e : t.entries()) {
    const TensorView& v = e.view;
    std::string stats = "           -            -            - -";
    if (is_judgeable(v.dtype) && v.numel() > 0) {
      double lo = INFINITY, hi = -INFINITY, sum = 0;
      std::uint64_t nonfinite = 0, finite = 0;
      const std::size_t es = element_size(v.dtype);
      for (std::uint64_t i = 0; i < v.numel(); ++i) {
        const double x = to_double(v.dtype, v.data + i * es);
        if (!std::isfinite(x)) {
          ++nonfinite;
          continue;
        }
        ++finite;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        sum += x;
      }
      char buf[96];
      if (finite) {
        std::snprintf(buf, sizeof buf, "%12.5g %12.5g %12.5g %llu", lo, hi,
                      sum / static_cast<double>(finite),
                      static_cast<unsigned long long>(nonfinite));
      } else {
        std::snprintf(buf, sizeof buf, "%12s %12s %12s %llu", "-", "-", "-",
                      static_cast<unsigned long long>(nonfinite));
      }
      stats = buf;
    }
    std::printf("%s %-12s %-18s %10s %s\n", pad_columns(printable(e.name), 40).c_str(),
                std::string(name(v.dtype)).c_str(), format_shape(v.shape).c_str(),
                human_bytes(static_cast<double>(v.nbytes())).c_str(), stats.c_str());
  }
  return kAligned;
}

// "--at 3,17" (or "(3, 17)", "(5,)" and a 0-d tensor's "()", as a report prints them) against
// the tensor's shape:
// the flat position of that element; a clear error for a malformed or out-of-range index.
std::uint64_t flat_index(const std::string& path, const std::string& tensor, const Shape& shape,
                         const std::string& at) {
  const std::string what = "tensor '" + tensor + "': --at " + at + ": ";
  std::string text;
  for (char c : at) {
    if (c != ' ') text += c;
  }
  if (text.size() >= 2 && text.front() == '(' && text.back() == ')') {
    text = text.substr(1, text.size() - 2);
    if (!text.empty() && text.back() == ',' && text.find(',') == text.size() - 1) text.pop_back();
  }
  std::vector<std::uint64_t> idx;
  // "()" (or ""): the one element of a 0-d tensor, as a report prints its index.
  for (std::size_t start = 0; !(text.empty() && at.find('(') != std::string::npos);) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    if (part.empty() || part.find_first_not_of("0123456789") != part.npos)
      fail(path, what + "expected integers separated by commas, as 3,17");
    if (part.size() > 19) fail(path, what + "index " + part + " is out of range");
    idx.push_back(std::stoull(part));
    if (comma == text.size()) break;
    start = comma + 1;
  }
  if (idx.size() != shape.size()) {
    fail(path, what + std::to_string(idx.size()) + (idx.size() == 1 ? " index" : " indexes") +
                   " for a tensor of shape " + format_shape(shape) + " (" +
                   std::to_string(shape.size()) + " dimensions)");
  }
  std::uint64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (idx[d] >= shape[d]) {
      fail(path, what + "index " + std::to_string(idx[d]) + " is out of range for dimension " +
                     std::to_string(d) + " of size " + std::to_string(shape[d]) + " (shape " +
                     format_shape(shape) + ")");
    }
    flat = flat * shape[d] + idx[d];
  }
  return flat;
}

// Elements from the first (or, with --at, `limit` of them around that one: the index printed
// after the flat one, and the element asked for marked "<"), one a line: flat index, bits,
// exact value.
int dump(const std::string& path, const std::string& tensor, std::uint64_t limit,
         const std::optional<std::string>& at) {
  const Trace t = Trace::open(path);
  const TraceEntry* e = t.find(tensor);
  if (!e) fail(path, "no tensor named '" + tensor + "'");
  if (!is_judgeable(e->view.dtype)) {
    fail(path, "tensor '" + tensor + "': dumping " + std::string(name(e->view.dtype)) +
                   " is not supported");
  }
  const std::size_t es = element_size(e->view.dtype);
  const std::uint64_t numel = e->view.numel();
  std::uint64_t begin = 0, end = std::min(numel, limit);
  std::optional<std::uint64_t> target;
  if (at) {
    target = flat_index(path, tensor, e->view.shape, *at);
    const std::uint64_t n = std::min(limit, numel);  // centred on it, inside the tensor
    begin = n ? *target - std::min(*target, (n - 1) / 2) : *target;
    end = begin + n;
    if (end > numel) end = numel, begin = numel - n;
  }
  for (std::uint64_t i = begin; i < end; ++i) {
    const std::byte* p = e->view.data + i * es;
    std::string index;
    if (target) {
      index = " [";
      const auto idx = unravel_index(e->view.shape, i);
      for (std::size_t d = 0; d < idx.size(); ++d) index += (d ? "," : "") + std::to_string(idx[d]);
      index += "]";
    }
    std::printf("%llu%s 0x%llx %.17g%s\n", static_cast<unsigned long long>(i), index.c_str(),
                static_cast<unsigned long long>(load_bits(e->view.dtype, p)),
                to_double(e->view.dtype, p), target && i == *target ? " <" : "");
  }
  return kAligned;
}

int pack(const std::string& in, const std::string& out) {
  const Trace t = Trace::open(in);
  refuse_clobbering(out, {in}, {&t});
  std::vector<NamedTensor> tensors;
  for (const auto& e : t.entries()) tensors.push_back({e.name, e.view});
  const auto& meta = t.raw_metadata();
  const bool had_metadata = !meta.empty();
  write_trace(out, tensors, had_metadata ? &meta : nullptr);
  std::fprintf(stderr, "wrote %zu tensors to %s\n", tensors.size(), printable(out).c_str());
  return kAligned;
}

// Options resolve before any file is read: a bad option is reported first.
// `ranks` > 0: the test run is that many traces, named from `test` as
// numalign.distributed.save names them (run.safetensors -> run.rank0.safetensors, ...).
int run_judge(JudgeOptions options, const std::string& test, const std::string& ref,
              const std::string& truth, const JudgeArguments& args, std::size_t ranks,
              const OutputOptions& out) {
  const OpenedTraces t = open_traces(ranks ? rank_trace_path(test, 0) : test, ref, truth);
  std::vector<Trace> other_ranks;
  std::vector<std::string> inputs{test, ref, truth, args.policy_path, args.map_path};
  std::vector<const Trace*> test_ranks{&t.test};
  for (std::size_t r = 1; r < ranks; ++r) {
    other_ranks.push_back(Trace::open(rank_trace_path(test, r)));
    inputs.insert(inputs.end(), other_ranks.back().files().begin(),
                  other_ranks.back().files().end());
  }
  for (const Trace& r : other_ranks) test_ranks.push_back(&r);
  refuse_clobbering(out.output, inputs, {&t.test, &t.ref, t.truth_or_null()});
  Progress progress(!out.no_progress);
  options.magnitude_profile_sum_only = true;  // the page draws the sum only
  const Report report = judge(test_ranks, t.ref, t.truth_or_null(), options, progress.callback());
  return emit(report, out, options.threads);
}

int run_sensitivity(const TraceArguments& traces, const JudgeArguments& args,
                    const SensitivityOptions& sopt, const OutputOptions& out) {
  if (traces.ranks) {
    fail("--ranks",
         "sensitivity plants bugs in one test run: judge the ranks with `numalign "
         "judge --ranks N`");
  }
  const JudgeOptions options = resolve_options(args);
  const OpenedTraces t = open_traces(traces.test, traces.ref, traces.truth);
  refuse_clobbering(out.output,
                    {traces.test, traces.ref, traces.truth, args.policy_path, args.map_path},
                    {&t.test, &t.ref, t.truth_or_null()});
  const Sensitivity s = sensitivity(t.test, t.ref, t.truth_or_null(), options, sopt);
  write_file_atomic(out.output,
                    out.format == "json" ? render_sensitivity_json(s) : render_sensitivity_text(s));
  return kAligned;
}

int run_consistent(const std::vector<std::string>& files, const std::string& rule_spec,
                   const JudgeArguments& args, const OutputOptions& out) {
  const Rule rule = parse_rule(rule_spec, "--rule");
  std::vector<Trace> traces;
  for (const auto& f : files) traces.push_back(Trace::open(f));
  std::vector<const Trace*> ranks;
  std::vector<std::string> inputs = files;
  for (const auto& t : traces) {
    ranks.push_back(&t);
    inputs.insert(inputs.end(), t.files().begin(), t.files().end());
  }
  refuse_output_over_input(out.output, inputs);
  const ConsistencyReport report =
      check_consistent(ranks, files, rule, args.only, args.threads.value_or(0));
  write_file_atomic(out.output, out.format == "json" ? render_consistency_json(report)
                                                     : render_consistency_text(report));
  return report.consistent() ? kAligned : kNotAligned;
}

}  // namespace

int main(int argc, char** argv) {
  keep_malloc_thresholds_fixed();
  // A write past the file size limit (ulimit -f) then fails with EFBIG, reported with the
  // output's name and exit 2, instead of killing the process (SIGXFSZ's default action).
  ::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{
      "numalign: is an implementation numerically aligned with its reference?\n"
      "The allowance is measured against a float64 truth, not hand-picked."};
  app.footer(kFooter);
  app.set_version_flag("--version", std::string("numalign ") + NUMALIGN_VERSION +
                                        " (SIMD: " + numalign::simd_target() + ")");
  app.require_subcommand(1);

  JudgeArguments args;
  OutputOptions out;
  TraceArguments traces;
  auto* judge_cmd = app.add_subcommand("judge", "judge TEST against REF, measured against TRUTH");
  add_judge_options(judge_cmd, traces, args);
  add_output_options(judge_cmd, args, out);

  SensitivityOptions sensitivity_options;
  auto* sensitivity_cmd = app.add_subcommand(
      "sensitivity", "plant known bugs in a copy of TEST: would the rule catch them?");
  add_judge_options(sensitivity_cmd, traces, args);
  sensitivity_cmd
      ->add_option("--terms", sensitivity_options.reduction_terms,
                   "K of the dropped reduction term (a term is rms(truth) / sqrt(K))")
      ->capture_default_str();
  add_table_options(sensitivity_cmd, args, out);

  std::string a, b;
  std::string compare_rule = "exact";
  auto* compare_cmd = app.add_subcommand("compare", "differences between two traces (no truth)");
  compare_cmd->add_option("a", a, "first trace (taken as test)")->required();
  compare_cmd->add_option("b", b, "second trace (taken as ref)")->required();
  compare_cmd->add_option("--rule", compare_rule, "ulp:K, exact, abs:X or allclose[:ATOL,RTOL]")
      ->capture_default_str();
  add_output_options(compare_cmd, args, out);

  std::vector<std::string> consistent_files;
  std::string consistent_rule = "exact";
  auto* consistent_cmd = app.add_subcommand(
      "consistent", "replicated tensors agree across ranks (one trace per rank, rank 0 first)");
  consistent_cmd->add_option("files", consistent_files, "traces, one per rank")
      ->required()
      ->expected(2, -1);
  consistent_cmd->add_option("--rule", consistent_rule, "exact or ulp:K")->capture_default_str();
  add_table_options(consistent_cmd, args, out);

  std::string inspect_path;
  auto* inspect_cmd =
      app.add_subcommand("inspect", "list tensors, dtypes, shapes, sizes, metadata, stats");
  inspect_cmd->add_option("file", inspect_path, "trace, shard directory or index.json")->required();

  std::string names_path;
  auto* names_cmd = app.add_subcommand(
      "names", "a trace's names grouped by module, in execution order: where a map starts");
  names_cmd->add_option("file", names_path, "trace, shard directory or index.json")->required();

  std::string dump_path, dump_tensor;
  std::uint64_t dump_limit = 100;
  auto* dump_cmd =
      app.add_subcommand("dump", "print elements of one tensor: index, bits, exact value");
  dump_cmd->add_option("file", dump_path)->required();
  dump_cmd->add_option("tensor", dump_tensor)->required();
  dump_cmd->add_option("-n,--limit", dump_limit, "at most this many elements (1 or more)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::numeric_limits<std::uint64_t>::max() >> 1));
  std::optional<std::string> dump_at;
  dump_cmd->add_option("--at", dump_at,
                       "print the elements around this index (as 3,17 or (3, 17), as a report "
                       "prints where the largest error is), -n of them");

  std::string pack_in, pack_out;
  auto* pack_cmd =
      app.add_subcommand("pack", "rewrite a trace (or shards) as one safetensors file");
  pack_cmd->add_option("input", pack_in)->required();
  pack_cmd->add_option("-o,--output", pack_out, "output file")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's messages quote the arguments as given: printed through the one escaper.
    std::ostringstream out, err;
    const int rc = app.exit(e, out, err);
    std::fputs(out.str().c_str(), stdout);
    std::istringstream lines(err.str());
    for (std::string line; std::getline(lines, line);)
      std::fprintf(stderr, "%s\n", printable(line).c_str());
    return rc == 0 ? 0 : kCouldNotJudge;
  }
  try {
    if (*consistent_cmd) return run_consistent(consistent_files, consistent_rule, args, out);
    if (*sensitivity_cmd) {
      add_rule_arguments(traces.rules, args);
      return run_sensitivity(traces, args, sensitivity_options, out);
    }
    if (*judge_cmd) {
      add_rule_arguments(traces.rules, args);
      args.magnitude_profile = out.format == "html";  // the page charts it
      return run_judge(resolve_options(args), traces.test, traces.ref, traces.truth, args,
                       traces.ranks, out);
    }
    if (*compare_cmd) {
      const Rule rule = parse_rule(compare_rule, "--rule");
      if (rule.kind == RuleKind::kSame || rule.kind == RuleKind::kMeasured) {
        fail("--rule",
             "compare has no truth: use ulp:K, exact, abs:X or allclose[:ATOL,RTOL] (or judge "
             "with a truth)");
      }
      args.rules.push_back({"", compare_rule, ""});
      args.magnitude_profile = out.format == "html";
      return run_judge(resolve_options(args), a, b, "", args, 0, out);
    }
    if (*inspect_cmd) return inspect(inspect_path);
    if (*names_cmd) {
      std::fputs(render_names(Trace::open(names_path)).c_str(), stdout);
      return kAligned;
    }
    if (*dump_cmd) return dump(dump_path, dump_tensor, dump_limit, dump_at);
    if (*pack_cmd) return pack(pack_in, pack_out);
  } catch (const Error& e) {
    std::fprintf(stderr, "numalign: error: %s\n", e.what());
    return kCouldNotJudge;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "numalign: error: %s\n", e.what());
    return kCouldNotJudge;
  }
  return kCouldNotJudge;
}
