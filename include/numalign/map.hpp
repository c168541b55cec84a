// numalign/map.hpp: pairing the tensors of two implementations of one model whose names and
// layouts differ (a fused QKV projection against separate q, k and v, another module tree),
// as a map file states it; pieces of fused tensors are judged where they lie, not copied.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numalign/rules.hpp"
#include "numalign/tensor.hpp"
#include "numalign/trace.hpp"

namespace numalign {

// One tensor to judge; test or ref may be null (missing on that side), truth may be null.
struct TensorTriple {
  TensorTriple() = default;
  TensorTriple(std::string name, const TensorView* test, const TensorView* ref,
               const TensorView* truth = nullptr)
      : name(std::move(name)), test(test), ref(ref), truth(truth) {}
  std::string name;
  const TensorView* test = nullptr;
  const TensorView* ref = nullptr;
  const TensorView* truth = nullptr;
  std::string source;   // where test's side came from, when not a namesake (a map's piece)
  std::string problem;  // why it cannot be judged, found while pairing ("" when none)
  std::string failure;  // a failure found while pairing (replicas that disagree), or ""
};

// One entry of a map: test tensors and the ref tensors they hold. One side is a glob (`*`
// captures, `?` one character); the other a name or a list of names that insert the
// captures as {1}, {2}. A list means a concatenation along cat_dim: a ref list, the test
// tensor holds those ref tensors side by side (each judged on its own); a test list, the ref
// tensor is those test tensors side by side. `transpose` swaps two dims of every test tensor
// first.
struct MapEntry {
  std::size_t number = 0;  // 1-based, as messages name it
  std::vector<std::string> test, ref;
  bool test_is_list = false, ref_is_list = false;
  std::optional<std::int64_t> cat_dim;
  std::optional<std::array<std::int64_t, 2>> transpose;
  bool glob_on_test = true;  // which side is matched (the other inserts its captures)
  // Test as one trace per tensor-parallel rank: the ranks' tensors are pieces of ref's along
  // this dim, in rank order; or `replicated`, every rank holds all of it (the default for
  // tensors no entry states either for: the ranks must agree bit for bit).
  std::optional<std::int64_t> sharded_dim;
  bool replicated = false;
  bool test_named_as_ref = false;  // "test" left out: the ref name matched, on test's side
};

// Tensors a map leaves out, with the written reason fail-closed judging requires.
struct MapIgnore {
  bool ref_side = true;
  std::string glob;
  std::string reason;
};

struct TensorMap {
  std::string origin;  // the file, or "map" for JSON given directly: messages start with it
  std::vector<MapEntry> entries;
  std::vector<MapIgnore> ignore;

  // {"map": [{"test": ..., "ref": ..., "cat_dim": D, "transpose": [A, B]}, ...],
  //  "ignore": [{"ref" | "test": GLOB, "reason": TEXT}, ...]}. Throws Error(origin, ...)
  // naming the entry on anything wrong: bad JSON, an unknown field, a glob or placeholder
  // that cannot work, a capture the glob does not have, an ignore without a reason.
  static TensorMap parse(std::string_view json, const std::string& origin);
  static TensorMap load(const std::string& path);
};

// What `*`s of `glob` matched in `name` (each as short as the rest allows), or nothing
// when it does not match.
std::optional<std::vector<std::string_view>> glob_captures(std::string_view glob,
                                                           std::string_view name);

// A rank's trace as `numalign.distributed.save(trace, path)` names it: "run.safetensors" ->
// "run.rank1.safetensors" (".safetensors" when the path has no extension).
std::string rank_trace_path(const std::string& path, std::size_t rank);

// The pairs to judge and the views of pieces they point into (kept stable here). Ref's
// tensors come in its execution order, each mapped by an entry, ignored, or paired by
// identical name; then the test tensors nothing used.
struct Pairing {
  std::vector<TensorTriple> triples;
  std::deque<TensorView> views;
  std::deque<Layout> layouts;
  std::vector<std::string> warnings;         // ignores applied, entries that matched nothing
  std::vector<std::string> could_not_judge;  // entries that point at tensors that do not exist
};

// `test_ranks`: the test run, or its tensor-parallel ranks in rank order (rank 0 first).
Pairing pair_with_map(const std::vector<const Trace*>& test_ranks, const Trace& ref,
                      const Trace* truth, const TensorMap& map,
                      const std::vector<std::string>& only);

}  // namespace numalign
