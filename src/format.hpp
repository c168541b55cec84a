// format.hpp: number formatting and the markup escapes shared by reports and messages; the
// character classes behind them and behind printable() (numalign/text.hpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace numalign::detail {

// Readable: up to 4 significant digits, scientific outside [1e-3, 1e5); "nan", "inf".
std::string format_number(double v);
// Shortest text that reads back as the same double (JSON); "null" for NaN and inf.
std::string json_number(double v);
// json_number's text appended to `out` (no string of its own: a JSON report of many tensors
// writes tens of millions of numbers).
void append_json_number(std::string& out, double v);
// The items with `separator` between them ("a, b, c").
std::string joined(const std::vector<std::string>& items, std::string_view separator);

// One character of UTF-8 at s[i]: its code point and length, or valid = false and length 1
// for a byte that does not start a well-formed character (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF).
struct Utf8Char {
  char32_t cp = 0;
  std::size_t len = 1;
  bool valid = false;
};
Utf8Char next_char(std::string_view s, std::size_t i);

// C0 controls, DEL and C1 controls.
constexpr bool is_control(char32_t c) { return c < 0x20 || (c >= 0x7F && c <= 0x9F); }
// Characters that reorder or break displayed text: bidi embeddings, overrides, isolates and
// marks, and the Unicode line and paragraph separators.
constexpr bool is_bidi_or_separator(char32_t c) {
  return (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || c == 0x200E ||
         c == 0x200F || c == 0x061C || c == 0x2028 || c == 0x2029;
}
// \xNN for a byte, \uNNNN for a code point (lowercase hex), appended to `out`.
void append_byte_escape(std::string& out, unsigned char byte);
void append_code_point_escape(std::string& out, char32_t cp);

// Text for markup, & < > " ' as entities and printable() otherwise, with each language's
// limits: XML keeps every character XML 1.0 can hold (tab, newline and CR, DEL, C1 and bidi
// controls as character references, so that a parser reads attributes back exactly and the
// file prints safely) and shows those it cannot hold (other C0 controls, U+FFFE, U+FFFF,
// invalid UTF-8) as \xNN / \uNNNN; HTML keeps newlines, tab and CR as references, and shows
// every other control and bidi character as an escape (HTML maps &#x80;-&#x9f; to other
// characters, and a bidi reference would still reorder the page).
enum class Markup { kXml, kHtml };
std::string markup_escape(std::string_view s, Markup markup);

}  // namespace numalign::detail
