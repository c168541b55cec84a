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
inline constexpr std::string_view kUpstreamGradientRecipe = "uniform-splitmix64";
inline constexpr std::string_view kUpstreamGradientBeforeRecipes = "randn-float64";

// Fills out[0, n) with float32 values uniform on [-sqrt(3), sqrt(3)) (unit variance): a
// 24-bit integer k from (key, i) by integer arithmetic (splitmix64), then the float32 product
// (k * 2^-23) * float32(sqrt(3)), one IEEE rounding. So element i depends only on (key, i),
// it is cheap to draw, and no library's random number generator or libm can make two
// machines differ. Each run rounds the values to its own dtype (float64 holds them exactly).
void fill_upstream_gradient(std::uint64_t key, float* out, std::size_t n);

}  // namespace numalign
