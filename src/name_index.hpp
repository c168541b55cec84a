// name_index.hpp: names -> positions in a vector of named entries, as one open-addressing
// table of positions. A trace can name hundreds of thousands of tensors: a node-based map
// costs an allocation (and a page touched) per name, and a second copy of every name.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace numalign::detail {

// A slot holds 0 (empty) or (hash tag << 32) | (position + 1); the tag spares most string
// compares. Names are read from the entries themselves, through name_of(position), so the
// table never dangles when the entries' vector moves or grows.
class NameIndex {
 public:
  // Adds position `pos`, whose name is name_of(pos). Returns the position already holding
  // that name (nothing is added then), or nullopt.
  template <class NameOf>
  std::optional<std::uint32_t> insert(std::uint32_t pos, const NameOf& name_of) {
    if ((count_ + 1) * 2 > slots_.size()) grow(name_of);
    const std::string_view name = name_of(pos);
    const std::uint64_t h = hash(name);
    for (std::size_t s = h & mask();; s = (s + 1) & mask()) {
      const std::uint64_t slot = slots_[s];
      if (slot == 0) {
        slots_[s] = tagged(h, pos);
        ++count_;
        return std::nullopt;
      }
      if (tag(slot) == tag_of(h) && name_of(position(slot)) == name) return position(slot);
    }
  }

  // Room for `count` names in all, so that adding them never grows the table midway.
  template <class NameOf>
  void reserve(std::size_t count, const NameOf& name_of) {
    while (count * 2 > slots_.size()) grow(name_of);
  }

  template <class NameOf>
  std::optional<std::uint32_t> find(std::string_view name, const NameOf& name_of) const {
    if (slots_.empty()) return std::nullopt;
    const std::uint64_t h = hash(name);
    for (std::size_t s = h & mask();; s = (s + 1) & mask()) {
      const std::uint64_t slot = slots_[s];
      if (slot == 0) return std::nullopt;
      if (tag(slot) == tag_of(h) && name_of(position(slot)) == name) return position(slot);
    }
  }

 private:
  static std::uint64_t hash(std::string_view name) { return std::hash<std::string_view>{}(name); }
  static std::uint32_t tag_of(std::uint64_t h) { return static_cast<std::uint32_t>(h >> 32); }
  static std::uint32_t tag(std::uint64_t slot) { return static_cast<std::uint32_t>(slot >> 32); }
  static std::uint32_t position(std::uint64_t slot) { return static_cast<std::uint32_t>(slot) - 1; }
  static std::uint64_t tagged(std::uint64_t h, std::uint32_t pos) {
    return std::uint64_t{tag_of(h)} << 32 | (std::uint64_t{pos} + 1);
  }
  std::size_t mask() const { return slots_.size() - 1; }

  // Doubles the table (at least 16 slots) and puts every entry back.
  template <class NameOf>
  void grow(const NameOf& name_of) {
    std::vector<std::uint64_t> old(std::bit_ceil(std::max<std::size_t>(16, slots_.size() * 2)));
    old.swap(slots_);
    for (const std::uint64_t slot : old) {
      if (slot == 0) continue;
      std::size_t s = hash(name_of(position(slot))) & mask();
      while (slots_[s] != 0) s = (s + 1) & mask();
      slots_[s] = slot;
    }
  }

  std::vector<std::uint64_t> slots_;
  std::size_t count_ = 0;
};

}  // namespace numalign::detail
