// text_test.cpp: the one escaper of every text output (C0, C1, DEL, bidi controls, invalid
// UTF-8), display widths, cutting at character boundaries, and the markup and JSON escapes that
// keep machine output well-formed for any input.
#include "numalign/text.hpp"

#include <gtest/gtest.h>

#include <string>

#include "format.hpp"
#include "json.hpp"

namespace numalign {
namespace {

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// No byte or character a terminal acts on: C0 (newline allowed), DEL, C1, bidi controls.
bool terminal_safe(const std::string& s) {
  if (!valid_utf8(s)) return false;
  for (const char* bad : {"\xc2\x80", "\xc2\x85", "\xc2\x9b", "\xc2\x9f", "\u202a", "\u202e",
                          "\u2066", "\u2069", "\u200e", "\u200f", "\u061c", "\u2028"}) {
    if (s.find(bad) != std::string::npos) return false;
  }
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n') || u == 0x7F) return false;
  }
  return true;
}

TEST(TextTest, PrintableEscapesEveryClass) {
  EXPECT_EQ(printable("layers.0.attn"), "layers.0.attn");
  EXPECT_EQ(printable("层.权重 μß 🙂"), "层.权重 μß 🙂") << "valid UTF-8 stays";
  EXPECT_EQ(printable("a\x1b[31mb"), "a\\x1b[31mb");
  EXPECT_EQ(printable("cr\rlf\ntab\t"), "cr\\x0dlf\\x0atab\\x09");
  EXPECT_EQ(printable(std::string("nul\0", 4)), "nul\\x00");
  EXPECT_EQ(printable("del\x7f"), "del\\x7f");
  EXPECT_EQ(printable("csi\u009b"), "csi\\u009b");
  EXPECT_EQ(printable("nel\u0085"), "nel\\u0085");
  EXPECT_EQ(printable("rlo\u202e"), "rlo\\u202e");
  EXPECT_EQ(printable("\u2066\u2069\u200e\u200f\u061c"), "\\u2066\\u2069\\u200e\\u200f\\u061c");
  EXPECT_EQ(printable("bad\xff\xfe"), "bad\\xff\\xfe");
  EXPECT_EQ(printable("cut\xe5\xb1"), "cut\\xe5\\xb1") << "a character cut short";
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf") << "overlong";
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "a surrogate";
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80") << "above U+10FFFF";
  // Every single byte and every pair of bytes comes out terminal-safe.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; b += (a < 0x80 ? 255 : 1)) {
      const std::string s{static_cast<char>(a), static_cast<char>(b)};
      ASSERT_TRUE(terminal_safe(printable(s))) << a << " " << b;
    }
  }
}

TEST(TextTest, WidthsAndCutsAtCharacterBoundaries) {
  EXPECT_EQ(display_width("abc"), 3u);
  EXPECT_EQ(display_width("层权"), 4u);
  EXPECT_EQ(display_width("e\u0301"), 1u) << "a combining accent takes no column";
  const std::string cjk = [] {
    std::string s;
    for (int i = 0; i < 30; ++i) s += "层";
    return s + ".权重";
  }();
  for (std::size_t width = 5; width < 80; ++width) {
    const std::string fitted = fit_columns(cjk, width);
    EXPECT_TRUE(valid_utf8(fitted)) << width;
    EXPECT_EQ(display_width(fitted), width) << width;
    const std::string cut = cut_columns(cjk, width);
    EXPECT_TRUE(valid_utf8(cut)) << width;
    EXPECT_LE(display_width(cut), width + 3) << width;
  }
  EXPECT_NE(fit_columns(cjk, 38).find(".权重"), std::string::npos) << "the tail stays";
  EXPECT_EQ(fit_columns("ab", 4), "ab  ");
  EXPECT_EQ(pad_columns("层", 4), "层  ");
  EXPECT_EQ(cut_columns("abcdef", 3), "abc...");
  EXPECT_EQ(cut_columns("abc", 3), "abc");
}

TEST(TextTest, ShortenPathDropsWholeComponentsButNeverALayerIndex) {
  const std::string hf = "grad.param.model.layers.11.self_attn.q_proj.weight";  // 50 columns
  EXPECT_EQ(shorten_path(hf, 50), hf) << "fits: as it is";
  // The prefix before the layer index goes first ("param", "model", then "layers" and the
  // first), then the submodules after it; never the index, never the last two.
  EXPECT_EQ(shorten_path(hf, 46), "grad..model.layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(shorten_path(hf, 40), "grad..layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(shorten_path(hf, 38), "grad..11.self_attn.q_proj.weight");
  EXPECT_EQ(shorten_path(hf, 32), "grad..11.self_attn.q_proj.weight");
  EXPECT_EQ(shorten_path(hf, 31), "..11.self_attn.q_proj.weight");
  EXPECT_EQ(shorten_path(hf, 27), "..11..q_proj.weight");
  EXPECT_EQ(shorten_path(hf, 19), "..11..q_proj.weight");
  // After the index, a word before another number ("in" of "in.1") before a submodule.
  EXPECT_EQ(shorten_path("model.layers.0.self_attn.in.1.position_embeddings.0", 38),
            "..0.self_attn..1.position_embeddings.0");
  // What cannot be dropped does not fit: the path comes back whole, for the caller to wrap.
  EXPECT_EQ(shorten_path(hf, 18), hf);
  const std::string call = "model.encoder.layer.3.attention.output#2.dense.out";
  const std::string cut = shorten_path(call, 30);
  EXPECT_LE(display_width(cut), 30u) << cut;
  EXPECT_NE(cut.find(".3."), std::string::npos) << cut;
  EXPECT_NE(cut.find("output#2"), std::string::npos) << cut;
  EXPECT_TRUE(cut.ends_with("dense.out")) << cut;
  // A hostile path of 100,000 components comes back whole, at once (not a cut at a time).
  std::string deep = "a";
  for (int i = 0; i < 100'000; ++i) deep += ".b";
  EXPECT_EQ(shorten_path(deep, 38), deep);
  // No dot, or two components: nothing to drop.
  EXPECT_EQ(shorten_path(std::string(50, 'x'), 10), std::string(50, 'x'));
  EXPECT_EQ(shorten_path("层层层层层层.权重", 8), "层层层层层层.权重");
}

TEST(TextTest, XmlKeepsWhatXmlCanHoldAndReplacesTheRestVisibly) {
  using detail::Markup;
  using detail::markup_escape;
  EXPECT_EQ(markup_escape("a&b<c>\"d\"'e'", Markup::kXml),
            "a&amp;b&lt;c&gt;&quot;d&quot;&apos;e&apos;");
  // Attribute whitespace as character references: a parser reads it back exactly.
  EXPECT_EQ(markup_escape("t\tl\nc\r", Markup::kXml), "t&#9;l&#10;c&#13;");
  // XML 1.0 forbids these even as references: shown as text.
  EXPECT_EQ(markup_escape("x\x01y\x1f", Markup::kXml), "x\\x01y\\x1f");
  EXPECT_EQ(markup_escape("\uFFFE\uFFFF", Markup::kXml), "\\ufffe\\uffff");
  EXPECT_EQ(markup_escape("bad\xff", Markup::kXml), "bad\\xff");
  // Allowed but acted on by terminals: references, so the file is safe to print.
  EXPECT_EQ(markup_escape("\x7f\u009b\u202e", Markup::kXml), "&#x7f;&#x9b;&#x202e;");
  EXPECT_EQ(markup_escape("μ-ß层", Markup::kXml), "μ-ß层");
  // HTML maps &#x80;-&#x9f; to other characters and bidi references still act: visible escapes.
  EXPECT_EQ(markup_escape("\u009b\u202e\x1b", Markup::kHtml), "\\u009b\\u202e\\x1b");
  EXPECT_EQ(markup_escape("a\nb\tc<", Markup::kHtml), "a\nb&#9;c&lt;");
}

TEST(TextTest, JsonStringsAreValidUtf8ForAnyBytes) {
  std::string out;
  detail::append_json_string(out, "a\xff\xfe\xe5\xb1");
  EXPECT_EQ(out, "\"a\\\\xff\\\\xfe\\\\xe5\\\\xb1\"");
  EXPECT_TRUE(valid_utf8(out));
  out.clear();
  detail::append_json_string(out, "层\u202e\u009b");
  EXPECT_EQ(out, "\"层\u202e\u009b\"") << "valid text stays serde_json's (trace headers)";
  detail::JsonWriter w(detail::JsonStyle::kTerminalSafe);
  w.string("层\u202e\u009b\x7f");
  EXPECT_EQ(w.str(), "\"层\\u202e\\u009b\\u007f\"");
}

}  // namespace
}  // namespace numalign
