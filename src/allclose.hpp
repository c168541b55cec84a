// allclose.hpp: the pass of the allclose:ATOL,RTOL rule, torch.testing.assert_close's test
// |test - ref| <= atol + rtol * |ref| element by element, with the figures its message gives.
#pragma once

#include <cstdint>
#include <utility>

#include "numalign/dtype.hpp"
#include "numalign/tensor.hpp"

namespace numalign::detail {

struct CloseStats {
  std::uint64_t beyond = 0;  // elements outside the bound (NaN unless equal_nan, Inf unequal)
  // The largest |test - ref| / (atol + rtol |ref|): at most 1 when every element is within;
  // infinite where a bound of 0 is exceeded or a NaN / Inf does not match.
  double worst = 0;
  std::uint64_t worst_index = 0;
  double max_abs = 0;  // the greatest |test - ref| and |test - ref| / |ref| (NaN-free elements)
  std::uint64_t max_abs_index = 0;
  double max_rel = 0;
  std::uint64_t max_rel_index = 0;
};

// Reads contiguous views of equal floating dtype and numel. Each element is decided as
// assert_close decides it, by torch.isclose(test, ref) rounded in the tensors' dtype (equal
// values, infinities included, are close; NaN only to NaN with equal_nan); the figures are
// computed in double.
CloseStats close_stats(const TensorView& test, const TensorView& ref, double atol, double rtol,
                       bool equal_nan);

// assert_close's default (atol, rtol) for a floating dtype: fp16 (1e-5, 1e-3), bf16 (1e-5,
// 1.6e-2), fp32 (1e-5, 1.3e-6), fp64 (1e-7, 1e-7); fp8, which recent torch compares bitwise,
// (0, 0).
std::pair<double, double> assert_close_defaults(DType dtype);

}  // namespace numalign::detail
