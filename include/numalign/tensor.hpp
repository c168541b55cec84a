// numalign/tensor.hpp: a non-owning view of one tensor's bytes (a trace entry, a buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "numalign/dtype.hpp"
#include "numalign/shape.hpp"

namespace numalign {

// Where the elements of a view that is not one contiguous run of bytes lie: parts side by
// side along `dim` (the pieces of a fused tensor, the shards of tensor-parallel ranks), each
// read through its own strides (a slice, a transpose). Nothing is copied to make one.
struct StridedPart {
  const std::byte* data = nullptr;    // this part's element (0, ..., 0)
  std::vector<std::int64_t> strides;  // in elements, one per dim of the view
  std::uint64_t extent = 0;           // its size along the layout's dim
};
struct Layout {
  std::size_t dim = 0;
  std::vector<StridedPart> parts;  // in order along dim; extents add up to shape[dim]
};

struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  const std::byte* data = nullptr;  // numel() elements, little-endian, C order
  // Set for a view whose elements are not contiguous (then data is null): read them with
  // copy_elements() or contiguous() (layout.hpp).
  const Layout* layout = nullptr;

  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    return n;
  }
  std::uint64_t nbytes() const { return numel() * static_cast<std::uint64_t>(bits(dtype)) / 8; }
};

// "[2, 3]" for messages and reports.
std::string format_shape(const Shape& shape);
// Multi-dimensional index of a flat C-order position; empty for scalars and empty tensors.
std::vector<std::uint64_t> unravel_index(const Shape& shape, std::uint64_t flat);
// The same into out[0, shape.size()) (out must hold that many), for callers that format many
// indices; false for an empty tensor, whose index has no entries.
bool unravel_index_into(const Shape& shape, std::uint64_t flat, std::span<std::uint64_t> out);
// The same as text: "(1, 2)", "(4,)"; "()" for scalars.
std::string format_index(const Shape& shape, std::uint64_t flat);

}  // namespace numalign
