// fingerprint_test.cpp: equal tensors fingerprint alike; a bit, the dtype or the shape apart
// fingerprint apart; the algorithm is named, so that older fingerprints are not compared.
#include "numalign/fingerprint.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace numalign {
namespace {

TEST(FingerprintTest, EqualTensorsAlikeAnyDifferenceApart) {
  std::vector<float> a(100000, 0.25f), b = a;
  const auto* pa = reinterpret_cast<const std::byte*>(a.data());
  const auto* pb = reinterpret_cast<const std::byte*>(b.data());
  const std::string fa = fingerprint(TensorView{DType::F32, {100000}, pa});
  EXPECT_EQ(fa.rfind("xxh3-128:", 0), 0u) << fa;
  EXPECT_EQ(fa.size(), 9u + 32u);
  EXPECT_EQ(fingerprint(TensorView{DType::F32, {100000}, pb}), fa);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &b[77777], 4);
  bits ^= 1;  // one ulp
  std::memcpy(&b[77777], &bits, 4);
  EXPECT_NE(fingerprint(TensorView{DType::F32, {100000}, pb}), fa);
  EXPECT_NE(fingerprint(TensorView{DType::F32, {1000, 100}, pa}), fa) << "the shape counts";
  EXPECT_NE(fingerprint(TensorView{DType::I32, {100000}, pa}), fa) << "the dtype counts";
  EXPECT_EQ(fingerprint_algorithm(fa), "xxh3-128");
  EXPECT_EQ(fingerprint_algorithm("sha256:0123"), "sha256");
  EXPECT_EQ(fingerprint_algorithm("no colon"), "");
}

}  // namespace
}  // namespace numalign
