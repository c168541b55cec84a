// json.cpp: serde_json-compatible string escaping and numbers.
#include "json.hpp"

#include <charconv>

#include "format.hpp"

namespace numalign::detail {

void append_json_string(std::string& out, std::string_view s, JsonStyle style) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  // Printable ASCII other than " and \ goes out as is: appended a run at a time, as a
  // report of a million tensors writes tens of millions of names and keys.
  const auto plain = [](unsigned char c) { return c >= 0x20 && c < 0x7F && c != '"' && c != '\\'; };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (plain(static_cast<unsigned char>(s[i]))) {
      std::size_t end = i + 1;
      while (end < s.size() && plain(static_cast<unsigned char>(s[end]))) ++end;
      out.append(s.data() + i, end - i);
      i = end - 1;
      continue;
    }
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80) {  // a multi-byte character, or a byte that is not UTF-8
      const Utf8Char u = next_char(s, i);
      if (!u.valid) {
        out += "\\\\x";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
      } else if (style == JsonStyle::kTerminalSafe &&
                 (is_control(u.cp) || is_bidi_or_separator(u.cp))) {
        append_code_point_escape(out, u.cp);
      } else {
        out.append(s.substr(i, u.len));
      }
      i += u.len - 1;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || (c == 0x7F && style == JsonStyle::kTerminalSafe)) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

JsonWriter& JsonWriter::number(double v) {
  separate();
  append_json_number(out_, v);
  return *this;
}

JsonWriter& JsonWriter::integer(unsigned long long v) {
  separate();
  char buf[24];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, res.ptr);
  return *this;
}

}  // namespace numalign::detail
