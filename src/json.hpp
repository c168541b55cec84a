// json.hpp: a minimal JSON writer whose output matches serde_json's compact form, so that
// headers we write are byte-identical to the reference serializer's.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace numalign::detail {

// How strings are written: kSerde as serde_json does (trace headers, byte for byte); reports
// also escape what a terminal acts on (DEL, C1 and bidi controls, as \u00xx / \u202e), so
// that a report printed raw stays safe and reads back the same.
enum class JsonStyle { kSerde, kTerminalSafe };

// Escapes as serde_json does: \" \\ \b \f \n \r \t, other control characters as \u00xx
// (lowercase hex); everything else, UTF-8 included, verbatim. A byte that is not part of
// valid UTF-8 (JSON must be) is written as the text \xNN, as printable() shows it.
void append_json_string(std::string& out, std::string_view s, JsonStyle style = JsonStyle::kSerde);

// A key known when the program is compiled to need no escaping in any style: printable ASCII
// other than " and \ (checked by the compiler; anything else does not compile).
struct PlainKey {
  template <std::size_t N>
  consteval PlainKey(const char (&literal)[N]) : text(literal), size(N - 1) {
    for (std::size_t i = 0; i + 1 < N; ++i) {
      const auto c = static_cast<unsigned char>(literal[i]);
      if (c < 0x20 || c >= 0x7F || c == '"' || c == '\\') throw "a key that needs escaping";
    }
  }
  const char* text;
  std::size_t size;
};

class JsonWriter {
 public:
  explicit JsonWriter(JsonStyle style = JsonStyle::kSerde) : style_(style) {}
  // A writer of array items only, separated as inside begin_array(): its text goes into an
  // array another writer holds open (raw()), so that parts of a long array can be written
  // apart, on other threads.
  static JsonWriter items(JsonStyle style) {
    JsonWriter w(style);
    w.first_.push_back(true);
    return w;
  }
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(std::string_view k) {
    separate();
    append_json_string(out_, k, style_);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  // A key written in the program (PlainKey): no escaping to look for, no length to count. A
  // report of many tensors writes tens of millions of them.
  JsonWriter& field(PlainKey k) {
    separate();
    out_ += '"';
    out_.append(k.text, k.size);
    out_.append("\":", 2);
    after_key_ = true;
    return *this;
  }
  JsonWriter& string(std::string_view s) {
    separate();
    append_json_string(out_, s, style_);
    return *this;
  }
  JsonWriter& raw(std::string_view text) {  // a number or literal already formatted
    separate();
    out_ += text;
    return *this;
  }
  JsonWriter& number(double v);  // shortest round-trip form; null for NaN and infinities
  JsonWriter& integer(unsigned long long v);
  JsonWriter& boolean(bool b) { return raw(b ? "true" : "false"); }
  JsonWriter& null() { return raw("null"); }
  void reserve(std::size_t bytes) { out_.reserve(bytes); }
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }
  // Hands over what is written so far and forgets it (the nesting is kept), so that a long
  // document goes out in pieces instead of as one string.
  template <class Sink>
  void flush_to(Sink&& sink) {
    if (out_.empty()) return;
    sink(std::string_view(out_));
    out_.clear();
  }
  // raw(text), handed to `sink` after what is pending instead of copied in.
  template <class Sink>
  void raw_to(Sink&& sink, std::string_view text) {
    separate();
    flush_to(sink);
    sink(text);
  }

 private:
  JsonWriter& open(char c) {
    separate();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    out_ += c;
    first_.pop_back();
    return *this;
  }
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  JsonStyle style_;
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace numalign::detail
