// trace_writer.cpp: traces in the safetensors reference serializer's layout, written atomically.
#include "numalign/trace_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

#include "atomic_file.hpp"
#include "background_appender.hpp"
#include "json.hpp"
#include "numalign/error.hpp"
#include "numalign/trace.hpp"

namespace numalign {

namespace {

// The reference serializer's order: dtype descending (enum order), then name.
std::vector<const NamedTensor*> serialization_order(const std::vector<NamedTensor>& tensors) {
  std::vector<const NamedTensor*> order;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") fail(t.name, "a tensor cannot be named __metadata__");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    if (a->view.dtype != b->view.dtype) return a->view.dtype > b->view.dtype;
    return a->name < b->name;
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i]->name == order[i - 1]->name && order[i]->view.dtype == order[i - 1]->view.dtype) {
      fail(order[i]->name, "tensor name given twice");
    }
  }
  return order;
}

std::string header_for(const std::vector<const NamedTensor*>& order,
                       const std::map<std::string, std::string>* metadata) {
  detail::JsonWriter w;
  w.begin_object();
  if (metadata) {
    w.key("__metadata__").begin_object();
    for (const auto& [k, v] : *metadata) w.key(k).string(v);
    w.end_object();
  }
  std::uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    w.key(t->name).begin_object();
    w.key("dtype").string(name(t->view.dtype));
    w.key("shape").begin_array();
    for (auto d : t->view.shape) w.integer(d);
    w.end_array();
    const std::uint64_t nb = t->view.nbytes();
    w.key("data_offsets").begin_array().integer(offset).integer(offset + nb).end_array();
    offset += nb;
    w.end_object();
  }
  w.end_object();
  std::string header = w.take();
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

}  // namespace

std::string serialize_header(const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>* metadata) {
  return header_for(serialization_order(tensors), metadata);
}

namespace {

// The frame's first 8 bytes: the header's length, little-endian (the safetensors format).
std::array<std::uint8_t, 8> header_length_bytes(std::uint64_t n) {
  std::array<std::uint8_t, 8> len{};
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
  return len;
}

void write_frame(detail::AtomicFile& out, const std::string& header) {
  out.write(header_length_bytes(header.size()).data(), 8);
  out.write(header);
}

}  // namespace

void write_trace(const std::string& path, const std::vector<NamedTensor>& tensors,
                 const std::map<std::string, std::string>* metadata) {
  const std::vector<const NamedTensor*> order = serialization_order(tensors);
  detail::AtomicFile out(path);
  write_frame(out, header_for(order, metadata));
  for (const NamedTensor* t : order) out.write(t->view.data, t->view.nbytes());
  out.commit();
}

namespace {

// An unnamed file in `dir` (or, where that folder takes none, the temporary folder): nothing
// to clean up, whatever ends the process.
int unnamed_file(const std::string& dir, const std::string& target) {
  for (const std::string& d : {dir, std::filesystem::temp_directory_path().string()}) {
    const int fd = ::open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
  }
  // No O_TMPFILE here: an exclusive, unpredictable name, unlinked at once.
  std::string pattern = dir + "/" + std::string(detail::kTempPrefix) + "stream.XXXXXX";
  const int fd = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (fd < 0) fail(target, std::string("cannot create a side file: ") + std::strerror(errno));
  ::unlink(pattern.c_str());
  return fd;
}

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

}  // namespace

// Where the data goes as it arrives: the temporary file that becomes `path`, `base` bytes in
// (room for the header); or, when `path` is written through, an unnamed side file.
struct TraceStreamWriter::Sink {
  detail::AtomicFile out;
  int side = -1;
  std::uint64_t base = 0;
  std::optional<detail::BackgroundAppender> appender;

  Sink(const std::string& path, const StreamOptions& options) : out(path) {
    detail::BackgroundAppender::Options staging{options.staging_block_bytes, options.staging_blocks,
                                                0, "tensor data"};
    int fd = out.fd();
    if (out.written_through()) {
      namespace fs = std::filesystem;
      const fs::path p(path);
      side = fd = unnamed_file(p.has_parent_path() ? p.parent_path().string() : ".", path);
      staging.writeback_from = std::numeric_limits<std::uint64_t>::max();  // copied later
    } else {
      base = round_up(std::max<std::uint64_t>(options.header_reserve, 4096), 4096);
      // Below that size the data is rewritten at close: no point flushing it to disk.
      staging.writeback_from = options.reference_layout_below;
    }
    appender.emplace(fd, base, path, staging);
  }
  ~Sink() {
    appender.reset();  // the thread stops before the file it writes closes
    if (side >= 0) ::close(side);
  }
  int data_fd() const { return side >= 0 ? side : out.fd(); }
};

TraceStreamWriter::TraceStreamWriter(std::string path, StreamOptions options)
    : path_(std::move(path)), options_(options), sink_(std::make_unique<Sink>(path_, options_)) {}

TraceStreamWriter::~TraceStreamWriter() { abort(); }

void TraceStreamWriter::add(const std::string& name, const TensorView& view) {
  if (!sink_) fail(path_, "the trace is already closed");
  if (name == "__metadata__") fail(path_, "a tensor cannot be named __metadata__");
  if (!names_.insert(name).second) {
    fail(path_, "tensor \"" + name + "\" written twice (names must be unique)");
  }
  const std::uint64_t nb = view.nbytes();
  sink_->appender->append(view.data, nb);
  const std::size_t element = element_size(view.dtype);
  if (element > 1 && size_ % element != 0) aligned_ = false;
  tensors_.push_back({name, TensorView{view.dtype, view.shape, nullptr}});
  offsets_.push_back(size_);
  size_ += nb;
}

void TraceStreamWriter::close(const std::map<std::string, std::string>* metadata) {
  if (!sink_) fail(path_, "the trace is already closed");
  sink_->appender->finish();
  std::vector<const NamedTensor*> arrival;
  for (const auto& t : tensors_) arrival.push_back(&t);
  std::string header = header_for(arrival, metadata);
  Sink& sink = *sink_;
  // Written once when the data stays where it is: a regular file, large enough to be worth
  // it, every tensor aligned for its dtype, and the header within both the reserve and the
  // readers' cap (a padded header counts whole).
  if (sink.side < 0 && aligned_ && size_ >= options_.reference_layout_below &&
      8 + header.size() <= sink.base && sink.base - 8 <= kMaxHeaderSize) {
    header.append(sink.base - 8 - header.size(), ' ');  // JSON whitespace up to the data
    sink.out.write_at(header_length_bytes(header.size()).data(), 8, 0);
    sink.out.write_at(header.data(), header.size(), 8);
    sink.out.commit();
    written_once_ = true;
  } else {
    const std::vector<const NamedTensor*> order = serialization_order(tensors_);
    std::optional<detail::AtomicFile> separate;
    detail::AtomicFile& out = sink.side >= 0 ? sink.out : separate.emplace(path_);
    write_frame(out, header_for(order, metadata));
    for (const NamedTensor* t : order) {
      out.append_from(sink.data_fd(),
                      sink.base + offsets_[static_cast<std::size_t>(t - tensors_.data())],
                      t->view.nbytes());
    }
    out.commit();
  }
  abort();  // the temporary (or side) file is done with
}

void TraceStreamWriter::abort() { sink_.reset(); }

void write_file_atomic(const std::string& path, std::string_view content) {
  detail::AtomicFile out(path);
  out.write(content);
  out.commit();
}

}  // namespace numalign
