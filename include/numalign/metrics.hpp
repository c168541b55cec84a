// numalign/metrics.hpp: every per-tensor metric, from one fused pass over test, ref and truth.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "numalign/tensor.hpp"

namespace numalign {

// ULP histogram bins: 0, 1, 2, 3-4, 5-8, ..., (2^62, 2^63], (2^63, 2^64), then "inf" for a
// NaN against a number (or NaN against NaN without equal_nan).
inline constexpr int kUlpBins = 67;
inline constexpr int kUlpInfBin = kUlpBins - 1;
constexpr int ulp_bin(std::uint64_t distance) {
  return distance == 0 ? 0 : 1 + static_cast<int>(std::bit_width(distance - 1));
}
std::string ulp_bin_label(int bin);

struct NonFinite {
  std::uint64_t nan = 0;
  std::uint64_t inf = 0;
};

// Elements per ULP bin, kept up to the last bin that is not empty: a tensor's distances fill
// a few low bins, and a report holds one per tensor (67 counts each would be 536 bytes: half
// a gigabyte for a million tensors).
class UlpHistogram {
 public:
  UlpHistogram() = default;
  explicit UlpHistogram(const std::array<std::uint64_t, kUlpBins>& dense);
  std::uint64_t operator[](int bin) const {
    return static_cast<std::size_t>(bin) < counts_.size() ? counts_[bin] : 0;
  }
  void set(int bin, std::uint64_t count);
  // Equal when every bin holds the same count.
  bool operator==(const UlpHistogram& other) const { return counts_ == other.counts_; }

 private:
  std::vector<std::uint64_t> counts_;  // no trailing zero
};

struct UlpStats {
  std::uint64_t max = 0;       // over elements whose distance is finite
  bool any_inf = false;        // some element is NaN on one side, or in both without equal_nan
  std::uint64_t both_nan = 0;  // elements NaN in test and ref alike (unequal without equal_nan)
  std::uint64_t max_index = 0;
  UlpHistogram hist;
};

// Error against magnitude: elements binned by the binary exponent of |truth|. Bin b holds
// 2^(b - kMagnitudeBias) <= |truth| < 2^(b - kMagnitudeBias + 1); the end bins take
// everything beyond (bin 0 also 0). Filled during the fused pass when asked for
// (MetricOptions::magnitude_profile); empty otherwise. Elements with a NaN or Inf anywhere
// are left out. The sums are plain float64 sums in element order (a chart's numbers).
inline constexpr int kMagnitudeBins = 64;
inline constexpr int kMagnitudeBias = 32;
struct MagnitudeBin {
  std::uint64_t count = 0;
  double sq_err_test = 0;  // sum of (test - truth)^2
  double sq_err_ref = 0;   // sum of (ref - truth)^2
  bool operator==(const MagnitudeBin&) const = default;
};
struct MagnitudeProfile {
  // kMagnitudeBins bins, or none (one vector, not one per sum: every result holds a profile,
  // most of them empty).
  std::vector<MagnitudeBin> bins;
  bool empty() const { return bins.empty(); }
  void add(const MagnitudeProfile& other);
};

struct Metrics {
  std::uint64_t numel = 0;
  bool floating = false;   // test/ref dtype is a floating type
  bool has_truth = false;  // truth was given and could be read as numbers

  // Test and truth, ref and truth (valid when has_truth).
  double error = 0;     // RMSE(test, truth)
  double baseline = 0;  // RMSE(ref, truth)
  double max_abs_truth = 0;
  std::uint64_t max_abs_truth_index = 0;
  double max_abs_ref_truth = 0;          // max |ref - truth|: ref's worst element (measured)
  double rms_truth = 0;                  // RMS(truth), the truth's magnitude
  double rel_l2 = 0;                     // ||test - truth|| / ||truth||
  double cosine = 0;                     // cos(test, truth); NaN when a norm is 0
  double mean_error = 0;                 // mean(test - truth), the bias
  double eb_test = 0;                    // error balance of magnitudes, test vs truth
  double eb_ref = 0;                     // the same for ref
  std::uint64_t test_differs_truth = 0;  // #(test != truth)
  std::uint64_t ref_differs_truth = 0;

  // Test and ref.
  double max_abs_ref = 0;  // for integers, the exact ulp.max rounded to a double
  std::uint64_t max_abs_ref_index = 0;
  std::uint64_t not_close = 0;      // elements outside allclose(ref, test, tol, tol, equal_nan)
  std::uint64_t bits_differ = 0;    // elements whose bit patterns differ
  std::uint64_t values_differ = 0;  // elements whose ULP distance is not 0
  // Floating types: distances in ULPs, with a histogram. Integers: max / max_index only,
  // the exact largest |test - ref| (an integer's unit is 1).
  UlpStats ulp;

  NonFinite test_nonfinite, ref_nonfinite, truth_nonfinite;
  MagnitudeProfile magnitude;  // with a truth, when MetricOptions::magnitude_profile
};

// The fused pass has two implementations. `simd` (Highway, dispatched at run time to the
// widest vectors this CPU has: AVX-512, AVX2, SSE4, ...) is the one used; `scalar` is the
// plain reference it is tested against. Every count, maximum, index and histogram bin is
// identical between them. The float64 sums are formed in another order: each is a sum of
// blocks of kBlock = 256 terms added with compensation, so each path's sum S of terms x_i
// is within gamma(256) * sum|x_i| + 2u|S| of the exact value (u = 2^-53, gamma(n) =
// nu/(1-nu)), and the two paths agree within twice that. For the squared errors the terms
// are positive, so RMSE, baseline and relative L2 agree to about 3e-14 relative.
enum class MetricKernel { simd, scalar };

// The instruction set the simd kernel runs on here ("AVX3", "AVX2", "SSE4", "EMU128"...).
std::string simd_target();

struct MetricOptions {
  double tol = 1e-4;       // atol = rtol = tol of the allclose fast path
  bool equal_nan = false;  // NaN == NaN for allclose and ULP
  MetricKernel kernel = MetricKernel::simd;
  bool magnitude_profile = false;  // also bin the error by magnitude (Metrics::magnitude)
};

// One tensor's three inputs. test and ref must have equal dtype and numel; truth (optional)
// must have ref's numel and may be any judgeable dtype (F64 for the measured and same rules).
struct MetricsInput {
  const TensorView* test = nullptr;
  const TensorView* ref = nullptr;
  const TensorView* truth = nullptr;
};

// Computes metrics for many tensors at once, in parallel over tensors and over chunks of
// large tensors (threads <= 0: all cores). Results are deterministic: chunks merge in order.
// `progress`, when set, is called with (bytes done, bytes total) from the calling thread.
std::vector<Metrics> compute_metrics(std::span<const MetricsInput> inputs,
                                     const MetricOptions& options, int threads = 0,
                                     const std::function<void(double, double)>& progress = {});
Metrics compute_metrics(const TensorView& test, const TensorView& ref, const TensorView* truth,
                        const MetricOptions& options = {});

// allclose(truth.to(test dtype), test, 4e-2, 4e-2): `same()`'s escape for a NaN in ref only.
// A second pass, run only in that corner case.
bool loosely_close_to_truth(const TensorView& test, const TensorView& truth, bool equal_nan);

}  // namespace numalign
