// tensor.cpp: shapes and multi-dimensional indices as text, for messages and reports.
#include "numalign/tensor.hpp"

namespace numalign {

std::string format_shape(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<std::uint64_t> unravel_index(const Shape& shape, std::uint64_t flat) {
  std::vector<std::uint64_t> idx(shape.size());
  if (!unravel_index_into(shape, flat, idx)) return {};
  return idx;
}

bool unravel_index_into(const Shape& shape, std::uint64_t flat, std::span<std::uint64_t> out) {
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return false;
    out[i] = flat % shape[i];
    flat /= shape[i];
  }
  return true;
}

std::string format_index(const Shape& shape, std::uint64_t flat) {
  const std::vector<std::uint64_t> idx = unravel_index(shape, flat);
  std::string s = "(";
  for (std::size_t i = 0; i < idx.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(idx[i]);
  }
  if (idx.size() == 1) s += ",";
  return s + ")";
}

}  // namespace numalign
