// numalign/trace_writer.hpp: traces written atomically in the safetensors reference
// serializer's layout, and other files written atomically.
#pragma once

#include <cstdint>
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

// A trace written one tensor at a time (a model's capture), so that no tensor is held
// longer than it takes to write it: data goes to an unnamed side file beside `path` as
// tensors arrive (it vanishes with the process, whatever ends it); close() writes the header
// and the data, in the reference serializer's order, to a temporary file renamed over `path`.
// Until then, and after abort() or an error, `path` is left as it was.
class TraceStreamWriter {
 public:
  explicit TraceStreamWriter(std::string path);
  ~TraceStreamWriter();
  TraceStreamWriter(const TraceStreamWriter&) = delete;
  TraceStreamWriter& operator=(const TraceStreamWriter&) = delete;

  // Appends the tensor's bytes; throws Error on a name given twice or named __metadata__.
  void add(const std::string& name, const TensorView& view);
  void close(const std::map<std::string, std::string>* metadata = nullptr);
  void abort();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int side_ = -1;
  std::vector<NamedTensor> tensors_;  // views without data: where each lies is offsets_
  std::vector<std::uint64_t> offsets_;
  std::uint64_t size_ = 0;
};

// Writes `content` to `path` atomically (temp + fsync + rename); "-" writes to stdout, and a
// device or FIFO is written through (see AtomicFile in src/atomic_file.hpp).
void write_file_atomic(const std::string& path, std::string_view content);

// Throws Error(output, ...) naming both files when `output` exists and is the same file
// (device and inode, through any path or link) as one of `inputs`: a report or trace written
// there would destroy what it was made from. "-" and paths that do not exist pass.
void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace numalign
