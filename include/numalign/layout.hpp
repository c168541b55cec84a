// numalign/layout.hpp: reading views whose elements are not one contiguous run (TensorView's
// layout): a range of elements copied out, or a whole tensor made contiguous for the rare
// passes that need it all at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "numalign/tensor.hpp"

namespace numalign {

// Copies elements [begin, end) of `view`, in C order, to `out` (element_size(dtype) bytes
// each); a plain memcpy for a contiguous view.
void copy_elements(const TensorView& view, std::uint64_t begin, std::uint64_t end, std::byte* out);

// The view itself when contiguous; otherwise a contiguous copy that this object owns (as
// large as the tensor: only for passes that need a whole tensor at once).
class ContiguousView {
 public:
  explicit ContiguousView(const TensorView& view);
  ContiguousView(const ContiguousView&) = delete;
  ContiguousView& operator=(const ContiguousView&) = delete;
  const TensorView& get() const { return view_; }

 private:
  std::vector<std::byte> owned_;
  TensorView view_;
};

// A contiguous tensor's C-order strides, in elements.
std::vector<std::int64_t> contiguous_strides(const Shape& shape);

}  // namespace numalign
