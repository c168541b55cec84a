// numalign/consistency.hpp: tensors that must be replicated across ranks (weights after an
// all-reduce step, a broadcast buffer) agree bitwise, or within ulp:K, on every rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "numalign/rules.hpp"
#include "numalign/trace.hpp"

namespace numalign {

// How one rank's tensor differs from rank 0's.
struct RankDifference {
  std::size_t rank = 0;
  std::string problem;                // "missing", a dtype or shape mismatch; "" when compared
  std::uint64_t elements_differ = 0;  // bitwise
  std::uint64_t first_index = 0;      // the first element whose bits differ
  double value = 0, rank0_value = 0;  // at first_index
  std::uint64_t max_ulp = 0;
  bool ulp_inf = false;  // NaN against a number somewhere
};

struct TensorConsistency {
  std::string name;
  Shape shape;
  bool consistent = true;
  std::vector<RankDifference> differing;  // ranks outside the rule, in rank order
};

struct ConsistencyReport {
  std::string rule;                        // "exact" or "ulp:K"
  std::vector<std::string> files;          // one per rank, rank 0 first
  std::vector<TensorConsistency> tensors;  // inconsistent first, then rank 0's order
  bool consistent() const;
};

// What a rank tells the others of one tensor: enough to see which tensors differ without
// sending them. Equal digests mean equal bytes ("" when the data is compared directly).
struct RankTensorSummary {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::string digest;
};

// Names, in rank 0's order, of the tensors some rank holds with rank 0's dtype and shape but
// another digest: the tensors rank 0 must send for an element-by-element comparison.
std::vector<std::string> tensors_to_compare(
    const std::vector<std::vector<RankTensorSummary>>& ranks);

// How `mine` (rank `rank`'s tensor) differs from rank 0's (same dtype and shape); nullopt
// when they are bitwise equal.
std::optional<RankDifference> compare_with_rank0(const TensorView& mine, const TensorView& rank0,
                                                 std::size_t rank, int threads = 0);

// A difference measured on a rank, for the tensor `name`.
struct MeasuredDifference {
  std::string name;
  RankDifference difference;
};

// The report from every rank's summaries (rank 0 first) and the differences measured:
// missing tensors, dtype and shape mismatches and tensors only on some rank come from the
// summaries; ranks within ulp:K are dropped; inconsistent tensors first, then rank 0's
// order. `rule` is exact or ulp:K (anything else throws Error).
ConsistencyReport consistency_report(const std::vector<std::vector<RankTensorSummary>>& ranks,
                                     const std::vector<MeasuredDifference>& measured,
                                     const Rule& rule, std::vector<std::string> files);

// Compares every tensor of each rank with rank 0's (ranks[0]); `rule` is exact or ulp:K
// (anything else throws Error). Tensors not on every rank are inconsistent.
ConsistencyReport check_consistent(const std::vector<const Trace*>& ranks,
                                   const std::vector<std::string>& files, const Rule& rule,
                                   const std::vector<std::string>& only = {}, int threads = 0);

std::string render_consistency_text(const ConsistencyReport& report);
std::string render_consistency_json(const ConsistencyReport& report);

}  // namespace numalign
