// isclose.cpp: ATen's isclose in the tensors' dtype, element by element, and its band.
#include "isclose.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "numalign/metrics.hpp"

namespace numalign {
namespace detail {

float round_float_to(DType d, float x) {
  if (std::isnan(x)) return x;
  if (d == DType::F16) {
    const float a = std::fabs(x);
    // 65520 is halfway past the largest half (65504): ties to even round it to inf.
    if (a >= 65520.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
    // Subnormal halves are multiples of 2^-24; scaling by 2^24 is exact.
    if (a < 0x1p-14f) return std::nearbyint(x * 0x1p24f) * 0x1p-24f;
  }
  if (d == DType::BF16 || d == DType::F16) {
    // Normal range: round to nearest even on the low bits a float has beyond the type's
    // (16 for bf16, 13 for f16); a carry into the exponent is the correct rounding up.
    const int drop = d == DType::BF16 ? 16 : 13;
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1u);
    u &= ~((1u << drop) - 1);
    float r;
    std::memcpy(&r, &u, 4);
    return r;
  }
  return static_cast<float>(round_to(d, x));
}

// torch.isclose(self, other, atol, rtol) for one element: |self - other| <= atol +
// |rtol * other|, computed as ATen's CPU kernels do it (TensorCompare.cpp: allowed =
// atol + (rtol * other).abs(), actual = (self - other).abs(), then actual <= allowed and
// isfinite(actual)), each operation rounded to the tensors' dtype. The two scalars enter
// differently: the mul kernel reads rtol as the opmath type (float for the half types,
// never rounded to the dtype), while add, a ufunc, gets atol as a wrapped number that
// TensorIterator first casts to the tensors' dtype (double to float to half: two
// roundings). In bf16 at tol 0.02 atol is 0.02001953125, and that decides the boundary.
// `same()` calls allclose(ref, test): other is the test.
bool torch_isclose(DType d, double self, double other, double atol, double rtol, bool equal_nan) {
  const double t = self, r = other;
  if (t == r) return true;
  if (std::isnan(t) || std::isnan(r)) return equal_nan && std::isnan(t) && std::isnan(r);
  const double exact_allowed = atol + rtol * std::fabs(r);
  const double exact_actual = std::fabs(t - r);
  // Far from the boundary the roundings cannot change the answer: skip the emulation.
  if (std::isfinite(exact_actual) && exact_actual <= 0.5 * exact_allowed) return true;
  if (exact_actual >= 2 * exact_allowed + 1e-300) return false;
  switch (d) {
    case DType::F64:
      return std::isfinite(exact_actual) && exact_actual <= exact_allowed;
    case DType::F32: {
      const float allowed =
          static_cast<float>(atol) + std::fabs(static_cast<float>(rtol) * static_cast<float>(r));
      const float actual = std::fabs(static_cast<float>(t) - static_cast<float>(r));
      return std::isfinite(actual) && actual <= allowed;
    }
    case DType::BF16:
    case DType::F16: {
      const float atol_in_dtype = round_float_to(d, static_cast<float>(atol));
      const float scaled = round_float_to(d, static_cast<float>(rtol) * static_cast<float>(r));
      const float allowed = round_float_to(d, atol_in_dtype + std::fabs(scaled));
      const float actual =
          std::fabs(round_float_to(d, static_cast<float>(t) - static_cast<float>(r)));
      return std::isfinite(actual) && actual <= allowed;
    }
    default:  // fp8 (torch has no arithmetic for it) and integers: exact arithmetic
      return std::isfinite(exact_actual) && exact_actual <= exact_allowed;
  }
}

// The emulation of torch_isclose moves `allowed` and |t - r| off their double values by
// its roundings: bf16/f16/f32 arithmetic rounds each operation, and atol itself, to
// u = 2^-8, 2^-11, 2^-24 relative (a few roundings: under 4u in all), or to half a
// subnormal spacing absolute.
// A band of 8u relative and 4 subnormal spacings absolute contains every case it can flip.
// That holds while float(tol) is a normal float and nothing overflows (2^-100 <= tol <=
// 0.2) and the band stays above zero; outside, the factor-2 band of torch_isclose's own
// shortcut is used. The other dtypes compare in double as the SIMD kernel does. Every
// band has 2^-50 more room: the kernel forms its lines with a few roundings of its own.
CloseBand close_band(DType d, double tol) {
  constexpr double kKernelRounding = 0x1p-50;
  const CloseBand shortcut{0.5 * (1 - kKernelRounding), 0.0, 2 * (1 + kKernelRounding), 1e-300};
  double u = 0, spacing = 0;
  switch (d) {
    case DType::BF16:
      u = 0x1p-8;
      spacing = 0x1p-133;
      break;
    case DType::F16:
      u = 0x1p-11;
      spacing = 0x1p-24;
      break;
    case DType::F32:
      u = 0x1p-24;
      spacing = 0x1p-149;
      break;
    default:  // |t - r| <= allowed in double, so only the kernel's roundings are unsure.
      // (The offset is the least normal double: a subnormal operand slows the FMA 50x.)
      return {1 - kKernelRounding, 0.0, 1 + kKernelRounding, 0x1p-1022};
  }
  const double relative = 8 * u + kKernelRounding, absolute = 4 * spacing;
  if (!(tol >= 0x1p-100 && tol <= 0.2 && tol * (1 - relative) > absolute)) return shortcut;
  return {1 - relative, -absolute, 1 + relative, absolute};
}

}  // namespace detail

bool loosely_close_to_truth(const TensorView& test, const TensorView& truth, bool equal_nan) {
  constexpr double kLoose = 4e-2;
  const DType dt = test.dtype;
  const std::size_t es = element_size(dt), us = element_size(truth.dtype);
  const std::uint64_t n = test.numel();
  for (std::uint64_t i = 0; i < n; ++i) {
    const double t = to_double(dt, test.data + i * es);
    // torch's .to(dtype) from float64 goes through float for the half types.
    double u = to_double(truth.dtype, truth.data + i * us);
    if (dt != DType::F64) u = static_cast<float>(u);
    if (dt != DType::F64 && dt != DType::F32) u = round_to(dt, u);
    if (!detail::torch_isclose(dt, u, t, kLoose, kLoose, equal_nan)) return false;
  }
  return true;
}

}  // namespace numalign
