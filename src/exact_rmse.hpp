// exact_rmse.hpp: same()'s rmse inequality, RMSE(test, truth) <= multiplier * RMSE(ref,
// truth) + tol / 10, decided in exact arithmetic where float64 rounding could decide it.
// torch sums the squares in its own order and rounds each step; numalign's compensated sums
// round elsewhere; on the line, to the last bits, neither is the answer, exact arithmetic is.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "numalign/tensor.hpp"

namespace numalign::detail {

// A natural number of any size (64-bit limbs, least significant first, no leading zeros):
// just what the exact inequality needs.
class Natural {
 public:
  Natural() = default;
  explicit Natural(std::uint64_t v);
  // hi * 2^64 + lo, shifted left by `shift` bits.
  static Natural from_parts(std::uint64_t hi, std::uint64_t lo, unsigned shift);

  bool is_zero() const { return limbs_.empty(); }
  Natural& operator+=(const Natural& o);
  Natural& operator-=(const Natural& o);  // requires *this >= o
  Natural operator*(const Natural& o) const;
  Natural operator<<(unsigned bits) const;
  friend std::strong_ordering operator<=>(const Natural& a, const Natural& b);
  friend bool operator==(const Natural& a, const Natural& b) = default;

  // Adds (hi * 2^64 + lo) * 2^shift: the accumulator's step, without allocating.
  void add_shifted(std::uint64_t hi, std::uint64_t lo, unsigned shift);

 private:
  void trim();
  std::vector<std::uint64_t> limbs_;
};

// Exact sums of squares of (truth - test) and (truth - ref), as integers in units of
// 2^-2148 (the square of the least subnormal double). Every element must be finite.
struct ExactSquares {
  Natural test, ref;
  std::uint64_t n = 0;
};
ExactSquares exact_squares(const TensorView& test, const TensorView& ref, const TensorView& truth);

// sqrt(se / n) <= multiplier * sqrt(sb / n) + tol / 10 in exact arithmetic (multiplier > 0
// and tol >= 0 finite; tol / 10 the real tenth, not its rounding).
bool rmse_inequality_holds(const ExactSquares& s, double multiplier, double tol);

// Whether the metrics pass's float64 error and bound = multiplier * baseline + tol / 10 are
// so far apart that none of its roundings (a relative 2^-40 of the sums, or underflow's
// 2^-537 absolute in a root) can flip error <= bound from its exact verdict.
bool rmse_verdict_certain(double error, double bound, double multiplier);

}  // namespace numalign::detail
