// simulations.hpp: small, deterministic kernels in several precisions (a matmul and a fused
// allreduce + residual) whose outputs make the example traces and the claims tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "numalign/dtype.hpp"
#include "numalign/tensor.hpp"

namespace numalign::examples {

// A tensor's bytes with its dtype and shape; view() lends them to the library.
struct Buffer {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<std::byte> bytes;
  TensorView view() const { return TensorView{dtype, shape, bytes.data()}; }
};

// Stores doubles as `dtype`, rounding to nearest even (exact for F64).
inline Buffer make_buffer(DType dtype, Shape shape, const std::vector<double>& values) {
  Buffer b{dtype, std::move(shape), std::vector<std::byte>(values.size() * element_size(dtype))};
  const std::size_t es = element_size(dtype);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint64_t bits = dtype == DType::F32
                                   ? [&] {
                                       const float f = static_cast<float>(values[i]);
                                       std::uint32_t u;
                                       std::memcpy(&u, &f, 4);
                                       return static_cast<std::uint64_t>(u);
                                     }()
                                   : round_to_bits(dtype, values[i]);
    std::memcpy(b.bytes.data() + i * es, &bits, es);
  }
  return b;
}

inline float round_bf16(float x) { return static_cast<float>(round_to(DType::BF16, x)); }

// bf16 rounding toward zero: what a kernel that truncates instead of rounding produces.
inline float truncate_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

inline std::vector<double> normal_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

enum class MatmulVariant {
  kReference,  // fp32 accumulation over k in order
  kReordered,  // fp32 accumulation in four interleaved partial sums: legitimate
  kDropColumn  // forgets the last column of the reduction: a real bug
};

// C = A (M x K) * B (K x N) on inputs already representable in `dtype`; the output is
// rounded to `dtype`. Truth is the exact float64 product of the same inputs.
struct MatmulCase {
  std::size_t m = 32, k = 128, n = 32;
  DType dtype = DType::BF16;
  std::vector<double> a, b;

  MatmulCase(std::size_t m_, std::size_t k_, std::size_t n_, DType d, std::uint64_t seed)
      : m(m_),
        k(k_),
        n(n_),
        dtype(d),
        a(normal_values(m_ * k_, seed)),
        b(normal_values(k_ * n_, seed + 1)) {
    for (auto& x : a) x = round_to(dtype, x);
    for (auto& x : b) x = round_to(dtype, x);
  }

  Buffer truth() const {
    std::vector<double> c(m * n);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::size_t p = 0; p < k; ++p) s += a[i * k + p] * b[p * n + j];
        c[i * n + j] = s;
      }
    return make_buffer(DType::F64, {m, n}, c);
  }

  Buffer run(MatmulVariant variant) const {
    std::vector<double> c(m * n);
    const std::size_t used = variant == MatmulVariant::kDropColumn ? k - 1 : k;
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        float s = 0;
        if (variant == MatmulVariant::kReordered) {
          float part[4] = {0, 0, 0, 0};
          for (std::size_t p = 0; p < used; ++p) {
            part[p % 4] += static_cast<float>(a[i * k + p]) * static_cast<float>(b[p * n + j]);
          }
          s = (part[0] + part[1]) + (part[2] + part[3]);
        } else {
          for (std::size_t p = 0; p < used; ++p) {
            s += static_cast<float>(a[i * k + p]) * static_cast<float>(b[p * n + j]);
          }
        }
        c[i * n + j] = s;
      }
    return make_buffer(dtype, {m, n}, c);
  }
};

enum class AllreduceVariant {
  kUnfused,     // reference: the fp32 sum is rounded to bf16, then the residual is added
  kFused,       // adds the residual to the fp32 sum before the one rounding to bf16
  kTruncating,  // fused, but truncates to bf16 instead of rounding
};

// out = sum over ranks of x_r + residual, everything in bf16, at a given magnitude.
struct AllreduceCase {
  std::size_t ranks = 4, n = 4096;
  std::vector<std::vector<double>> partial;
  std::vector<double> residual;

  AllreduceCase(std::size_t ranks_, std::size_t n_, double magnitude, std::uint64_t seed)
      : ranks(ranks_), n(n_) {
    for (std::size_t r = 0; r < ranks; ++r) {
      partial.push_back(normal_values(n, seed + r, magnitude));
      for (auto& x : partial.back()) x = round_to(DType::BF16, x);
    }
    residual = normal_values(n, seed + 1000, magnitude);
    for (auto& x : residual) x = round_to(DType::BF16, x);
  }

  Buffer truth() const {
    std::vector<double> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      double s = residual[i];
      for (const auto& p : partial) s += p[i];
      out[i] = s;
    }
    return make_buffer(DType::F64, {n}, out);
  }

  Buffer run(AllreduceVariant variant) const {
    std::vector<double> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      float s = 0;
      for (const auto& p : partial) s += static_cast<float>(p[i]);
      const auto res = static_cast<float>(residual[i]);
      switch (variant) {
        case AllreduceVariant::kUnfused:
          out[i] = round_bf16(round_bf16(s) + res);
          break;
        case AllreduceVariant::kFused:
          out[i] = round_bf16(s + res);
          break;
        case AllreduceVariant::kTruncating:
          out[i] = truncate_bf16(s + res);
          break;
      }
    }
    return make_buffer(DType::BF16, {n}, out);
  }
};

}  // namespace numalign::examples
