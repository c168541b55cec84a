// format.cpp: number formatting shared by reports and messages.
#include "format.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

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
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

// XML 1.0 cannot carry most control characters even escaped, and HTML text should not:
// they are shown as \xNN, as the text report shows them.
std::string markup_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (u < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", u);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace numalign::detail
