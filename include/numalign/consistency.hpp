// numalign/consistency.hpp: tensors that must be replicated across ranks (weights after an
// all-reduce step, a broadcast buffer) agree bitwise, or within ulp:K, on every rank.
#pragma once

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

// Compares every tensor of each rank with rank 0's (ranks[0]); `rule` is exact or ulp:K
// (anything else throws Error). Tensors not on every rank are inconsistent.
ConsistencyReport check_consistent(const std::vector<const Trace*>& ranks,
                                   const std::vector<std::string>& files, const Rule& rule,
                                   const std::vector<std::string>& only = {}, int threads = 0);

std::string render_consistency_text(const ConsistencyReport& report);
std::string render_consistency_json(const ConsistencyReport& report);

}  // namespace numalign
