// numalign/trace_writer.hpp: traces written atomically in the safetensors reference
// serializer's layout, and other files written atomically.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "numalign/tensor.hpp"

namespace numalign {

struct NamedTensor {
  std::string name;
  TensorView view;
};

// The header bytes the reference serializer would write (padded to 8) for these tensors:
// ordered by dtype descending then name, offsets back to back, `__metadata__` first.
std::string serialize_header(const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>* metadata);
// Writes a trace atomically (temporary file in the same folder, fsync, rename).
// Throws Error naming the path; never leaves a partial file under `path`.
void write_trace(const std::string& path, const std::vector<NamedTensor>& tensors,
                 const std::map<std::string, std::string>* metadata = nullptr);

// Writes `content` to `path` atomically (temp + fsync + rename); "-" writes to stdout.
void write_file_atomic(const std::string& path, std::string_view content);

}  // namespace numalign
