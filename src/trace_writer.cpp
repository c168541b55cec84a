// trace_writer.cpp: traces in the safetensors reference serializer's layout, written atomically.
#include "numalign/trace_writer.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>

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

void write_trace(const std::string& path, const std::vector<NamedTensor>& tensors,
                 const std::map<std::string, std::string>* metadata) {
  const std::vector<const NamedTensor*> order = serialization_order(tensors);
  const std::string header = header_for(order, metadata);
  detail::AtomicFile out(path);
  std::uint8_t len[8];
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
  out.write(len, 8);
  out.write(header);
  for (const NamedTensor* t : order) out.write(t->view.data, t->view.nbytes());
  out.commit();
}

void write_file_atomic(const std::string& path, std::string_view content) {
  if (path == "-") {
    std::fwrite(content.data(), 1, content.size(), stdout);
    return;
  }
  detail::AtomicFile out(path);
  out.write(content);
  out.commit();
}

}  // namespace numalign
