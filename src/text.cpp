// text.cpp: the one escaper of every text output (printable, markup), display widths, and
// cutting text to columns between characters.
#include "numalign/text.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "format.hpp"

namespace numalign {
namespace detail {

Utf8Char next_char(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  std::size_t len;
  char32_t cp, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {};
  }
  if (i + len > s.size()) return {};
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, len, true};
}

void append_byte_escape(std::string& out, unsigned char byte) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", byte);
  out += buf;
}

void append_code_point_escape(std::string& out, char32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
  out += buf;
}

namespace {

void append_reference(std::string& out, char32_t cp, bool hex) {
  char buf[16];
  std::snprintf(buf, sizeof buf, hex ? "&#x%x;" : "&#%u;", static_cast<unsigned>(cp));
  out += buf;
}

// Appends printable()'s form of one character (valid or not) and returns whether it escaped.
bool append_escaped(std::string& out, std::string_view s, std::size_t i, const Utf8Char& c) {
  if (!c.valid) {
    append_byte_escape(out, static_cast<unsigned char>(s[i]));
  } else if (c.cp < 0x20 || c.cp == 0x7F) {
    append_byte_escape(out, static_cast<unsigned char>(c.cp));
  } else if (is_control(c.cp) || is_bidi_or_separator(c.cp)) {
    append_code_point_escape(out, c.cp);
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::string markup_escape(std::string_view s, Markup markup) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const Utf8Char c = next_char(s, i);
    switch (c.valid ? c.cp : 0xFFFFFFFF) {
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
      case '\n':
        if (markup == Markup::kHtml) {
          out += '\n';
          break;
        }
        [[fallthrough]];
      case '\t':
      case '\r':
        append_reference(out, c.cp, false);
        break;
      case 0xFFFE:
      case 0xFFFF:
        if (markup == Markup::kXml) {
          append_code_point_escape(out, c.cp);
          break;
        }
        [[fallthrough]];
      default:
        if (markup == Markup::kXml && c.valid && c.cp >= 0x7F &&
            (is_control(c.cp) || is_bidi_or_separator(c.cp))) {
          append_reference(out, c.cp, true);
        } else if (!append_escaped(out, s, i, c)) {
          out.append(s.substr(i, c.len));
        }
    }
    i += c.len;
  }
  return out;
}

}  // namespace detail

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const detail::Utf8Char c = detail::next_char(s, i);
    if (!detail::append_escaped(out, s, i, c)) out.append(s.substr(i, c.len));
    i += c.len;
  }
  return out;
}

namespace {

// Columns of one code point (a compact wcwidth: the East Asian wide and fullwidth blocks and
// the emoji planes are 2, combining marks and zero-width characters 0).
std::size_t columns(char32_t c) {
  if ((c >= 0x0300 && c <= 0x036F) || (c >= 0x1AB0 && c <= 0x1AFF) ||
      (c >= 0x1DC0 && c <= 0x1DFF) || (c >= 0x20D0 && c <= 0x20FF) ||
      (c >= 0xFE20 && c <= 0xFE2F) || (c >= 0x200B && c <= 0x200F) || c == 0xFEFF ||
      (c >= 0xFE00 && c <= 0xFE0F)) {
    return 0;
  }
  if ((c >= 0x1100 && c <= 0x115F) || (c >= 0x2E80 && c <= 0x303E) ||
      (c >= 0x3041 && c <= 0x33FF) || (c >= 0x3400 && c <= 0x4DBF) ||
      (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xA000 && c <= 0xA4CF) ||
      (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xF900 && c <= 0xFAFF) ||
      (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF00 && c <= 0xFF60) ||
      (c >= 0xFFE0 && c <= 0xFFE6) || (c >= 0x1F300 && c <= 0x1F64F) ||
      (c >= 0x1F900 && c <= 0x1F9FF) || (c >= 0x20000 && c <= 0x3FFFD)) {
    return 2;
  }
  return 1;
}

struct Piece {
  std::size_t begin, len, cols;
};

std::vector<Piece> pieces(std::string_view s) {
  std::vector<Piece> out;
  for (std::size_t i = 0; i < s.size();) {
    const detail::Utf8Char c = detail::next_char(s, i);
    out.push_back({i, c.len, c.valid ? columns(c.cp) : 1});
    i += c.len;
  }
  return out;
}

}  // namespace

std::size_t display_width(std::string_view s) {
  std::size_t w = 0;
  for (const Piece& p : pieces(s)) w += p.cols;
  return w;
}

std::string pad_columns(std::string_view s, std::size_t width) {
  const std::size_t w = display_width(s);
  std::string out(s);
  if (w < width) out.append(width - w, ' ');
  return out;
}

std::string fit_columns(std::string_view s, std::size_t width) {
  const std::vector<Piece> ps = pieces(s);
  std::size_t total = 0;
  for (const Piece& p : ps) total += p.cols;
  if (total <= width) return pad_columns(s, width);
  if (width < 4) {  // no room for "...": the head alone
    std::size_t w = 0, end = 0;
    for (const Piece& p : ps) {
      if (w + p.cols > width) break;
      w += p.cols;
      end = p.begin + p.len;
    }
    return pad_columns(s.substr(0, end), width);
  }
  const std::size_t tail_cols = (width - 3) * 2 / 3, head_cols = width - 3 - tail_cols;
  std::size_t head_end = 0, head_w = 0;  // characters of the head: [0, head_end)
  while (head_end < ps.size() && head_w + ps[head_end].cols <= head_cols)
    head_w += ps[head_end++].cols;
  std::size_t tail_begin = ps.size(), tail_w = 0;  // characters of the tail: [tail_begin, end)
  while (tail_begin > head_end && tail_w + ps[tail_begin - 1].cols <= tail_cols)
    tail_w += ps[--tail_begin].cols;
  std::string out(s.substr(0, head_end ? ps[head_end - 1].begin + ps[head_end - 1].len : 0));
  out += "...";
  // A wide character that did not fit leaves a column: fill it so rows stay aligned.
  out.append(width - 3 - head_w - tail_w, ' ');
  if (tail_begin < ps.size()) out.append(s.substr(ps[tail_begin].begin));
  return out;
}

std::string shorten_path(std::string_view s, std::size_t width) {
  if (display_width(s) <= width) return std::string(s);
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? s.npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  const std::size_t n = parts.size();
  // Each cut renders the path again: beyond a few hundred components (no module is that
  // deep), the path as it is.
  if (n > 256) return std::string(s);
  auto has_digit = [](std::string_view p) {
    return std::any_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  // Which components go first: the prefix before the first number (a layer index) goes
  // before what follows it, which names the submodule: "param", "model", then "layers" (the
  // word before the number), then the first component; after the number, a word before
  // another number ("in" of "in.1"), then the submodules' names, left to right. The last two
  // stay.
  std::size_t first_digit = n;
  for (std::size_t i = 0; i < n && first_digit == n; ++i) {
    if (has_digit(parts[i])) first_digit = i;
  }
  std::vector<std::pair<int, std::size_t>> order;
  for (std::size_t i = 0; i + 2 < n; ++i) {
    if (has_digit(parts[i])) continue;
    const bool before_digit = has_digit(parts[i + 1]);
    const int tier = i > first_digit ? (before_digit ? 3 : 4) : i == 0 ? 2 : before_digit ? 1 : 0;
    order.push_back({tier, i});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<bool> dropped(n, false);
  auto render = [&] {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
      if (dropped[i]) {
        if (i == 0 || !dropped[i - 1]) out += "..";
        continue;
      }
      if (i > 0 && !dropped[i - 1]) out += '.';
      out += parts[i];
    }
    return out;
  };
  for (const auto& [tier, i] : order) {
    dropped[i] = true;
    std::string out = render();
    if (display_width(out) <= width) return out;
  }
  return std::string(s);
}

std::string cut_columns(std::string_view s, std::size_t width) {
  std::size_t w = 0, end = 0;
  for (const Piece& p : pieces(s)) {
    if (w + p.cols > width) return std::string(s.substr(0, end)) + "...";
    w += p.cols;
    end = p.begin + p.len;
  }
  return std::string(s);
}

}  // namespace numalign
