// metrics_internal.hpp: the per-chunk partial results of the fused pass, shared by its
// scalar reference path (metrics.cpp) and its SIMD kernel (metrics_simd.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "numalign/metrics.hpp"
#include "summation.hpp"

namespace numalign::detail {

inline constexpr std::size_t kBlock = 256;  // elements decoded at a time (stack buffers)

// Adds the NaN and Inf among n decoded values to nf.
inline void count_nonfinite(const double* v, std::size_t n, NonFinite& nf) {
  for (std::size_t i = 0; i < n; ++i) {
    nf.nan += std::isnan(v[i]);
    nf.inf += std::isinf(v[i]);
  }
}

// Every metric of one chunk [begin, end) of one tensor, before the final divisions.
// UlpStats as the pass fills it: every bin at hand (UlpStats keeps the used ones only).
struct UlpAccumulator {
  std::uint64_t max = 0;
  bool any_inf = false;
  std::uint64_t both_nan = 0;
  std::uint64_t max_index = 0;
  std::array<std::uint64_t, kUlpBins> hist{};
};

struct Partial {
  std::uint64_t n = 0;
  CompensatedSum sq_err_test, sq_err_ref, sq_truth, sq_test, test_dot_truth, err_sum;
  double max_abs_truth = -1;
  std::uint64_t max_abs_truth_index = 0;
  double max_abs_ref_truth = 0;  // no index: the measured rule reads the value only
  double max_abs_ref = -1;
  std::uint64_t max_abs_ref_index = 0;
  std::uint64_t test_differs = 0, test_over = 0, test_under = 0;
  std::uint64_t ref_differs = 0, ref_over = 0, ref_under = 0;
  std::uint64_t not_close = 0, bits_differ = 0, values_differ = 0;
  UlpAccumulator ulp;
  NonFinite nf_test, nf_ref, nf_truth;
  MagnitudeProfile magnitude;

  // Folds in the partial of another, disjoint range: on ties a maximum keeps the smaller
  // index, so any merge order gives the first index of every maximum.
  void merge(const Partial& other);
};

// Adds n decoded elements (test t, ref r, truth u) to the profile, one at a time in order:
// both paths call it on the same blocks, so their counts are identical (the sums agree to
// rounding: chunks and a vector tail are merged bin by bin).
void add_magnitude_profile(const double* t, const double* r, const double* u, std::size_t n,
                           MagnitudeProfile& profile);
// The same from the raw bytes of [begin, end) (decoded as the scalar path decodes them),
// for the SIMD path to call on each block it has just read.
void add_magnitude_profile(const MetricsInput& in, std::uint64_t begin, std::uint64_t end,
                           MagnitudeProfile& profile);

// The reference path: plain C++, one element at a time.
Partial accumulate_scalar(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                          std::uint64_t end);
// The SIMD kernel (Highway, dispatched at run time to the best target of this CPU). Its
// sums may differ from the scalar path's by the summation-order bound in metrics.hpp;
// every count, maximum, index and histogram bin is identical.
Partial accumulate_simd(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                        std::uint64_t end);
class PagePopulator;
// Takes tensor k's finished metrics; called from the pass's threads, once per tensor.
using MetricsSink = std::function<void(std::size_t k, Metrics&& metrics)>;
// compute_metrics handing each tensor's metrics to `store` (judge moves them straight into
// its results, on the threads that computed them: no second copy, no serial pass over them).
// `pages`, when given, maps the pages of file mappings just before each task reads them.
void compute_metrics_into(std::span<const MetricsInput> inputs, const MetricsSink& store,
                          const MetricOptions& options, int threads,
                          const std::function<void(double, double)>& progress,
                          const PagePopulator* pages = nullptr);
// The SIMD targets compiled in that this CPU runs, best first (the last needs no
// extension); accumulate_simd uses the first unless a test chooses another by name (the
// empty name restores the best; an unknown one throws std::invalid_argument).
std::vector<std::string> usable_simd_targets();
void choose_simd_target(const std::string& name);

}  // namespace numalign::detail
