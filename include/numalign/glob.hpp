// numalign/glob.hpp: globs of tensor names (`*` any run of characters, `?` one character),
// compiled once and matched in time linear in the name for literal segments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace numalign {

class Glob {
 public:
  explicit Glob(std::string_view pattern);
  bool match(std::string_view name) const;
  const std::string& pattern() const { return pattern_; }
  // The bytes every matching name starts / ends with (up to the first / after the last
  // wildcard); empty when the pattern starts / ends with one.
  std::string_view literal_prefix() const { return std::string_view(pattern_).substr(0, prefix_); }
  std::string_view literal_suffix() const {
    return std::string_view(pattern_).substr(pattern_.size() - suffix_);
  }

 private:
  // Characters as units: a code point, or 0x110000 + byte for a byte that is not UTF-8, or
  // kAny for '?'. The pattern is its segments between '*'s.
  using Unit = std::uint32_t;
  static constexpr Unit kAny = 0xFFFFFFFF;
  struct Segment {
    std::vector<Unit> units;
    bool has_any = false;
    std::vector<std::size_t> failure;  // KMP failure function (segments without '?')
  };
  // The first start >= from of `seg` in text[.. limit), or SIZE_MAX.
  static std::size_t find(const Segment& seg, const std::vector<Unit>& text, std::size_t from,
                          std::size_t limit);
  static bool matches_at(const Segment& seg, const std::vector<Unit>& text, std::size_t at);
  static void decode(std::string_view s, std::vector<Unit>& out, bool wildcards);

  std::string pattern_;
  std::size_t prefix_ = 0, suffix_ = 0;  // bytes of the literal prefix / suffix
  bool has_star_ = false;
  std::vector<Segment> segments_;
  // The longest run of literal bytes of each middle segment: a name without one of them
  // cannot match (checked on bytes before the name is decoded).
  std::vector<std::string> required_;
};

// One-off match (compiles `pattern`): linear in pattern and name for literal segments, at
// most (name x segment / 64) word operations for segments with '?'.
bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace numalign
