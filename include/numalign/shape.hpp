// numalign/shape.hpp: a tensor's dimensions, held inline up to rank 3.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace numalign {

// A vector of dimensions that needs no allocation up to rank 3 (a bias, a weight, an
// activation [batch, sequence, hidden]). A trace entry, a pair and a result each hold one: a
// million tensors judged made four million shapes, a heap allocation each when this was a
// std::vector. Ranks past 3 live on the heap, which push_back grows by doubling. Unlike a
// std::vector, moving a shape of rank 3 or less moves its dimensions: no pointer into them
// survives the move.
class Shape {
 public:
  using value_type = std::uint64_t;
  using size_type = std::size_t;
  using iterator = std::uint64_t*;
  using const_iterator = const std::uint64_t*;
  static constexpr std::size_t kInline = 3;

  Shape() noexcept : size_(0), inline_{} {}
  Shape(std::initializer_list<std::uint64_t> dims) : Shape(dims.begin(), dims.end()) {}
  // `count` dimensions of `value` each, as std::vector's (count, value).
  Shape(std::size_t count, std::uint64_t value) : Shape() {
    allocate(count);
    std::fill(begin(), end(), value);
  }
  template <std::input_iterator It>
  Shape(It first, It last) : Shape() {
    if constexpr (std::forward_iterator<It>) {
      allocate(static_cast<std::size_t>(std::distance(first, last)));
      std::copy(first, last, begin());
    } else {
      for (; first != last; ++first) push_back(*first);
    }
  }
  explicit Shape(const std::vector<std::uint64_t>& dims) : Shape(dims.begin(), dims.end()) {}
  Shape(const Shape& other) : Shape(other.begin(), other.end()) {}
  Shape(Shape&& other) noexcept : size_(other.size_), inline_{} { take(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) *this = Shape(other);
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      release();
      size_ = other.size_;
      take(other);
    }
    return *this;
  }
  ~Shape() { release(); }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::uint64_t* data() { return on_heap() ? heap_ : inline_; }
  const std::uint64_t* data() const { return on_heap() ? heap_ : inline_; }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }
  std::uint64_t& operator[](std::size_t i) { return data()[i]; }
  std::uint64_t operator[](std::size_t i) const { return data()[i]; }
  std::uint64_t& front() { return data()[0]; }
  std::uint64_t front() const { return data()[0]; }
  std::uint64_t& back() { return data()[size_ - 1]; }
  std::uint64_t back() const { return data()[size_ - 1]; }

  void push_back(std::uint64_t dim) {
    if (size_ < kInline) {
      inline_[size_++] = dim;
      return;
    }
    if (size_ == kInline || size_ == capacity_) grow(std::size_t{size_} * 2);
    heap_[size_++] = dim;
  }
  void clear() { *this = Shape(); }

  friend bool operator==(const Shape& a, const Shape& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool on_heap() const { return size_ > kInline; }
  static void check_rank(std::size_t count) {
    if (count > UINT32_MAX) throw std::length_error("a shape of more than 2^32 - 1 dimensions");
  }
  // Room for `count` dimensions in a shape that holds none.
  void allocate(std::size_t count) {
    check_rank(count);
    if (count > kInline) {
      heap_ = new std::uint64_t[count];
      capacity_ = static_cast<std::uint32_t>(count);
    }
    size_ = static_cast<std::uint32_t>(count);
  }
  // Moves the dimensions to a heap buffer of `capacity` (more than kInline).
  void grow(std::size_t capacity) {
    check_rank(capacity);
    auto* fresh = new std::uint64_t[capacity];
    std::copy(begin(), end(), fresh);
    if (on_heap()) delete[] heap_;
    heap_ = fresh;
    capacity_ = static_cast<std::uint32_t>(capacity);
  }
  // The storage of `other` (whose size this already has), leaving it empty. Inline
  // dimensions are assigned one by one, which makes inline_ the union's active member.
  void take(Shape& other) noexcept {
    if (other.on_heap()) {
      heap_ = other.heap_;
      capacity_ = other.capacity_;
    } else {
      for (std::uint32_t i = 0; i < other.size_; ++i) inline_[i] = other.inline_[i];
    }
    other.size_ = 0;
  }
  void release() noexcept {
    if (on_heap()) delete[] heap_;
    size_ = 0;
  }

  std::uint32_t size_;
  std::uint32_t capacity_ = 0;  // of the heap buffer, when on the heap
  union {
    std::uint64_t inline_[kInline];
    std::uint64_t* heap_;
  };
};

}  // namespace numalign
