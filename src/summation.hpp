// summation.hpp: compensated (Neumaier) accumulation for the float64 metric sums.
#pragma once

#include <cmath>

namespace numalign::detail {

// Kahan-Babuska-Neumaier sum. Blocks of a few hundred elements are summed plainly and the
// block sums are added here, so the error stays near one rounding of the final value
// instead of growing with the element count.
class CompensatedSum {
 public:
  void add(double x) {
    const double t = sum_ + x;
    if (std::fabs(sum_) >= std::fabs(x)) {
      carry_ += (sum_ - t) + x;
    } else {
      carry_ += (x - t) + sum_;
    }
    sum_ = t;
  }
  void merge(const CompensatedSum& other) {
    add(other.sum_);
    // An infinite sum's carry is NaN (inf - inf): adding it would turn inf into NaN.
    if (std::isfinite(other.sum_)) add(other.carry_);
  }
  // An infinite or NaN running sum makes the carry meaningless: report the sum itself.
  double value() const { return std::isfinite(sum_) ? sum_ + carry_ : sum_; }

 private:
  double sum_ = 0;
  double carry_ = 0;
};

}  // namespace numalign::detail
