// upstream_gradient.cpp: see numalign/upstream_gradient.hpp.
#include "numalign/upstream_gradient.hpp"

namespace numalign {

namespace {

// splitmix64's output function: a bijection of 64-bit integers whose outputs for consecutive
// inputs pass the usual statistical tests.
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void fill_upstream_gradient(std::uint64_t key, float* out, std::size_t n) {
  const std::uint64_t stream = splitmix64(key);
  constexpr std::uint64_t kCount = 2 * kUpstreamGradientLevels + 1;
  for (std::size_t i = 0; i < n; ++i) {
    // The top 32 bits scaled to [0, kCount) (multiply and shift: no division, no bias worth
    // naming), centred.
    const auto k = static_cast<std::int32_t>(((splitmix64(stream + i) >> 32) * kCount) >> 32) -
                   kUpstreamGradientLevels;
    out[i] = static_cast<float>(k) / 128.0f;  // exact: |k| < 2^8
  }
}

}  // namespace numalign
