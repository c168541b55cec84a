// tensor_store.hpp: tensors built in a test, kept alive for as long as the test holds views.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "numalign/tensor.hpp"

namespace numalign::testing {

class TensorStore {
 public:
  // A 1-D view of a copy of `values` read as `dtype` (element size sizeof(T)).
  template <typename T>
  const TensorView* view(DType dtype, const std::vector<T>& values) {
    auto& bytes = storage_.emplace_back(values.size() * sizeof(T));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return &views_.emplace_back(
        TensorView{dtype, {static_cast<std::uint64_t>(values.size())}, bytes.data()});
  }

 private:
  std::deque<std::vector<std::byte>> storage_;  // deques: views stay valid as they grow
  std::deque<TensorView> views_;
};

}  // namespace numalign::testing
