// allclose.cpp: see allclose.hpp.
#include "allclose.hpp"

#include <cmath>
#include <limits>

#include "isclose.hpp"

namespace numalign::detail {

CloseStats close_stats(const TensorView& test, const TensorView& ref, double atol, double rtol,
                       bool equal_nan) {
  CloseStats s;
  const std::size_t es = element_size(test.dtype);
  const std::uint64_t n = test.numel();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto note = [](double value, std::uint64_t i, double& best, std::uint64_t& at) {
    if (value > best) {
      best = value;
      at = i;
    }
  };
  for (std::uint64_t i = 0; i < n; ++i) {
    const double t = to_double(test.dtype, test.data + i * es);
    const double r = to_double(ref.dtype, ref.data + i * es);
    // The verdict as assert_close computes it: torch.isclose(test, ref) in the tensors' dtype.
    if (!torch_isclose(test.dtype, t, r, atol, rtol, equal_nan)) ++s.beyond;
    if (t == r || std::isnan(t) || std::isnan(r) || std::isinf(t) || std::isinf(r)) {
      if (!(t == r) && !(equal_nan && std::isnan(t) && std::isnan(r)))
        note(kInf, i, s.worst, s.worst_index);
      continue;
    }
    // The figures in double: what the message shows.
    const double diff = std::fabs(t - r);
    const double allowed = atol + rtol * std::fabs(r);
    note(allowed > 0 ? diff / allowed : kInf, i, s.worst, s.worst_index);
    note(diff, i, s.max_abs, s.max_abs_index);
    note(r != 0 ? diff / std::fabs(r) : kInf, i, s.max_rel, s.max_rel_index);
  }
  return s;
}

std::pair<double, double> assert_close_defaults(DType dtype) {
  switch (dtype) {
    case DType::F16:
      return {1e-5, 1e-3};
    case DType::BF16:
      return {1e-5, 1.6e-2};
    case DType::F32:
      return {1e-5, 1.3e-6};
    case DType::F64:
      return {1e-7, 1e-7};
    default:
      return {0, 0};
  }
}

}  // namespace numalign::detail
