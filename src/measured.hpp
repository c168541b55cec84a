// measured.hpp: what the measured rule reads beyond the fused pass: the reference's largest
// error against the truth, element by element.
#pragma once

#include <cstdint>

#include "numalign/tensor.hpp"

namespace numalign::detail {

struct LargestDifference {
  double value = 0;  // max |a - b| over elements where both are numbers
  std::uint64_t index = 0;
};

// Reads contiguous views of equal numel (any judgeable dtypes), in double.
LargestDifference largest_difference(const TensorView& a, const TensorView& b);

}  // namespace numalign::detail
