// numalign/gtest.hpp: EXPECT_ALIGNED / ASSERT_ALIGNED for GoogleTest, on tensor views or
// spans of float, double, bf16 and fp16, printing numalign's report on failure.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "numalign/judge.hpp"
#include "numalign/report.hpp"

namespace numalign {

// Raw 16-bit storage types, so spans of kernel outputs can be judged without a half library.
struct bfloat16_bits {
  std::uint16_t bits;
};
struct float16_bits {
  std::uint16_t bits;
};

namespace gtest_detail {

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, bfloat16_bits>)
    return DType::BF16;
  else {
    static_assert(std::is_same_v<T, float16_bits>, "EXPECT_ALIGNED: unsupported element type");
    return DType::F16;
  }
}

inline TensorView as_view(const TensorView& v) { return v; }
template <class T>
TensorView as_view(std::span<const T> s) {
  return TensorView{dtype_of<T>(), {s.size()}, reinterpret_cast<const std::byte*>(s.data())};
}
template <class T>
TensorView as_view(std::span<T> s) {
  return as_view(std::span<const T>(s));
}
template <class T>
TensorView as_view(const std::vector<T>& v) {
  return as_view(std::span<const T>(v));
}

template <class A, class B, class C>
::testing::AssertionResult assert_aligned(const char* test_expr, const char* ref_expr,
                                          const char* truth_expr, const A& test, const B& ref,
                                          const C& truth) {
  const TensorView t = as_view(test), r = as_view(ref), u = as_view(truth);
  const Report report = judge_tensors({{test_expr, &t, &r, &u}}, JudgeOptions{});
  if (report.aligned()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << test_expr << " is not aligned with " << ref_expr << " (truth " << truth_expr << ")\n"
         << render_text(report);
}

}  // namespace gtest_detail
}  // namespace numalign

#define EXPECT_ALIGNED(test, ref, truth) \
  EXPECT_PRED_FORMAT3(::numalign::gtest_detail::assert_aligned, test, ref, truth)
#define ASSERT_ALIGNED(test, ref, truth) \
  ASSERT_PRED_FORMAT3(::numalign::gtest_detail::assert_aligned, test, ref, truth)
