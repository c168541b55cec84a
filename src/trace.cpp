// trace.cpp: safetensors reading (mmap + validation), sharded traces, metadata as JSON.
#include "numalign/trace.hpp"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <semaphore>
#include <thread>
#include <unordered_set>

#include "fault_guard.hpp"
#include "json.hpp"
#include "json_keys.hpp"
#include "name_index.hpp"
#include "numalign/error.hpp"
#include "page_populator.hpp"
#include "regular_file.hpp"

namespace numalign {

namespace detail {
struct TraceIndex {
  // Set once names holds every entry's name (after opening: by the first find()). A build
  // that throws (out of memory) leaves it unset for the next find() to try again.
  std::atomic<bool> built{false};
  std::mutex building;
  NameIndex names;
};
}  // namespace detail

namespace fs = std::filesystem;

// The bound on a sharded checkpoint's index (its weight_map): far beyond any real one.
constexpr std::size_t kMaxIndexFile = std::size_t{1} << 30;

// A read-only private mapping of a whole file; the file is never written.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    struct stat st {};
    const int fd = detail::open_regular_file(path, st, "safetensors file");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        fail(path, std::string("cannot map: ") + std::strerror(e));
      }
      ::madvise(p, size_, MADV_SEQUENTIAL);
      data_ = static_cast<const std::byte*>(p);
      detail::register_mapping(p, size_, path);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (!data_) return;
    detail::unregister_mapping(data_);
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace {

std::string json_quoted(std::string_view name) {
  std::string s;
  detail::append_json_string(s, name);
  return s;
}

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

// "tensor \"name\"", the subject of every per-tensor message; built only for a message:
// a header can name hundreds of thousands of tensors.
std::string tensor_named(std::string_view name) { return "tensor " + json_quoted(name); }

std::uint64_t read_u64(const simdjson::dom::element& e, std::string_view name,
                       const std::string& label, const char* what) {
  std::uint64_t v;
  if (e.get(v)) {
    fail(label, tensor_named(name) + ": " + what + " must hold non-negative integers");
  }
  return v;
}

std::map<std::string, std::string> parse_metadata_map(const simdjson::dom::element& e,
                                                      const std::string& label) {
  std::map<std::string, std::string> out;
  if (e.is_null()) return out;
  simdjson::dom::object obj;
  if (e.get(obj)) fail(label, "__metadata__ must be an object of strings (or null)");
  for (auto f : obj) {
    std::string_view v;
    if (f.value.get(v)) {
      fail(label, "__metadata__ value of " + json_quoted(f.key) + " is not a string");
    }
    if (!out.emplace(std::string(f.key), std::string(v)).second) {
      fail(label, "__metadata__ has the key " + json_quoted(f.key) + " twice");
    }
  }
  return out;
}

// A file's two parts: the JSON header and the data section after it.
struct Frame {
  std::string_view header;
  const std::byte* data;
  std::uint64_t data_size;
};

// The 8-byte little-endian header length, checked against the cap and the file's size, and
// the header's bytes checked as the reference checks them (UTF-8, no NUL).
Frame read_frame(std::span<const std::byte> bytes, const std::string& label) {
  const std::size_t size = bytes.size();
  if (size < 8) {
    fail(label, "file is " + std::to_string(size) +
                    " bytes, too short for the 8-byte header length (not a safetensors file)");
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<std::uint8_t>(bytes[i]);
  // The length is not printed: in a file that is not a trace, it is 8 bytes of its content.
  if (n > kMaxHeaderSize) {
    fail(label, "the header length (first 8 bytes) exceeds the " + std::to_string(kMaxHeaderSize) +
                    "-byte limit: not a safetensors file");
  }
  if (n > size - 8) {
    fail(label, "the header length (first 8 bytes) runs past the end of the file (" +
                    std::to_string(size) + " bytes): truncated, or not a safetensors file");
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), n);
  if (!simdjson::validate_utf8(header.data(), header.size())) {
    fail(label, "header is not valid UTF-8");
  }
  if (const auto nul = header.find('\0'); nul != std::string_view::npos) {
    fail(label, "header has a NUL byte at offset " + std::to_string(nul + 8) +
                    " (headers are padded with spaces, not NUL)");
  }
  return {header, bytes.data() + 8 + n, size - 8 - n};
}

// Held while a header is parsed: at most one parse per core at once. The judge opens its
// traces at once, and on two cores a third parsed header would only add its memory (a
// million tensors' header parses into about 250 MB), not speed.
class HeaderParseSlot {
 public:
  HeaderParseSlot() { slots().acquire(); }
  ~HeaderParseSlot() { slots().release(); }
  HeaderParseSlot(const HeaderParseSlot&) = delete;
  HeaderParseSlot& operator=(const HeaderParseSlot&) = delete;

 private:
  static std::counting_semaphore<>& slots() {
    static std::counting_semaphore<> free_slots(
        std::max<std::ptrdiff_t>(1, std::thread::hardware_concurrency()));
    return free_slots;
  }
};

// The header as a JSON object. It is parsed where it lies when the file has simdjson's
// padding after it (any data section of 64 bytes or more): the padding is read, never
// interpreted. Otherwise it is parsed from `copy`. The object lives in `parser`.
simdjson::dom::object parse_header(const Frame& frame, simdjson::dom::parser& parser,
                                   simdjson::padded_string& copy, const std::string& label) {
  simdjson::dom::element doc;
  const bool padded = frame.data_size >= simdjson::SIMDJSON_PADDING;
  if (!padded) copy = simdjson::padded_string(frame.header);
  auto parsed =
      padded ? parser.parse(frame.header.data(), frame.header.size(), false) : parser.parse(copy);
  if (auto err = parsed.get(doc)) {
    fail(label, std::string("header is not valid JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::object root;
  if (doc.get(root)) fail(label, "header is not a JSON object");
  return root;
}

// [begin, end) of an entry's data, as its header states them.
using Extent = std::pair<std::uint64_t, std::uint64_t>;

// The number of elements of a shape array. The DOM's size() stops counting at 0xFFFFFF (it
// means "that many or more"): past it, a hostile header's dimensions are counted one by one.
std::size_t rank_of(const simdjson::dom::array& shape) {
  constexpr std::size_t kSaturated = 0xFFFFFF;
  if (shape.size() < kSaturated) return shape.size();
  std::size_t n = 0;
  for ([[maybe_unused]] auto d : shape) ++n;
  return n;
}

// Reads the header's entries, appending them to `entries` (data pointers still null) and
// their extents to `extents`, in header order; __metadata__ goes to `metadata`.
void parse_entries(const simdjson::dom::object& root, std::uint32_t file, const std::string& label,
                   std::vector<TraceEntry>& entries, std::vector<Extent>& extents,
                   std::map<std::string, std::string>& metadata) {
  if (entries.size() + root.size() > std::numeric_limits<std::uint32_t>::max()) {
    fail(label, "more tensors than a trace can index");
  }
  entries.reserve(entries.size() + root.size());
  detail::populate_for_writing(entries.data() + entries.size(), root.size() * sizeof(TraceEntry));
  extents.reserve(root.size());
  bool seen_metadata = false;
  std::string_view last_dtype_name;
  DType last_dtype = DType::F32;
  for (auto field : root) {
    const std::string_view key = field.key;
    if (key == "__metadata__") {
      if (seen_metadata) fail(label, "header has __metadata__ twice");
      seen_metadata = true;
      metadata = parse_metadata_map(field.value, label);
      continue;
    }
    if (key.find('\0') != std::string_view::npos)
      fail(label, tensor_named(key) + ": name has a NUL byte");
    simdjson::dom::object entry;
    if (field.value.get(entry)) fail(label, tensor_named(key) + ": entry is not an object");
    // One pass over the entry's fields. A field given twice is refused, as the reference
    // does (which dtype was meant?); other keys are ignored, repeated or not, as there.
    simdjson::dom::element fields[3];
    bool found[3] = {false, false, false};
    constexpr std::string_view kFields[3] = {"dtype", "shape", "data_offsets"};
    for (auto f : entry) {
      for (int i = 0; i < 3; ++i) {
        if (f.key != kFields[i]) continue;
        if (found[i]) {
          fail(label,
               tensor_named(key) + ": entry has the key \"" + std::string(kFields[i]) + "\" twice");
        }
        fields[i] = f.value;
        found[i] = true;
      }
    }
    for (int i = 0; i < 3; ++i) {
      if (!found[i])
        fail(label, tensor_named(key) + ": entry has no \"" + std::string(kFields[i]) + "\"");
    }
    const auto& [dtype_el, shape_el, offsets_el] = fields;
    std::string_view dtype_name;
    if (dtype_el.get(dtype_name)) fail(label, tensor_named(key) + ": dtype is not a string");
    // Most headers hold one or two dtypes: the last one found is checked first.
    if (dtype_name != last_dtype_name) {
      const auto dt = dtype_from_name(dtype_name);
      if (!dt) fail(label, tensor_named(key) + ": unknown dtype " + json_quoted(dtype_name));
      last_dtype_name = dtype_name;
      last_dtype = *dt;
    }
    simdjson::dom::array shape_arr, offsets_arr;
    if (shape_el.get(shape_arr)) fail(label, tensor_named(key) + ": shape is not an array");
    Shape shape(rank_of(shape_arr), 0);
    std::size_t dim = 0;
    for (auto d : shape_arr) shape[dim++] = read_u64(d, key, label, "shape");
    if (offsets_el.get(offsets_arr) || offsets_arr.size() != 2) {
      fail(label, tensor_named(key) + ": data_offsets must be [begin, end]");
    }
    extents.emplace_back(read_u64(offsets_arr.at(0).value_unsafe(), key, label, "data_offsets"),
                         read_u64(offsets_arr.at(1).value_unsafe(), key, label, "data_offsets"));
    entries.push_back({std::string(key), TensorView{last_dtype, std::move(shape), nullptr}, file});
  }
}

// "-0" in a shape or data_offsets: the DOM reads it as the integer 0, but the reference (serde
// reading a usize) refuses it, as it refuses every negative number. Called only for headers
// holding the characters "-0" at all (rarely more than a name's): read a second time, on demand.
void refuse_negative_zeros(std::string_view header, const std::string& label) {
  simdjson::ondemand::parser parser;
  const simdjson::padded_string copy(header);
  simdjson::ondemand::document doc = parser.iterate(copy);
  simdjson::ondemand::object root;
  if (doc.get_object().get(root)) return;  // the DOM parse reports what is wrong
  for (auto field : root) {
    std::string_view key;
    simdjson::ondemand::object entry;
    if (field.unescaped_key().get(key) || key == "__metadata__" ||
        field.value().get_object().get(entry)) {
      continue;
    }
    for (auto f : entry) {
      std::string_view name;
      simdjson::ondemand::array arr;
      if (f.unescaped_key().get(name) || (name != "shape" && name != "data_offsets") ||
          f.value().get_array().get(arr)) {
        continue;
      }
      for (auto v : arr) {
        std::string_view raw;
        if (!v.raw_json_token().get(raw) && raw.starts_with('-')) {
          fail(label,
               tensor_named(key) + ": " + std::string(name) + " must hold non-negative integers");
        }
      }
    }
  }
}

// Adds entries [first, end) to the index. Names are unique within the trace: in this
// header and across its shards.
// `where` says where a name given twice was given: "in the header", "among the tensors".
void index_names(detail::NameIndex& index, const std::vector<TraceEntry>& entries,
                 std::size_t first, const std::vector<std::string>& file_paths,
                 const std::string& label, const char* where = "in the header") {
  auto name_of = [&](std::uint32_t i) -> std::string_view { return entries[i].name; };
  index.reserve(entries.size(), name_of);
  for (std::size_t i = first; i < entries.size(); ++i) {
    if (const auto other = index.insert(static_cast<std::uint32_t>(i), name_of)) {
      const TraceEntry& e = entries[*other];
      if (e.file == entries[i].file) {
        fail(label, tensor_named(e.name) + " appears twice " + where + " (names must be unique)");
      }
      fail(label, tensor_named(e.name) + " is also in " + file_paths[e.file]);
    }
  }
}

// The entries' positions sorted by extent. A permutation is sorted, not the entries
// (writers mostly list them in offset order, and then nothing moves).
std::vector<std::uint32_t> order_by_offset(const std::vector<Extent>& extents) {
  std::vector<std::uint32_t> by_offset(extents.size());
  for (std::uint32_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  auto offset_less = [&](std::uint32_t a, std::uint32_t b) { return extents[a] < extents[b]; };
  if (!std::is_sorted(by_offset.begin(), by_offset.end(), offset_less)) {
    std::sort(by_offset.begin(), by_offset.end(), offset_less);
  }
  return by_offset;
}

// The bytes a tensor's dtype and shape need, refused when they overflow or do not fill
// whole bytes.
std::uint64_t needed_bytes(const TraceEntry& e, const std::string& label) {
  std::uint64_t numel = 1, nbits = 0;
  for (auto d : e.view.shape) {
    if (!checked_mul(numel, d, numel))
      fail(label, tensor_named(e.name) + ": shape product overflows");
  }
  if (!checked_mul(numel, static_cast<std::uint64_t>(bits(e.view.dtype)), nbits)) {
    fail(label, tensor_named(e.name) + ": byte size overflows");
  }
  if (nbits % 8 != 0) {
    fail(label, tensor_named(e.name) + ": " + std::to_string(numel) + " elements of " +
                    std::string(name(e.view.dtype)) + " do not fill whole bytes");
  }
  return nbits / 8;
}

// Validates the layout as the reference does: in offset order, extents back to back from
// 0 (no hole, no overlap) to the end of the data section, each the size its dtype and
// shape need. Points each entry's view at its data.
void place_data(const Frame& frame, std::span<TraceEntry> entries,
                const std::vector<Extent>& extents, const std::vector<std::uint32_t>& by_offset,
                const std::string& label) {
  std::uint64_t expected = 0;
  for (const std::uint32_t k : by_offset) {
    TraceEntry& e = entries[k];
    const auto [begin, end] = extents[k];
    if (end < begin) {
      fail(label, tensor_named(e.name) + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + "] end before they begin");
    }
    if (begin != expected) {
      fail(label, tensor_named(e.name) + ": data starts at " + std::to_string(begin) +
                      " but the previous " + "tensor ends at " + std::to_string(expected) +
                      (begin > expected ? " (a hole)" : " (an overlap)"));
    }
    const std::uint64_t nbytes = needed_bytes(e, label);
    if (end - begin != nbytes) {
      fail(label, tensor_named(e.name) + ": " + std::string(name(e.view.dtype)) + " " +
                      format_shape(e.view.shape) + " needs " + std::to_string(nbytes) +
                      " bytes but data_offsets span " + std::to_string(end - begin));
    }
    if (end > frame.data_size) {
      fail(label, tensor_named(e.name) + ": data_offsets end at " + std::to_string(end) +
                      ", past the data section (" + std::to_string(frame.data_size) + " bytes)");
    }
    e.view.data = frame.data + begin;
    expected = end;
  }
  if (expected != frame.data_size) {
    const std::uint64_t data_start = frame.header.size() + 8;
    fail(label, "tensor data ends at byte " + std::to_string(data_start + expected) +
                    " but the file has " + std::to_string(data_start + frame.data_size) +
                    " bytes (trailing bytes)");
  }
}

// Every entry's name, indexed by its position (names known to be unique).
detail::NameIndex index_every_name(const std::vector<TraceEntry>& entries) {
  const auto name_of = [&](std::uint32_t i) -> std::string_view { return entries[i].name; };
  detail::NameIndex index;
  index.reserve(entries.size(), name_of);
  for (std::size_t i = 0; i < entries.size(); ++i)
    index.insert(static_cast<std::uint32_t>(i), name_of);
  return index;
}

// Puts entries [first, first + by_offset.size()) in file order (data offsets), as the
// reference lists them, and rebuilds the index on their new positions.
void put_in_file_order(std::vector<TraceEntry>& entries, std::size_t first,
                       const std::vector<std::uint32_t>& by_offset, detail::NameIndex& index) {
  bool in_order = true;
  for (std::uint32_t i = 0; i < by_offset.size() && in_order; ++i) in_order = by_offset[i] == i;
  if (in_order) return;
  std::vector<TraceEntry> sorted;
  sorted.reserve(by_offset.size());
  for (const std::uint32_t k : by_offset) sorted.push_back(std::move(entries[first + k]));
  std::move(sorted.begin(), sorted.end(), entries.begin() + static_cast<std::ptrdiff_t>(first));
  index = index_every_name(entries);
}

}  // namespace

// Entries go straight into entries_ (their data pointers set once the layout is checked);
// a file that fails leaves the whole trace unusable, so nothing needs undoing.
void Trace::add_file(std::span<const std::byte> bytes, const std::string& label, bool mapped) {
  const Frame frame = read_frame(bytes, label);
  const auto file = static_cast<std::uint32_t>(file_paths_.size());
  file_paths_.push_back(label);
  const std::size_t first = entries_.size();
  std::vector<Extent> extents;
  std::map<std::string, std::string> file_metadata;
  bool negative_zero_text = false;  // the characters "-0" anywhere in the header
  {
    // The parsed header (about three times its size) lives only while its entries are read.
    const HeaderParseSlot slot;
    simdjson::dom::parser parser;
    simdjson::padded_string copy;
    const simdjson::dom::object root = parse_header(frame, parser, copy, label);
    negative_zero_text = frame.header.find("-0") != std::string_view::npos;
    // The parse holds its own copy of every string: a mapped header's pages can go now, while
    // the entries are built (a million tensors' header is 80 MB).
    if (mapped) detail::release_pages(frame.header.data(), frame.header.size());
    parse_entries(root, file, label, entries_, extents, file_metadata);
  }
  if (negative_zero_text) {
    refuse_negative_zeros(frame.header, label);
    if (mapped) detail::release_pages(frame.header.data(), frame.header.size());
  }
  if (!index_) index_ = std::make_shared<detail::TraceIndex>();
  index_names(index_->names, entries_, first, file_paths_, label);
  const std::vector<std::uint32_t> by_offset = order_by_offset(extents);
  place_data(frame, std::span(entries_).subspan(first), extents, by_offset, label);
  // The first file's metadata is the trace's.
  if (first == 0 && raw_metadata_.empty()) adopt_metadata(std::move(file_metadata), label);
  put_in_file_order(entries_, first, by_offset, index_->names);
}

Trace Trace::parse(std::span<const std::byte> bytes, const std::string& label) {
  Trace t;
  t.path_ = label;
  t.add_file(bytes, label, false);
  t.drop_index();
  return t;
}

Trace Trace::from_tensors(std::vector<NamedTensor> tensors,
                          std::map<std::string, std::string> raw_metadata,
                          const std::string& label) {
  Trace t;
  t.path_ = label;
  const std::string where = label.empty() ? "tensors" : label;
  t.entries_.reserve(tensors.size());
  for (auto& [name, view] : tensors) t.entries_.push_back({std::move(name), std::move(view), 0});
  t.index_ = std::make_shared<detail::TraceIndex>();
  index_names(t.index_->names, t.entries_, 0, t.file_paths_, where, "among the tensors");
  t.drop_index();
  t.adopt_metadata(std::move(raw_metadata), where);
  return t;
}

void Trace::adopt_metadata(std::map<std::string, std::string> raw, const std::string& where) {
  if (auto it = raw.find(kMetadataKey); it != raw.end()) {
    metadata_ = TraceMetadata::from_json(it->second, where);
  }
  raw_metadata_ = std::move(raw);
}

namespace {

// The real path of an existing path, or "" (a missing shard is reported when it is opened).
std::string real_path(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (!r) return "";
  std::string out(r);
  std::free(r);
  return out;
}

// The shard files an index names, each once (paths equal after normalisation are one file).
// A shard must lie inside the index's folder: no absolute path, no "..", no link whose target
// leaves the folder; every name is checked before any shard is opened.
std::vector<std::string> shards_of_index(const std::string& path) {
  const std::string text = detail::read_regular_file(path, "safetensors index", kMaxIndexFile);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(simdjson::padded_string(text)).get(doc)) {
    fail(path, std::string("index is not valid JSON: ") + simdjson::error_message(err));
  }
  detail::refuse_repeated_keys_within(doc, path, "the index");
  simdjson::dom::object map;
  if (doc["weight_map"].get(map)) fail(path, "index has no \"weight_map\" object");
  const fs::path dir = fs::path(path).parent_path();
  auto outside = [&](std::string_view key, std::string_view shard) {
    fail(path, "weight_map value of " + json_quoted(key) + " (" + json_quoted(shard) +
                   ") is outside the index's folder: shards must lie inside it");
  };
  std::vector<std::string> shards;
  std::unordered_set<std::string> seen;
  std::vector<std::string_view> keys;
  for (auto f : map) {
    std::string_view shard;
    if (f.value.get(shard))
      fail(path, "weight_map value of " + json_quoted(f.key) + " is not a string");
    const fs::path named(shard);
    const fs::path normal = named.lexically_normal();
    if (named.is_absolute() || normal.empty() || *normal.begin() == "..") outside(f.key, shard);
    if (seen.insert(normal.string()).second) {
      shards.push_back((dir / normal).string());
      keys.push_back(f.key);
    }
  }
  // Links: the real path of each shard must stay under the real path of the folder.
  const std::string root = real_path(dir.empty() ? "." : dir.string());
  if (!root.empty()) {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string real = real_path(shards[i]);
      if (!real.empty() && !(real.size() > root.size() && real.starts_with(root) &&
                             (root.back() == '/' || real[root.size()] == '/'))) {
        outside(keys[i], fs::path(shards[i]).lexically_relative(dir).string());
      }
    }
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace

Trace Trace::open(const std::string& path) {
  detail::check_path(path);
  Trace t;
  t.path_ = path;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& de : fs::directory_iterator(path, ec)) {
      if (de.path().extension() == ".safetensors") files.push_back(de.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) fail(path, "directory holds no .safetensors files");
  } else if (path.size() > 11 && path.ends_with(".index.json")) {
    files = shards_of_index(path);
  } else {
    files.push_back(path);
  }
  for (const auto& f : files) {
    auto mapped = std::make_shared<MappedFile>(f);
    t.files_.push_back(mapped);
    t.add_file(mapped->bytes(), f, true);
  }
  t.drop_index();
  return t;
}

void Trace::copy_data(const TraceEntry& entry, std::byte* out) {
  const std::size_t n = entry.view.nbytes();
  if (n == 0) return;
  detail::guarded([&] { std::memcpy(out, entry.view.data, n); });
}

void Trace::drop_index() { index_ = std::make_shared<detail::TraceIndex>(); }

const TraceEntry* Trace::find(const std::string& name) const {
  if (!index_) return nullptr;
  if (!index_->built.load(std::memory_order_acquire)) {
    const std::lock_guard lock(index_->building);
    if (!index_->built.load(std::memory_order_relaxed)) {
      index_->names = index_every_name(entries_);
      index_->built.store(true, std::memory_order_release);
    }
  }
  const auto at = index_->names.find(
      name, [&](std::uint32_t i) -> std::string_view { return entries_[i].name; });
  return at ? &entries_[*at] : nullptr;
}

std::vector<std::span<const std::byte>> Trace::mappings() const {
  std::vector<std::span<const std::byte>> out;
  for (const auto& f : files_) out.push_back(f->bytes());
  return out;
}

std::uint64_t Trace::data_bytes() const {
  std::uint64_t b = 0;
  for (const auto& e : entries_) b += e.view.nbytes();
  return b;
}

// ---- metadata ----

std::string TraceMetadata::to_json() const {
  detail::JsonWriter w;
  w.begin_object();
  auto str = [&](const char* k, const std::string& v) {
    if (!v.empty()) w.key(k).string(v);
  };
  str("role", role);
  str("dtype_recipe", dtype_recipe);
  str("device", device);
  if (!versions.empty()) {
    w.key("versions").begin_object();
    for (const auto& [k, v] : versions) w.key(k).string(v);
    w.end_object();
  }
  if (!tf32.empty()) {
    w.key("tf32").begin_object();
    for (const auto& [k, v] : tf32) w.key(k).boolean(v);
    w.end_object();
  }
  if (seed) w.key("seed").raw(std::to_string(*seed));
  str("upstream_gradient", upstream_gradient);
  str("truth_of", truth_of);
  if (!order.empty()) {
    w.key("order").begin_array();
    for (const auto& n : order) w.string(n);
    w.end_array();
  }
  if (!tags.empty()) {
    w.key("tags").begin_object();
    for (const auto& [name, kv] : tags) {
      w.key(name).begin_object();
      for (const auto& [k, v] : kv) w.key(k).string(v);
      w.end_object();
    }
    w.end_object();
  }
  if (!fingerprints.empty()) {
    w.key("fingerprints").begin_object();
    for (const auto& [k, v] : fingerprints) w.key(k).string(v);
    w.end_object();
  }
  // An object of string arrays (inputs, below_float64), left out when empty.
  auto string_lists = [&w](const char* key,
                           const std::map<std::string, std::vector<std::string>>& lists) {
    if (lists.empty()) return;
    w.key(key).begin_object();
    for (const auto& [name, items] : lists) {
      w.key(name).begin_array();
      for (const auto& item : items) w.string(item);
      w.end_array();
    }
    w.end_object();
  };
  string_lists("inputs", inputs);
  string_lists("below_float64", below_float64);
  if (!not_recorded.empty()) {
    w.key("not_recorded").begin_object();
    for (const auto& [k, v] : not_recorded) w.key(k).string(v);
    w.end_object();
  }
  if (random) {
    w.key("random").begin_object();
    for (const auto& [key, list] :
         {std::pair{"generators", &random->generators}, std::pair{"dropout", &random->dropout}}) {
      w.key(key).begin_array();
      for (const auto& n : *list) w.string(n);
      w.end_array();
    }
    w.end_object();
  }
  w.end_object();
  return w.take();
}

TraceMetadata TraceMetadata::from_json(std::string_view json, const std::string& where) {
  const std::string ctx = std::string("__metadata__[\"") + kMetadataKey + "\"]";
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(simdjson::padded_string(json)).get(doc)) {
    fail(where, ctx + " is not valid JSON: " + simdjson::error_message(err));
  }
  simdjson::dom::object root;
  if (doc.get(root)) fail(where, ctx + " is not a JSON object");
  detail::refuse_repeated_keys_within(doc, where, ctx);
  TraceMetadata m;
  auto need_string = [&](simdjson::dom::element e, const std::string& what) {
    std::string_view s;
    if (e.get(s)) fail(where, ctx + ": " + what + " must be a string");
    return std::string(s);
  };
  auto string_map = [&](simdjson::dom::element e, const std::string& what) {
    std::map<std::string, std::string> out;
    simdjson::dom::object obj;
    if (e.get(obj)) fail(where, ctx + ": " + what + " must be an object");
    for (auto f : obj)
      out[std::string(f.key)] = need_string(f.value, what + "." + std::string(f.key));
    return out;
  };
  // An object of string arrays: "inputs must be an object of name arrays", ...
  auto string_lists = [&](simdjson::dom::element e, const std::string& what, const char* item,
                          std::map<std::string, std::vector<std::string>>& out) {
    simdjson::dom::object obj;
    if (e.get(obj)) fail(where, ctx + ": " + what + " must be an object of " + item + " arrays");
    for (auto g : obj) {
      simdjson::dom::array arr;
      const std::string at = what + "." + std::string(g.key);
      if (g.value.get(arr)) fail(where, ctx + ": " + at + " must be an array of " + item + "s");
      auto& list = out[std::string(g.key)];
      for (auto v : arr) list.push_back(need_string(v, at + "[]"));
    }
  };
  for (auto f : root) {
    const std::string k(f.key);
    if (k == "role")
      m.role = need_string(f.value, k);
    else if (k == "dtype_recipe")
      m.dtype_recipe = need_string(f.value, k);
    else if (k == "device")
      m.device = need_string(f.value, k);
    else if (k == "versions")
      m.versions = string_map(f.value, k);
    else if (k == "fingerprints")
      m.fingerprints = string_map(f.value, k);
    else if (k == "upstream_gradient")
      m.upstream_gradient = need_string(f.value, k);
    else if (k == "truth_of")
      m.truth_of = need_string(f.value, k);
    else if (k == "seed") {
      std::int64_t s;
      if (f.value.get(s)) fail(where, ctx + ": seed must be an integer");
      m.seed = s;
    } else if (k == "tf32") {
      simdjson::dom::object obj;
      if (f.value.get(obj)) fail(where, ctx + ": tf32 must be an object of booleans");
      for (auto g : obj) {
        bool b;
        if (g.value.get(b)) fail(where, ctx + ": tf32 values must be booleans");
        m.tf32[std::string(g.key)] = b;
      }
    } else if (k == "order") {
      simdjson::dom::array arr;
      if (f.value.get(arr)) fail(where, ctx + ": order must be an array of names");
      for (auto v : arr) m.order.push_back(need_string(v, "order[]"));
    } else if (k == "tags") {
      simdjson::dom::object obj;
      if (f.value.get(obj)) fail(where, ctx + ": tags must be an object");
      for (auto g : obj)
        m.tags[std::string(g.key)] = string_map(g.value, "tags." + std::string(g.key));
    } else if (k == "inputs") {
      string_lists(f.value, k, "name", m.inputs);
    } else if (k == "below_float64") {
      string_lists(f.value, k, "op", m.below_float64);
    } else if (k == "not_recorded") {
      m.not_recorded = string_map(f.value, k);
    } else if (k == "random") {
      simdjson::dom::object obj;
      if (f.value.get(obj)) fail(where, ctx + ": random must be an object");
      RandomUse use;
      for (auto g : obj) {
        const std::string key(g.key);
        std::vector<std::string>* list = key == "generators" ? &use.generators
                                         : key == "dropout"  ? &use.dropout
                                                             : nullptr;
        if (!list) continue;  // tolerated, as unknown fields are
        simdjson::dom::array arr;
        if (g.value.get(arr)) fail(where, ctx + ": random." + key + " must be an array of names");
        for (auto v : arr) list->push_back(need_string(v, "random." + key + "[]"));
      }
      m.random = std::move(use);
    }
    // Unknown fields are tolerated: newer writers may add some.
  }
  return m;
}

}  // namespace numalign
