// measured.cpp: see measured.hpp.
#include "measured.hpp"

#include <array>
#include <cmath>

#include "numalign/dtype.hpp"

namespace numalign::detail {

namespace {

// 0 finite, 1 NaN, 2 +Inf, 3 -Inf.
int kind_of(double x) {
  if (std::isfinite(x)) return 0;
  if (std::isnan(x)) return 1;
  return x > 0 ? 2 : 3;
}

}  // namespace

NonfiniteSplit split_nonfinite(const TensorView& test, const TensorView& ref,
                               const TensorView& truth) {
  NonfiniteSplit s;
  const std::size_t ts = element_size(test.dtype), rs = element_size(ref.dtype),
                    us = element_size(truth.dtype);
  const std::uint64_t n = test.numel();
  const auto at = [&](std::uint64_t i) {
    return std::array<double, 3>{to_double(test.dtype, test.data + i * ts),
                                 to_double(ref.dtype, ref.data + i * rs),
                                 to_double(truth.dtype, truth.data + i * us)};
  };
  std::uint64_t finite = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto [t, r, u] = at(i);
    const int kt = kind_of(t), kr = kind_of(r), ku = kind_of(u);
    if (kr != ku) {
      if (s.ref_off++ == 0) s.first_ref_off = i;
    } else if (kt != kr) {
      if (s.test_off++ == 0) s.first_test_off = i;
    } else if (kt != 0) {
      ++s.alike;
    } else {
      ++finite;
    }
  }
  if (s.ref_off > 0 || s.test_off > 0) return s;  // decided without the values
  s.finite.reserve(finite);
  for (auto* values : {&s.test, &s.ref, &s.truth}) values->reserve(finite);
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto [t, r, u] = at(i);
    if (!std::isfinite(t) || !std::isfinite(r) || !std::isfinite(u)) continue;
    s.finite.push_back(i);
    s.test.push_back(t);
    s.ref.push_back(r);
    s.truth.push_back(u);
  }
  return s;
}

}  // namespace numalign::detail
