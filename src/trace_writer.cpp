// trace_writer.cpp: traces in the safetensors reference serializer's layout, written atomically.
#include "numalign/trace_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "atomic_file.hpp"
#include "json.hpp"
#include "numalign/error.hpp"

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

void write_frame(detail::AtomicFile& out, const std::string& header) {
  std::uint8_t len[8];
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
  out.write(len, 8);
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

}  // namespace

TraceStreamWriter::TraceStreamWriter(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  const fs::path p(path_);
  side_ = unnamed_file(p.has_parent_path() ? p.parent_path().string() : ".", path_);
}

TraceStreamWriter::~TraceStreamWriter() { abort(); }

void TraceStreamWriter::add(const std::string& name, const TensorView& view) {
  if (side_ < 0) fail(path_, "the trace is already closed");
  if (name == "__metadata__") fail(path_, "a tensor cannot be named __metadata__");
  if (std::any_of(tensors_.begin(), tensors_.end(),
                  [&](const NamedTensor& t) { return t.name == name; })) {
    fail(path_, "tensor \"" + name + "\" written twice (names must be unique)");
  }
  const auto* p = reinterpret_cast<const char*>(view.data);
  for (std::uint64_t n = view.nbytes(), at = size_; n > 0;) {
    const ssize_t k = ::pwrite(side_, p, n, static_cast<off_t>(at));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail(path_, std::string("cannot write tensor data: ") + std::strerror(errno));
    p += k;
    at += static_cast<std::uint64_t>(k);
    n -= static_cast<std::uint64_t>(k);
  }
  tensors_.push_back({name, TensorView{view.dtype, view.shape, nullptr}});
  offsets_.push_back(size_);
  size_ += view.nbytes();
}

void TraceStreamWriter::close(const std::map<std::string, std::string>* metadata) {
  if (side_ < 0) fail(path_, "the trace is already closed");
  const std::vector<const NamedTensor*> order = serialization_order(tensors_);
  detail::AtomicFile out(path_);
  write_frame(out, header_for(order, metadata));
  for (const NamedTensor* t : order) {
    out.append_from(side_, offsets_[static_cast<std::size_t>(t - tensors_.data())],
                    t->view.nbytes());
  }
  out.commit();
  abort();  // the side file is done with
}

void TraceStreamWriter::abort() {
  if (side_ >= 0) ::close(side_);
  side_ = -1;
}

void write_file_atomic(const std::string& path, std::string_view content) {
  detail::AtomicFile out(path);
  out.write(content);
  out.commit();
}

}  // namespace numalign
