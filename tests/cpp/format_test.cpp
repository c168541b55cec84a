// format_test.cpp: numbers for people (4 significant digits) and for JSON (shortest round
// trip); markup escaping is tested with the escaper in text_test.cpp.
#include "format.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace numalign::detail {
namespace {

TEST(FormatTest, NumbersForPeople) {
  EXPECT_EQ(format_number(3.0), "3");
  EXPECT_EQ(format_number(-12.0), "-12");
  EXPECT_EQ(format_number(99999.0), "99999");
  EXPECT_EQ(format_number(4.5), "4.5");
  EXPECT_EQ(format_number(1.23456), "1.235");
  EXPECT_EQ(format_number(0.001), "0.001");
  // Outside [1e-3, 1e5): three significant digits, scientific.
  EXPECT_EQ(format_number(1e5), "1e+05");
  EXPECT_EQ(format_number(123456.7), "1.23e+05");
  EXPECT_EQ(format_number(1.2345e-5), "1.23e-05");
  EXPECT_EQ(format_number(std::nan("")), "nan");
  EXPECT_EQ(format_number(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(FormatTest, JsonNumbersReadBackExactly) {
  EXPECT_EQ(json_number(0.1), "0.1");
  EXPECT_EQ(json_number(5.0), "5");
  EXPECT_EQ(json_number(std::nan("")), "null");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::infinity()), "null");
  for (double v : {1.0 / 3, 1e300, -2.5e-310, 0x1.fffffffffffffp1023, 6.02214076e23}) {
    const std::string s = json_number(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
  }
}

}  // namespace
}  // namespace numalign::detail
