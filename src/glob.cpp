// glob.cpp: globs without backtracking. A pattern is its segments between '*'s: the first is
// anchored at the start, the last at the end, and each middle one is taken at its leftmost
// occurrence after the previous (leftmost is always right: it leaves the most room to the
// rest). Occurrences are found by KMP (linear) or, for segments with '?', a bit-parallel
// shift-and over the segment's length.
#include "numalign/glob.hpp"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "format.hpp"

namespace numalign {

namespace {
constexpr std::size_t kNone = SIZE_MAX;
}  // namespace

void Glob::decode(std::string_view s, std::vector<Unit>& out, bool wildcards) {
  out.clear();
  for (std::size_t i = 0; i < s.size();) {
    const detail::Utf8Char c = detail::next_char(s, i);
    if (!c.valid) {
      out.push_back(0x110000 + static_cast<unsigned char>(s[i]));
    } else if (wildcards && c.cp == '?') {
      out.push_back(kAny);
    } else {
      out.push_back(c.cp);
    }
    i += c.len;
  }
}

Glob::Glob(std::string_view pattern) : pattern_(pattern) {
  const std::size_t first = pattern.find_first_of("*?"), last = pattern.find_last_of("*?");
  prefix_ = first == std::string_view::npos ? pattern.size() : first;
  suffix_ = last == std::string_view::npos ? pattern.size() : pattern.size() - last - 1;
  std::vector<Unit> units;
  std::size_t start = 0;
  while (true) {
    const std::size_t star = pattern.find('*', start);
    Segment seg;
    const std::string_view text = pattern.substr(
        start, star == std::string_view::npos ? std::string_view::npos : star - start);
    decode(text, seg.units, true);
    if (start > 0 && star != std::string_view::npos) {  // a middle segment
      std::string_view longest;
      for (std::size_t at = 0; at <= text.size();) {
        const std::size_t q = std::min(text.find('?', at), text.size());
        if (q - at > longest.size()) longest = text.substr(at, q - at);
        at = q + 1;
      }
      if (!longest.empty()) required_.emplace_back(longest);
    }
    seg.has_any = std::find(seg.units.begin(), seg.units.end(), kAny) != seg.units.end();
    if (!seg.has_any && !seg.units.empty()) {
      seg.failure.assign(seg.units.size(), 0);
      for (std::size_t i = 1, k = 0; i < seg.units.size(); ++i) {
        while (k && seg.units[i] != seg.units[k]) k = seg.failure[k - 1];
        if (seg.units[i] == seg.units[k]) ++k;
        seg.failure[i] = k;
      }
    }
    segments_.push_back(std::move(seg));
    if (star == std::string_view::npos) break;
    has_star_ = true;
    start = star + 1;
  }
}

bool Glob::matches_at(const Segment& seg, const std::vector<Unit>& text, std::size_t at) {
  if (at + seg.units.size() > text.size()) return false;
  for (std::size_t i = 0; i < seg.units.size(); ++i) {
    if (seg.units[i] != kAny && seg.units[i] != text[at + i]) return false;
  }
  return true;
}

std::size_t Glob::find(const Segment& seg, const std::vector<Unit>& text, std::size_t from,
                       std::size_t limit) {
  const std::size_t m = seg.units.size();
  if (m == 0) return from <= limit ? from : kNone;
  if (limit < m || limit - m < from) return kNone;
  if (!seg.has_any) {  // KMP
    for (std::size_t i = from, k = 0; i < limit; ++i) {
      while (k && text[i] != seg.units[k]) k = seg.failure[k - 1];
      if (text[i] == seg.units[k]) ++k;
      if (k == m) return i + 1 - m;
    }
    return kNone;
  }
  // Shift-and: bit j of `state` says the segment's first j + 1 units end here.
  const std::size_t words = (m + 63) / 64;
  std::unordered_map<Unit, std::vector<std::uint64_t>> masks;
  std::vector<std::uint64_t> any_mask(words, 0);
  for (std::size_t j = 0; j < m; ++j) {
    if (seg.units[j] == kAny) any_mask[j / 64] |= std::uint64_t{1} << (j % 64);
  }
  for (std::size_t j = 0; j < m; ++j) {
    if (seg.units[j] == kAny) continue;
    auto [it, fresh] = masks.try_emplace(seg.units[j], any_mask);
    it->second[j / 64] |= std::uint64_t{1} << (j % 64);
  }
  std::vector<std::uint64_t> state(words, 0);
  const std::uint64_t top = std::uint64_t{1} << ((m - 1) % 64);
  for (std::size_t i = from; i < limit; ++i) {
    const auto it = masks.find(text[i]);
    const std::vector<std::uint64_t>& mask = it == masks.end() ? any_mask : it->second;
    std::uint64_t carry = 1;
    for (std::size_t w = 0; w < words; ++w) {
      const std::uint64_t next_carry = state[w] >> 63;
      state[w] = ((state[w] << 1) | carry) & mask[w];
      carry = next_carry;
    }
    if (state[words - 1] & top) return i + 1 - m;
  }
  return kNone;
}

bool Glob::match(std::string_view name) const {
  // Cheap rejections on bytes first: most names fail on their literal prefix or suffix.
  if (name.size() < prefix_ || name.substr(0, prefix_) != literal_prefix()) return false;
  if (name.size() < suffix_ || name.substr(name.size() - suffix_) != literal_suffix()) return false;
  if (!has_star_ && prefix_ == pattern_.size()) return name.size() == pattern_.size();
  for (const std::string& r : required_) {
    if (name.find(r) == std::string_view::npos) return false;
  }
  thread_local std::vector<Unit> text;
  decode(name, text, false);
  const Segment& head = segments_.front();
  if (!has_star_) return head.units.size() == text.size() && matches_at(head, text, 0);
  const Segment& tail = segments_.back();
  if (head.units.size() + tail.units.size() > text.size()) return false;
  if (!matches_at(head, text, 0)) return false;
  const std::size_t tail_at = text.size() - tail.units.size();
  if (!matches_at(tail, text, tail_at)) return false;
  std::size_t at = head.units.size();
  for (std::size_t s = 1; s + 1 < segments_.size(); ++s) {
    const std::size_t found = find(segments_[s], text, at, tail_at);
    if (found == kNone) return false;
    at = found + segments_[s].units.size();
  }
  return true;
}

bool glob_match(std::string_view pattern, std::string_view name) {
  return Glob(pattern).match(name);
}

}  // namespace numalign
