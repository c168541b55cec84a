// tensor_test.cpp: a view's size, and shapes and indices as text.
#include "numalign/tensor.hpp"

#include <gtest/gtest.h>

namespace numalign {
namespace {

TEST(TensorTest, FormatIndexIsMultiDimensional) {
  EXPECT_EQ(format_index({2, 3, 4}, 23), "(1, 2, 3)");
  EXPECT_EQ(format_index({5}, 4), "(4,)");
  EXPECT_EQ(format_index({}, 0), "()");
  EXPECT_EQ(format_shape({2, 3}), "[2, 3]");
}

TEST(TensorTest, UnravelIndexIsCOrder) {
  EXPECT_EQ(unravel_index({2, 3, 4}, 0), (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(unravel_index({2, 3, 4}, 4), (std::vector<std::uint64_t>{0, 1, 0}));
  EXPECT_EQ(unravel_index({2, 3, 4}, 13), (std::vector<std::uint64_t>{1, 0, 1}));
  EXPECT_TRUE(unravel_index({}, 0).empty()) << "a scalar has no index";
  EXPECT_TRUE(unravel_index({3, 0}, 0).empty()) << "an empty tensor has no element";
  EXPECT_EQ(format_index({3, 0}, 0), "()");
}

TEST(TensorTest, SizesAndShapeText) {
  const TensorView scalar{DType::F32, {}, nullptr};
  EXPECT_EQ(scalar.numel(), 1u);
  EXPECT_EQ(scalar.nbytes(), 4u);
  const TensorView packed{DType::F8_E4M3, {3, 5}, nullptr};
  EXPECT_EQ(packed.numel(), 15u);
  EXPECT_EQ(packed.nbytes(), 15u);
  EXPECT_EQ(TensorView({DType::BF16, {4, 0, 2}, nullptr}).nbytes(), 0u);
  EXPECT_EQ(format_shape({}), "[]");
  EXPECT_EQ(format_shape({7}), "[7]");
}

}  // namespace
}  // namespace numalign
