// measured.cpp: see measured.hpp.
#include "measured.hpp"

#include <cmath>

#include "numalign/dtype.hpp"

namespace numalign::detail {

LargestDifference largest_difference(const TensorView& a, const TensorView& b) {
  LargestDifference d;
  const std::size_t as = element_size(a.dtype), bs = element_size(b.dtype);
  const std::uint64_t n = a.numel();
  for (std::uint64_t i = 0; i < n; ++i) {
    const double diff =
        std::fabs(to_double(a.dtype, a.data + i * as) - to_double(b.dtype, b.data + i * bs));
    if (diff > d.value) {  // NaN never wins
      d.value = diff;
      d.index = i;
    }
  }
  return d;
}

}  // namespace numalign::detail
