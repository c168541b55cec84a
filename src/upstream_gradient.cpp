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
  constexpr float kStep = 1.0f / 8388608.0f;  // 2^-23
  // sqrt(3) rounded to float32: unit variance, as torch.randn's draws had, so that absolute
  // tolerances weigh on gradients as they did.
  constexpr float kScale = 1.7320508f;
  for (std::size_t i = 0; i < n; ++i) {
    // The top 24 bits, centred: an integer in [-2^23, 2^23), exact in float32.
    const auto k = static_cast<std::int32_t>(splitmix64(stream + i) >> 40) - 8388608;
    out[i] = static_cast<float>(k) * kStep * kScale;  // one float32 rounding, by IEEE 754
  }
}

}  // namespace numalign
