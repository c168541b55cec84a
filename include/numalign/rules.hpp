// numalign/rules.hpp: the rules (measured, the default; same, PyTorch's
// `torch._dynamo.utils.same()` exactly, with its constants; ulp:K, exact, abs:X,
// allclose:ATOL,RTOL), per-tensor overrides and the policy file.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "numalign/glob.hpp"
#include "numalign/metrics.hpp"
#include "numalign/tensor.hpp"

namespace numalign {

struct TensorMap;  // map.hpp

enum class RuleKind { kSame, kUlp, kExact, kAbs, kAllclose, kMeasured };

// The measured rule's constants, chosen on the rule study (docs/rule_study.md, `make study`):
// the limit on each ratio of test's error to ref's, and the least |error balance| that fails
// a tensor the bias check flags (correct kernels reached 0.27 there, truncating ones 0.5-1).
inline constexpr double kMeasuredLimit = 3.0;
inline constexpr double kMeasuredBiasFloor = 0.3;

struct Rule {
  RuleKind kind = RuleKind::kMeasured;  // the default rule
  // ulp: K; abs: X; same: a fixed multiplier replacing same()'s table (0 = the table);
  // allclose: atol (negative: torch.testing.assert_close's defaults for the tensor's dtype);
  // measured: the limit on its ratios (0 = kMeasuredLimit).
  double param = 0;
  double rtol = 0;  // allclose's
  // "measured", "measured:4", "same", "same:5", "ulp:1", "exact", "abs:0.13", "allclose",
  // "allclose:1e-05,0.016" ("rmse[:M]", same's former name, parses as same)
  std::string spec() const;
};

// Whether the rule a spec names measures its allowance on ref's error against the truth
// (same[:M], measured[:L]): a ref that is no rendition of its truth widens it.
bool allowance_from_ref(std::string_view spec);

// Parses a rule spec; throws Error naming `where` on a bad one.
Rule parse_rule(std::string_view spec, const std::string& where = "--rule");

// A rule for the tensors whose names match `glob` (`*` any run of characters, `?` one).
struct Override {
  std::string glob;
  Rule rule;
  std::string reason;  // required when the override loosens the default
  std::string origin;  // "--rule" or the policy file, for messages
};

// Whether `name` is selected by `only` (the --only globs): every name when it is empty.
bool selected_by(const std::vector<std::string>& only, std::string_view name);

// Report sections that depend on how the runs were made, asked for by the front end that
// made them.
struct ReportSections {
  // Every module ran on the truth's inputs to it (capture.isolate): rank modules by their own
  // worst ratio / limit. No first divergence then: no module saw another's output.
  bool module_ranking = false;
  // Name the first tensor, in ref's execution order, that does not pass (check_resume).
  bool first_failing = false;
};

inline constexpr std::size_t kProfileSummedPast = 20'000;

struct JudgeOptions {
  double tol = 1e-4;  // same()'s tol: allclose fast path and the tol/10 slack
  bool equal_nan = false;
  bool larger_multiplier_for_small = false;  // same()'s use_larger_multiplier_for_smaller_tensor
  bool force_max_multiplier = false;         // same()'s force_max_multiplier
  bool check_bias = false;                   // fail tensors whose error balance is biased
  Rule default_rule;                         // for floating tensors; others are exact
  std::vector<Override> overrides;           // later entries win
  int threads = 0;                           // 0: all cores
  bool magnitude_profile = false;            // bin the error by magnitude (HTML report)
  // With magnitude_profile, past kProfileSummedPast tensors: only the sum over the tensors is
  // kept (Report::magnitude, in execution order), not each tensor's profile (1.5 KiB each:
  // 1.5 GB for a million). What the HTML page draws; the CLI asks for it.
  bool magnitude_profile_sum_only = false;
  std::vector<std::string> only;  // globs of the ref tensors to judge (empty: all)
  // The user's written reason why runs that consumed random numbers share their draws (the
  // same seed before the same sequence of random ops): without it such runs cannot be judged.
  std::string shared_randomness;
  ReportSections sections;
  // How test's tensors pair with ref's when their names or layouts differ (map.hpp).
  std::shared_ptr<const TensorMap> map;
};

// Reads a policy file (JSON) into options: {"default": SPEC, "tol": X, "check_bias": B,
// "overrides": [{"match": GLOB, "rule": SPEC, "reason": TEXT}]}. Throws Error naming the file.
void load_policy(const std::string& path, JudgeOptions& options);
void parse_policy(std::string_view json, const std::string& path, JudgeOptions& options);

// Throws Error when an override loosens a rule without a written reason: ulp:K with K > 1,
// a same multiplier above the largest of same()'s defaults for its dtype class.
void check_override_reasons(const JudgeOptions& options);

// A reason that is empty or only whitespace: no reason (override reasons, shared randomness).
bool is_blank(std::string_view reason);

// same()'s multiplier, in its order: force_max -> 10; base 3 for fp16/bf16/fp8 else 2;
// with larger_multiplier_for_small: numel <= 10 -> 10, numel <= 500 -> 8; otherwise 3 when
// numel < 1000, or 4-D with the last two dims 1, or tol >= 2e-2.
double rmse_multiplier(DType dtype, const Shape& shape, double tol, bool larger_for_small,
                       bool force_max);

enum class VerdictKind { kPass, kFail, kError };

// A warning about one tensor: its cause, in the same words for every tensor it concerns (a
// report gives each cause one line, with a count and the first few names), and what this
// tensor shows ("" when nothing more).
struct TensorWarning {
  std::string cause;
  std::string detail;
};

struct Verdict {
  VerdictKind kind = VerdictKind::kPass;
  std::string reason;           // why it failed or could not be judged; how it passed
  std::optional<double> ratio;  // the rule's measure (same: error / baseline)
  std::optional<double> limit;  // its bound (same: the multiplier)
  bool bias_failed = false;     // the bias check would fail (a warning unless check_bias)
  std::vector<TensorWarning> warnings;
};

// The rule that applies to a tensor and, when an override chose it, that override.
struct RuleChoice {
  Rule rule;
  const Override* override = nullptr;
};
RuleChoice choose_rule(const std::string& name, DType dtype, const JudgeOptions& options);

// choose_rule for many names: the overrides' globs compiled once and indexed by their literal
// prefix (else suffix), so that a name is matched only against the overrides that can match
// it. `options` must outlive the selector.
class RuleSelector {
 public:
  explicit RuleSelector(const JudgeOptions& options);
  RuleChoice choose(std::string_view name, DType dtype) const;

 private:
  using Index = std::unordered_map<std::string_view, std::vector<std::size_t>>;
  const JudgeOptions& options_;
  std::vector<Glob> globs_;
  Index by_prefix_, by_suffix_;                               // override indices by literal
  std::vector<std::size_t> prefix_lengths_, suffix_lengths_;  // the distinct lengths, ascending
  std::vector<std::size_t> unanchored_;                       // globs with neither
};

// Applies a rule to metrics of test/ref/truth that already agree in dtype and shape.
// truth may be null (ulp / exact / abs need none). The views' data must be readable: where
// same's inequality is too close to call in float64, it is decided on the data exactly.
Verdict evaluate(const RuleChoice& choice, const TensorView& test, const TensorView& ref,
                 const TensorView* truth, const Metrics& metrics, const JudgeOptions& options);

// distance <= bound, exactly: an integer distance (ULPs, or an integer tensor's difference)
// is never rounded to a double first (2^53 + 1 <= 2^53 must be false).
bool distance_within(std::uint64_t distance, double bound);

// The bias check (docs/architecture.md, "Metrics and the bias check"): |EB(test)| above both
// 4/sqrt(#(t != u)) and 2|EB(ref)| + 0.05.
bool bias_check_fails(const Metrics& metrics);

}  // namespace numalign
