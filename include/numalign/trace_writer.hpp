// numalign/trace_writer.hpp: traces written atomically in the safetensors reference
// serializer's layout, and other files written atomically.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
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
// longer than it takes to copy it: add() copies the bytes into a few staging blocks that a
// background thread writes to a temporary file beside `path`, at `header_reserve` bytes
// from its start, in arrival order; close() waits for them, writes the header in front and
// renames the file over `path`: the data is written once. The file is the reference
// serializer's layout (dtype descending, then name; the bytes write_trace writes) instead,
// rewritten from the temporary file, when the data is smaller than `reference_layout_below`,
// when the header does not fit the reserve (or the reserve passes kMaxHeaderSize, the
// readers' cap), when a tensor would start at an offset that is not a multiple of its
// element size, or when `path` is written through (a FIFO or a device, opened when the
// writer is made). Until close(), and after abort() or an error, `path` is left as it was
// and no temporary file remains.
struct StreamOptions {
  std::uint64_t header_reserve = std::uint64_t{1} << 20;  // rounded up to 4 KiB
  std::uint64_t reference_layout_below = std::uint64_t{64} << 20;
  // The staging memory (8 MiB): what a capture holds beyond the tensor being recorded.
  std::size_t staging_block_bytes = std::size_t{1} << 20;
  std::size_t staging_blocks = 8;
};

class TraceStreamWriter {
 public:
  explicit TraceStreamWriter(std::string path, StreamOptions options = {});
  ~TraceStreamWriter();
  TraceStreamWriter(const TraceStreamWriter&) = delete;
  TraceStreamWriter& operator=(const TraceStreamWriter&) = delete;

  // Copies the tensor's bytes (the caller may change them once it returns); throws Error
  // on a name given twice or named __metadata__, or when an earlier write failed.
  void add(const std::string& name, const TensorView& view);
  void close(const std::map<std::string, std::string>* metadata = nullptr);
  void abort();
  const std::string& path() const { return path_; }
  // After close(): whether the data stayed where it was first written (arrival order).
  bool written_once() const { return written_once_; }

 private:
  struct Sink;
  std::string path_;
  StreamOptions options_;
  std::unique_ptr<Sink> sink_;
  std::vector<NamedTensor> tensors_;  // views without data: where each lies is offsets_
  std::vector<std::uint64_t> offsets_;
  std::unordered_set<std::string> names_;
  std::uint64_t size_ = 0;
  bool aligned_ = true;  // every tensor starts at a multiple of its element size
  bool written_once_ = false;
};

// Writes `content` to `path` atomically (temp + fsync + rename); "-" writes to stdout, and a
// device or FIFO is written through (see AtomicFile in src/atomic_file.hpp).
void write_file_atomic(const std::string& path, std::string_view content);

// Throws Error(output, ...) naming both files when `output` exists and is the same file
// (device and inode, through any path or link) as one of `inputs`: a report or trace written
// there would destroy what it was made from. "-" and paths that do not exist pass.
void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace numalign
