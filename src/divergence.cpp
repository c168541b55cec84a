// divergence.cpp: a run fails in many places once one module goes wrong; the first failure
// in execution order, and whether its inputs were still aligned, says where to look.
#include "numalign/divergence.hpp"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <unordered_map>

namespace numalign {

namespace {

const std::string* tag(const TraceMetadata& meta, const std::string& tensor, const char* key) {
  const auto t = meta.tags.find(tensor);
  if (t == meta.tags.end()) return nullptr;
  const auto v = t->second.find(key);
  return v == t->second.end() ? nullptr : &v->second;
}

}  // namespace

std::optional<FirstDivergence> find_first_divergence(const TraceMetadata& ref,
                                                     const Report& report) {
  // Untagged, no tensor has a kind: nothing to find (and a million names not to hash).
  if (ref.tags.empty()) return std::nullopt;
  // Whether each tensor was judged (was_judged) and failed. An op that could not be paired
  // (op sequences differ), a tensor that could not be judged or is missing from test, is no
  // divergence, and as an input it is not known to pass either.
  struct Seen {
    bool judged, failed;
  };
  std::unordered_map<std::string_view, Seen> seen;
  for (const auto& r : report.tensors) {
    if (!r.tags.count("unpaired"))
      seen.emplace(r.name, Seen{was_judged(r), r.verdict == VerdictKind::kFail});
  }
  auto failed = [&](const std::string& n) {
    const auto it = seen.find(n);
    return it != seen.end() && it->second.judged && it->second.failed;
  };
  auto judged = [&](const std::string& n) {
    const auto it = seen.find(n);
    return it != seen.end() && it->second.judged;
  };
  // Forward: what modules received and produced (and, recorded op by op, what each op
  // produced); backward: the gradients they received and passed on (and each op's).
  // Everything recorded before the first failure passed.
  auto first_failing = [&](std::initializer_list<std::string_view> kinds,
                           bool& any) -> std::optional<DivergencePoint> {
    for (const auto& n : ref.order) {
      const std::string* k = tag(ref, n, "kind");
      if (!k || std::find(kinds.begin(), kinds.end(), *k) == kinds.end() || !seen.count(n))
        continue;
      any = true;
      if (!failed(n)) continue;
      DivergencePoint p;
      p.tensor = n;
      // A module's input (or received gradient) was computed by the code around it.
      const std::string* by = tag(ref, n, "producer");
      if (!by) by = tag(ref, n, "module");
      if (by) p.module = *by;
      if (const std::string* op = tag(ref, n, "op")) p.op = *op;
      if (const auto in = ref.inputs.find(n); in != ref.inputs.end()) {
        // An input the judge never judged (not in the traces, or could not judge it) cannot
        // be called aligned.
        bool known = true;
        for (const auto& i : in->second) {
          if (failed(i)) p.failing_inputs.push_back(i);
          known = known && judged(i);
        }
        if (!p.failing_inputs.empty())
          p.inputs_aligned = false;
        else if (known)
          p.inputs_aligned = true;
      }
      return p;
    }
    return std::nullopt;
  };
  bool any_forward = false, any_backward = false;
  FirstDivergence d;
  d.forward = first_failing({"input", "output", "op"}, any_forward);
  // A parameter's gradient is computed by its module from the gradient it received, as the
  // gradient it passes upstream is: a wrong weight gradient alone makes its module the culprit.
  d.backward =
      first_failing({"grad-output", "grad", "param-grad", "input-grad", "op-grad"}, any_backward);
  if (!any_forward && !any_backward) return std::nullopt;
  return d;
}

namespace {

// How wrong a tensor is for the ranking: could-not-judge first, then ratio / limit (the
// ratio itself where the limit is 0, as for exact), passes without a ratio last.
double ranking_severity(const TensorResult& r) {
  if (r.verdict == VerdictKind::kError) return std::numeric_limits<double>::infinity();
  if (!r.ratio) return 0.0;
  return r.limit && *r.limit != 0 ? *r.ratio / *r.limit : *r.ratio;
}

}  // namespace

std::vector<ModuleRank> rank_modules(const Report& report) {
  struct Entry {
    ModuleRank rank;
    double severity = -1.0;
  };
  std::vector<Entry> entries;
  std::unordered_map<std::string, std::size_t> at;
  for (const auto& r : report.tensors) {
    const auto tag = r.tags.find("module");
    const std::string module = tag == r.tags.end() ? "" : tag->second;
    auto [it, added] = at.emplace(module, entries.size());
    if (added) entries.push_back({ModuleRank{module, r.name, r.ratio, r.limit, true}, -1.0});
    Entry& e = entries[it->second];
    e.rank.aligned = e.rank.aligned && r.verdict == VerdictKind::kPass;
    const double s = ranking_severity(r);
    if (s > e.severity) {
      e.severity = s;
      e.rank.tensor = r.name;
      e.rank.ratio = r.ratio;
      e.rank.limit = r.limit;
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.severity > b.severity; });
  std::vector<ModuleRank> ranked;
  ranked.reserve(entries.size());
  for (auto& e : entries) ranked.push_back(std::move(e.rank));
  return ranked;
}

std::optional<std::string> first_failing(const Report& report) {
  const TensorResult* first = nullptr;
  for (const auto& r : report.tensors) {
    if (r.verdict != VerdictKind::kPass && (!first || r.order < first->order)) first = &r;
  }
  return first ? std::optional(first->name) : std::nullopt;
}

}  // namespace numalign
