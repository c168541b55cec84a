// json.hpp: a minimal JSON writer whose output matches serde_json's compact form, so that
// headers we write are byte-identical to the reference serializer's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace numalign::detail {

// Escapes as serde_json does: \" \\ \b \f \n \r \t, other control characters as \u00xx
// (lowercase hex); everything else, UTF-8 included, verbatim.
void append_json_string(std::string& out, std::string_view s);

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(std::string_view k) {
    separate();
    append_json_string(out_, k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& string(std::string_view s) {
    separate();
    append_json_string(out_, s);
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
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace numalign::detail
