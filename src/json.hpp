// json.hpp: a minimal JSON writer whose output matches serde_json's compact form, so that
// headers we write are byte-identical to the reference serializer's.
#pragma once

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

class JsonWriter {
 public:
  explicit JsonWriter(JsonStyle style = JsonStyle::kSerde) : style_(style) {}
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
  JsonWriter& number(double v);
  JsonWriter& integer(unsigned long long v) { return raw(std::to_string(v)); }
  JsonWriter& boolean(bool b) { return raw(b ? "true" : "false"); }
  JsonWriter& null() { return raw("null"); }
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }
  // Hands over what is written so far and forgets it (the nesting is kept), so that a long
  // document goes out in pieces instead of as one string.
  template <class Sink>
  void flush_to(Sink&& sink) {
    sink(std::string_view(out_));
    out_.clear();
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
