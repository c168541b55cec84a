// json_test.cpp: strings escaped as serde_json escapes them (headers we write must be
// byte-identical to the reference's), and the writer's compact layout.
#include "json.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <limits>
#include <string>

namespace numalign::detail {
namespace {

std::string escaped(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

TEST(JsonTest, EscapesAsSerdeJson) {
  EXPECT_EQ(escaped("plain"), "\"plain\"");
  EXPECT_EQ(escaped("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(escaped("\b\f\n\r\t"), "\"\\b\\f\\n\\r\\t\"");
  // Other control characters as \u00xx in lower case; DEL, '/' and UTF-8 verbatim.
  EXPECT_EQ(escaped(std::string("\x00\x01\x1f", 3)), "\"\\u0000\\u0001\\u001f\"");
  EXPECT_EQ(escaped("\x7f/é"), "\"\x7f/é\"");
}

TEST(JsonTest, EveryByteStringReadsBack) {
  std::string all;
  for (int c = 1; c < 0x80; ++c) all += static_cast<char>(c);
  all += "naïve";
  simdjson::dom::parser parser;
  std::string_view back;
  ASSERT_FALSE(parser.parse(escaped(all)).get(back));
  EXPECT_EQ(back, all);
}

TEST(JsonTest, WriterIsCompactWithSeparatorsOnlyBetweenItems) {
  JsonWriter w;
  w.begin_object();
  w.key("a").integer(1);
  w.key("b").begin_array().number(1.5).boolean(true).null().string("x").end_array();
  w.key("c").begin_object().end_object();
  w.key("d").begin_array().end_array();
  w.key("e").raw("-0.25");
  w.end_object();
  EXPECT_EQ(w.str(), R"({"a":1,"b":[1.5,true,null,"x"],"c":{},"d":[],"e":-0.25})");
  EXPECT_EQ(w.take(), R"({"a":1,"b":[1.5,true,null,"x"],"c":{},"d":[],"e":-0.25})");
  JsonWriter nan;
  nan.begin_array().number(std::numeric_limits<double>::quiet_NaN()).end_array();
  EXPECT_EQ(nan.str(), "[null]");
}

}  // namespace
}  // namespace numalign::detail
