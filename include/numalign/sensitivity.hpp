// numalign/sensitivity.hpp: would the user's rule catch a real bug in this run? Plants
// known bugs in a copy of the test tensors and judges each planted copy with the same
// options, so a passing test can be told apart from a test that could never fail.
#pragma once

#include <string>
#include <vector>

#include "numalign/judge.hpp"

namespace numalign {

enum class PlantedBug {
  kDroppedTerm,  // each element misses one of K random-sign reduction terms
  kUlpBias,      // every element 2 ULP away from zero
  kOneNan,       // one element (the middle one) NaN
  kTruncation,   // the truth truncated toward zero instead of rounded (needs a truth)
  kSparseUlp,    // 2 ULP away from zero on 1% of the elements
};

struct SensitivityOptions {
  std::uint64_t reduction_terms = 256;  // K of kDroppedTerm: a term is rms(truth) / sqrt(K)
  std::uint64_t seed = 0;
};

struct SensitivityRow {
  std::string bug;          // what was planted, in words
  bool applicable = true;   // false: this row cannot tell (why_not says why)
  std::string why_not;      // "needs a truth", "every tensor ... fails as it is"
  bool caught = false;      // a planted tensor that passed as it was fails with the bug
  std::size_t failing = 0;  // planted tensors failing or erroring with the bug
  std::size_t planted = 0;  // floating tensors the bug was planted in
  std::string worst;        // the worst failing planted tensor, "name (ratio R, limit L)"
};

struct Sensitivity {
  std::string settings;              // the judge's settings, as reports print them
  std::vector<SensitivityRow> rows;  // the unplanted run first ("(none)"), then one per bug
};

std::vector<PlantedBug> all_planted_bugs();

// The test tensors are never modified: each bug is planted in a copy, one bug at a time
// (memory: one copy of the floating test tensors).
Sensitivity sensitivity(const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                        const SensitivityOptions& sopt = {});

// The runs' tensors paired as judge() pairs them (options.only included).
Sensitivity sensitivity(const Trace& test, const Trace& ref, const Trace* truth,
                        const JudgeOptions& options, const SensitivityOptions& sopt = {});

std::string render_sensitivity_text(const Sensitivity& s);
std::string render_sensitivity_json(const Sensitivity& s);

}  // namespace numalign
