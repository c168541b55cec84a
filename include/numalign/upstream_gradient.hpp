// numalign/upstream_gradient.hpp: the fixed gradient every captured run's backward pass
// starts from, the same bits on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace numalign {

// The recipe's name, recorded in trace metadata ("upstream_gradient"): runs whose backward
// passes started from different gradients cannot be compared. Traces that record a seed but
// no recipe were captured by numalign before it had one: torch.randn in float64.
inline constexpr std::string_view kUpstreamGradientRecipe = "grid128-splitmix64";
inline constexpr std::string_view kUpstreamGradientBeforeRecipes = "randn-float64";

// The largest |k| of a value k / 128: 222 / 128 = 1.734, about sqrt(3).
inline constexpr std::int32_t kUpstreamGradientLevels = 222;

// Fills out[0, n) with values k / 128, k an integer uniform on [-222, 222] drawn from (key, i)
// by integer arithmetic (splitmix64): mean 0, variance 1.007. So element i depends only on
// (key, i), it is cheap to draw, and no library's random number generator or libm can make
// two machines differ. Every value has at most 8 significant bits: bf16, fp16, float32 and
// float64 hold it exactly, so every run receives the same gradient whatever the dtype of the
// output it flows into, and a float64 truth receives exactly what its runs receive.
void fill_upstream_gradient(std::uint64_t key, float* out, std::size_t n);

}  // namespace numalign
