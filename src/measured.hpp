// measured.hpp: what the measured rule needs beyond the fused pass: where test, ref and
// truth hold NaN or Inf, whether they agree in kind there, and the finite rest.
#pragma once

#include <cstdint>
#include <vector>

#include "numalign/tensor.hpp"

namespace numalign::detail {

// The elements of one tensor sorted by what its three runs hold there.
struct NonfiniteSplit {
  std::uint64_t alike = 0;     // NaN, +Inf or -Inf in test, ref and truth alike
  std::uint64_t test_off = 0;  // ref and truth agree (finite or alike), test does not
  std::uint64_t ref_off = 0;   // ref and truth disagree, one of them NaN or Inf
  std::uint64_t first_test_off = 0, first_ref_off = 0;  // indices, when counted
  // The elements all three hold finite, in order: their indices, and their values widened
  // to float64 (test, ref, truth).
  std::vector<std::uint64_t> finite;
  std::vector<double> test, ref, truth;
};

// Reads contiguous views of equal numel (any judgeable dtypes): a first pass counts, and
// only when ref and test agree with the truth everywhere a second one copies the finite
// elements (32 bytes each: the memory of the rare tensors that take this path).
NonfiniteSplit split_nonfinite(const TensorView& test, const TensorView& ref,
                               const TensorView& truth);

}  // namespace numalign::detail
