// layout.cpp: gathering the elements of strided and concatenated views.
#include "numalign/layout.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace numalign {

std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= static_cast<std::int64_t>(shape[i]);
  }
  return strides;
}

namespace {

// The part holding position `along` of the layout's dim, and the position within it.
std::pair<const StridedPart*, std::uint64_t> part_at(const Layout& l, std::uint64_t along) {
  std::size_t p = 0;
  while (along >= l.parts[p].extent) along -= l.parts[p++].extent;
  return {&l.parts[p], along};
}

// `n` elements of `es` bytes, `stride` bytes apart, side by side into `out`: one move per
// element for the element sizes there are (a call to memcpy each would cost more than it).
template <std::size_t kSize>
void copy_strided_as(const std::byte* src, std::int64_t stride, std::uint64_t n, std::byte* out) {
  for (std::uint64_t i = 0; i < n; ++i, src += stride, out += kSize) std::memcpy(out, src, kSize);
}

void copy_strided(const std::byte* src, std::int64_t stride, std::uint64_t n, std::size_t es,
                  std::byte* out) {
  switch (es) {
    case 1:
      return copy_strided_as<1>(src, stride, n, out);
    case 2:
      return copy_strided_as<2>(src, stride, n, out);
    case 4:
      return copy_strided_as<4>(src, stride, n, out);
    case 8:
      return copy_strided_as<8>(src, stride, n, out);
    default:
      for (std::uint64_t i = 0; i < n; ++i, src += stride) std::memcpy(out + i * es, src, es);
  }
}

}  // namespace

void copy_elements(const TensorView& v, std::uint64_t begin, std::uint64_t end, std::byte* out) {
  const std::size_t es = element_size(v.dtype);
  if (!v.layout) {
    if (end > begin) std::memcpy(out, v.data + begin * es, (end - begin) * es);
    return;
  }
  if (begin >= end) return;
  const Layout& l = *v.layout;
  // Walk the positions in C order, a run at a time: a run stays within one row of the last
  // dim and one part, so its elements are evenly spaced (contiguous for a slice).
  std::vector<std::uint64_t> index = unravel_index(v.shape, begin);
  const std::size_t last = v.shape.size() - 1;
  for (std::uint64_t at = begin; at < end;) {
    const auto [part, along] = part_at(l, index[l.dim]);
    std::uint64_t run = std::min(v.shape[last] - index[last], end - at);
    if (l.dim == last) run = std::min(run, part->extent - along);
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < index.size(); ++d)
      offset += static_cast<std::int64_t>(d == l.dim ? along : index[d]) * part->strides[d];
    const std::byte* src = part->data + offset * static_cast<std::int64_t>(es);
    const std::int64_t step = part->strides[last];
    if (step == 1) {
      std::memcpy(out, src, run * es);
    } else {
      copy_strided(src, step * static_cast<std::int64_t>(es), run, es, out);
    }
    out += run * es;
    at += run;
    index[last] += run;  // never past the row's end: carry into the outer dims
    for (std::size_t d = last; d > 0 && index[d] == v.shape[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

ContiguousView::ContiguousView(const TensorView& view) : view_(view) {
  if (!view.layout) return;
  owned_.resize(view.nbytes());
  copy_elements(view, 0, view.numel(), owned_.data());
  view_.data = owned_.data();
  view_.layout = nullptr;
}

}  // namespace numalign
