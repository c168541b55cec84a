// format.cpp: number formatting shared by reports and messages.
#include "format.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace numalign::detail {

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e5) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[32];
  const double a = std::fabs(v);
  std::snprintf(buf, sizeof buf, (a >= 1e-3 && a < 1e5) ? "%.4g" : "%.3g", v);
  return buf;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

}  // namespace numalign::detail
