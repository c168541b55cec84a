// format.cpp: number formatting shared by reports and messages.
#include "format.hpp"

#include <charconv>
#include <cmath>

namespace numalign::detail {

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // std::to_chars formats as printf's %.0f / %.4g / %.3g would, without its locale and
  // format-string costs (a report formats several numbers per tensor).
  char buf[48];
  const double a = std::fabs(v);
  const auto [end, ec] = v == std::floor(v) && a < 1e5
                             ? std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 0)
                             : std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general,
                                             (a >= 1e-3 && a < 1e5) ? 4 : 3);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

std::string json_number(double v) {
  std::string s;
  append_json_number(s, v);
  return s;
}

void append_json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

std::string joined(const std::vector<std::string>& items, std::string_view separator) {
  std::string s;
  for (const auto& item : items) {
    if (!s.empty()) s += separator;
    s += item;
  }
  return s;
}

}  // namespace numalign::detail
