// exact_rmse_test.cpp: the big naturals, exact sums of squares (beyond float64's range and
// below its subnormals), and same()'s rmse inequality decided exactly on its line.
#include "exact_rmse.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

namespace numalign::detail {
namespace {

TensorView f64_view(const std::vector<double>& v) {
  return {DType::F64, {v.size()}, reinterpret_cast<const std::byte*>(v.data())};
}

TEST(NaturalTest, ArithmeticAcrossLimbs) {
  const Natural two64 = Natural(1) << 64;
  Natural a = two64;
  a += Natural(3);
  Natural b = two64;
  b += Natural(5);
  // (2^64 + 3)(2^64 + 5) = 2^128 + 8 * 2^64 + 15.
  Natural want = Natural(1) << 128;
  want += Natural(8) << 64;
  want += Natural(15);
  EXPECT_EQ(a * b, want);
  // A borrow through a zero limb: 2^128 - 1 is two limbs of ones.
  Natural c = Natural(1) << 128;
  c -= Natural(1);
  EXPECT_EQ(c, Natural::from_parts(~0ull, ~0ull, 0));
  EXPECT_LT(c, Natural(1) << 128);
  EXPECT_GT(c, Natural(~0ull));
  c -= c;
  EXPECT_TRUE(c.is_zero());
  // Shifts by a non-multiple of 64 carry bits into the next limb.
  EXPECT_EQ(Natural::from_parts(1, 0x8000000000000000ull, 1), Natural(3) << 64);
  EXPECT_EQ(Natural(5) << 1000, (Natural(5) << 500) << 500);
}

TEST(ExactSquaresTest, SumsWhatFloat64CannotHold) {
  // (0 - 2^60)^2 + (0 - 1)^2 = 2^120 + 1: float64 drops the 1.
  const std::vector<double> truth{0.0, 0.0}, test{0x1p60, 1.0}, ref{0.0, 0.0};
  const ExactSquares s = exact_squares(f64_view(test), f64_view(ref), f64_view(truth));
  Natural want = Natural(1) << (2148 + 120);
  want += Natural(1) << 2148;
  EXPECT_EQ(s.test, want);
  EXPECT_TRUE(s.ref.is_zero());
  EXPECT_EQ(s.n, 2u);
  // The least subnormal squared is the unit; the largest double's square overflows float64
  // but not the sum: DBL_MAX = (2^53 - 1) 2^971, squared (2^53 - 1)^2 2^1942.
  const std::vector<double> small_big{0x1p-1074, DBL_MAX}, big{0.0, -DBL_MAX};
  const ExactSquares t = exact_squares(f64_view(small_big), f64_view(big), f64_view(truth));
  const Natural top = Natural((1ull << 53) - 1) * Natural((1ull << 53) - 1);
  Natural want_test = top << (1942 + 2148);
  want_test += Natural(1);
  EXPECT_EQ(t.test, want_test);
  EXPECT_EQ(t.ref, top << (1942 + 2148));
  // Opposite signs: (1 - (-3))^2 = 16, built from 1 + 9 + 2 * 3 (the cross term added).
  const std::vector<double> one{1.0}, minus3{-3.0}, three{3.0};
  EXPECT_EQ(exact_squares(f64_view(minus3), f64_view(three), f64_view(one)).test, Natural(16)
                                                                                      << 2148);
  EXPECT_EQ(exact_squares(f64_view(minus3), f64_view(three), f64_view(one)).ref, Natural(4)
                                                                                     << 2148);
}

ExactSquares squares(double test_error, double ref_error, std::uint64_t n) {
  const std::vector<double> zero(n, 0.0), t(n, test_error), r(n, ref_error);
  return exact_squares(f64_view(t), f64_view(r), f64_view(zero));
}

// sqrt(se/n) <= m sqrt(sb/n) + tol/10, equality included.
TEST(RmseInequalityTest, EqualityHoldsAndTheNextDoubleDoesNot) {
  // tol 0: error 0.5 against 2 x baseline 0.25, over 4096 elements.
  EXPECT_TRUE(rmse_inequality_holds(squares(0.5, 0.25, 4096), 2.0, 0.0));
  EXPECT_FALSE(rmse_inequality_holds(squares(std::nextafter(0.5, 1.0), 0.25, 4096), 2.0, 0.0));
  // Baseline 0: error against tol/10 alone. tol 2^-3 / 10 * 10 = 2^-3 at tol 1.25.
  EXPECT_TRUE(rmse_inequality_holds(squares(0.125, 0.0, 7), 3.0, 1.25));
  EXPECT_FALSE(rmse_inequality_holds(squares(std::nextafter(0.125, 1.0), 0.0, 7), 3.0, 1.25));
  // Both terms: 3 x 0.25 + 2.5 / 10 = 1 exactly.
  EXPECT_TRUE(rmse_inequality_holds(squares(1.0, 0.25, 3), 3.0, 2.5));
  EXPECT_FALSE(rmse_inequality_holds(squares(std::nextafter(1.0, 2.0), 0.25, 3), 3.0, 2.5));
  EXPECT_TRUE(rmse_inequality_holds(squares(std::nextafter(1.0, 0.0), 0.25, 3), 3.0, 2.5));
}

// tol / 10 is the real tenth: 0.1 (the double, 0.1000000000000000055...) is above 1.0 / 10,
// though float64 says 0.1 <= 1.0 / 10.0.
TEST(RmseInequalityTest, TheTenthIsExact) {
  EXPECT_FALSE(rmse_inequality_holds(squares(0.1, 0.0, 1), 3.0, 1.0));
  EXPECT_TRUE(rmse_inequality_holds(squares(std::nextafter(0.1, 0.0), 0.0, 1), 3.0, 1.0));
  // Over many elements the same: sqrt(n 0.1^2 / n).
  EXPECT_FALSE(rmse_inequality_holds(squares(0.1, 0.0, 1000), 2.0, 1.0));
}

// Where float64 rounds the bound up past the error: 3 x 0.0006229016948897019 + 1e-3 / 10
// rounds to 0.0019687050846691058, which exceeds the exact bound by 4.3e-20.
TEST(RmseInequalityTest, DecidesWhereFloat64RoundingWould) {
  const double b = 0.0006229016948897019, e = 0.0019687050846691058;
  ASSERT_TRUE(e <= 3.0 * b + 1e-3 / 10.0);
  EXPECT_FALSE(rmse_inequality_holds(squares(e, b, 1), 3.0, 1e-3));
  EXPECT_TRUE(rmse_inequality_holds(squares(std::nextafter(e, 0.0), b, 1), 3.0, 1e-3));
  EXPECT_FALSE(rmse_verdict_certain(e, 3.0 * b + 1e-3 / 10.0, 3.0));
}

TEST(RmseInequalityTest, CertainAwayFromTheLineOnly) {
  EXPECT_TRUE(rmse_verdict_certain(1.0, 1.0 + 1e-9, 2.0));
  EXPECT_TRUE(rmse_verdict_certain(1.0 + 1e-9, 1.0, 2.0));
  EXPECT_FALSE(rmse_verdict_certain(1.0, 1.0 + 1e-13, 2.0));
  EXPECT_FALSE(rmse_verdict_certain(1.0, 1.0, 2.0));
  EXPECT_FALSE(rmse_verdict_certain(INFINITY, INFINITY, 2.0));  // overflowed sums
  EXPECT_FALSE(rmse_verdict_certain(0.0, 1e-170, 2.0));         // underflow's reach
  EXPECT_TRUE(rmse_verdict_certain(0.0, 1e-100, 2.0));
}

}  // namespace
}  // namespace numalign::detail
