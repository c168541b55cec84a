// header_floor: the least a judge of many small tensors must do. Maps each safetensors file,
// parses its JSON header with simdjson's DOM parser (in place, as numalign's reader does) and
// visits every entry: name, dtype, shape and data offsets, one file after another on one
// thread. Prints one JSON line: {"files": F, "entries": E, "seconds": S, "checksum": C}.
#include <fcntl.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace {

[[noreturn]] void die(const char* path, const char* what) {
  std::fprintf(stderr, "header_floor: %s: %s\n", path, what);
  std::exit(2);
}

// Entries visited; the checksum keeps the visit from being optimized away.
std::uint64_t visit(const char* path, std::uint64_t& checksum) {
  const int fd = open(path, O_RDONLY);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) die(path, std::strerror(errno));
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 8) die(path, "too short");
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) die(path, std::strerror(errno));
  const auto* bytes = static_cast<const char*>(p);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  if (n > size - 8) die(path, "header length past the end");
  simdjson::dom::parser parser;
  simdjson::padded_string copy;
  simdjson::dom::element doc;
  // In place when the data after the header covers simdjson's padding, else a padded copy.
  const bool padded = size - 8 - n >= simdjson::SIMDJSON_PADDING;
  if (!padded) copy = simdjson::padded_string(bytes + 8, n);
  const auto err =
      padded ? parser.parse(bytes + 8, n, false).get(doc) : parser.parse(copy).get(doc);
  if (err) die(path, simdjson::error_message(err));
  simdjson::dom::object root;
  if (doc.get(root)) die(path, "header is not an object");
  std::uint64_t entries = 0;
  for (auto [key, value] : root) {
    if (key == "__metadata__") continue;
    simdjson::dom::object e;
    if (value.get(e)) die(path, "entry is not an object");
    std::string_view dtype;
    simdjson::dom::array shape, offsets;
    if (e["dtype"].get(dtype) || e["shape"].get(shape) || e["data_offsets"].get(offsets)) {
      die(path, "entry lacks dtype, shape or data_offsets");
    }
    checksum += key.size() + dtype.size();
    for (auto d : shape) checksum += d.get_uint64().value_unsafe();
    for (auto o : offsets) checksum ^= o.get_uint64().value_unsafe();
    ++entries;
  }
  munmap(p, size);
  return entries;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: header_floor FILE.safetensors...\n");
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t checksum = 0, entries = 0;
  for (int i = 1; i < argc; ++i) entries += visit(argv[i], checksum);
  const std::chrono::duration<double> s = std::chrono::steady_clock::now() - start;
  std::printf("{\"files\": %d, \"entries\": %llu, \"seconds\": %.4f, \"checksum\": %llu}\n",
              argc - 1, static_cast<unsigned long long>(entries), s.count(),
              static_cast<unsigned long long>(checksum));
  return 0;
}
