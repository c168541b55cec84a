// numalign/trace.hpp: traces as safetensors files, read by mmap with the reference parser's
// validation (and a little more); writing is in trace_writer.hpp, included here.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "numalign/tensor.hpp"
#include "numalign/trace_writer.hpp"  // the writing side: one include gives both

namespace numalign {

inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;  // safetensors' MAX_HEADER_SIZE
inline constexpr const char* kMetadataKey = "numalign";       // our JSON inside __metadata__

// Randomness a run consumed, as capture records it: the generators whose state changed
// during the run ("cpu", "cuda:0") and the modules left in training mode with dropout. A run
// that used any computes on its draws, which another run does not share.
struct RandomUse {
  std::vector<std::string> generators;
  std::vector<std::string> dropout;
  bool used() const { return !generators.empty() || !dropout.empty(); }
};

// Structured metadata of a trace (docs/architecture.md, "Formats"), stored as JSON under
// __metadata__'s "numalign" key. Every field is optional; unknown fields are kept out of the way.
struct TraceMetadata {
  std::string role;          // truth / ref / test
  std::string dtype_recipe;  // e.g. "bf16", "fp32-accumulate"
  std::string device;
  std::map<std::string, std::string> versions;
  std::map<std::string, bool> tf32;  // e.g. {"matmul": false, "cudnn": false}
  std::optional<std::int64_t> seed;
  // How the upstream gradient of the backward pass was drawn (upstream_gradient.hpp); empty
  // in traces made before it was recorded.
  std::string upstream_gradient;
  // A truth's: the dtype recipe of the runs whose values (inputs, parameters, upstream
  // gradient, rounded to it and widened) it computed on; empty for a truth on other values.
  std::string truth_of;
  std::vector<std::string> order;                                  // execution order of the tensors
  std::map<std::string, std::map<std::string, std::string>> tags;  // name -> {module, kind}
  std::map<std::string, std::string> fingerprints;                 // input -> hash
  // tensor -> the tensors it was computed from (a module's inputs; for a gradient, the
  // gradients it received and its module's forward inputs)
  std::map<std::string, std::vector<std::string>> inputs;
  std::optional<RandomUse> random;  // absent: not recorded (a trace made elsewhere)
  // value -> why the recorder left it out (a cache handed to a module: state, not a value)
  std::map<std::string, std::string> not_recorded;
  // module -> the ops that computed in less than float64 there (a truth run that is not all
  // float64: model code that casts to float32, an fp32-only kernel); "(backward)" for the
  // backward pass
  std::map<std::string, std::vector<std::string>> below_float64;

  std::string to_json() const;
  // Throws Error(where, ...) on invalid JSON or fields of the wrong type.
  static TraceMetadata from_json(std::string_view json, const std::string& where);
};

struct TraceEntry {
  std::string name;
  TensorView view;
  std::uint32_t file = 0;  // the file holding it: a position in Trace::files()
};

class MappedFile;
namespace detail {
struct TraceIndex;
}

// One run: a safetensors file, a directory of shards, or a `*.safetensors.index.json`.
class Trace {
 public:
  // Opens and validates; throws Error("<path>", "<problem>") on anything wrong.
  static Trace open(const std::string& path);
  // Parses bytes already in memory (not copied: they must outlive the Trace).
  static Trace parse(std::span<const std::byte> bytes, const std::string& label);
  // A run held in memory (a front end's tensors): the views are not copied and must outlive
  // the Trace; `raw_metadata` as a file's __metadata__ (our key parsed). `label` is its
  // path in reports ("" for none). Throws Error on a name given twice.
  static Trace from_tensors(std::vector<NamedTensor> tensors,
                            std::map<std::string, std::string> raw_metadata,
                            const std::string& label = "");

  const std::string& path() const { return path_; }
  // In file order (data offsets); for shards, shard by shard.
  const std::vector<TraceEntry>& entries() const { return entries_; }
  const TraceEntry* find(const std::string& name) const;
  // __metadata__ of the (first) file, string -> string.
  const std::map<std::string, std::string>& raw_metadata() const { return raw_metadata_; }
  // The "numalign" key parsed, when present.
  const std::optional<TraceMetadata>& metadata() const { return metadata_; }
  std::uint64_t data_bytes() const;
  // The files read, in order (one, or the shards of a sharded trace).
  const std::vector<std::string>& files() const { return file_paths_; }
  // The bytes of each mapped file (none for parse()): what judge maps ahead of the pass.
  std::vector<std::span<const std::byte>> mappings() const;
  // Copies `entry`'s data (entry.view.nbytes() bytes) to `out`: when its file shrank since it
  // was opened, an Error naming the file instead of a SIGBUS (a view of the mapping would
  // fault wherever it is read later, in a caller's own code).
  static void copy_data(const TraceEntry& entry, std::byte* out);

 private:
  // `mapped`: the bytes are a file mapping of ours, whose header pages may be dropped once
  // parsed (never memory a caller owns).
  void add_file(std::span<const std::byte> bytes, const std::string& label, bool mapped);
  // `raw` becomes the trace's __metadata__, our key parsed (errors name `where`).
  void adopt_metadata(std::map<std::string, std::string> raw, const std::string& where);
  std::string path_;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::vector<std::string> file_paths_;
  std::vector<TraceEntry> entries_;
  // Names -> entries, built on the first find(): opening one to refuse a name given twice,
  // then dropping it, since traces recorded alike are paired by position and never look a
  // name up (a million names make a 16 MB table per trace).
  std::shared_ptr<detail::TraceIndex> index_;
  // Drops the index built while opening; find() builds it again when first asked.
  void drop_index();
  std::map<std::string, std::string> raw_metadata_;
  std::optional<TraceMetadata> metadata_;
};

}  // namespace numalign
