// divergence.cpp: a run fails in many places once one module goes wrong; the first failure
// in execution order, and whether its inputs were still aligned, says where to look.
#include "numalign/divergence.hpp"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace numalign {

namespace {

// The kinds of tensor each direction of execution records.
constexpr std::string_view kForwardKinds[] = {"input", "output", "op"};
constexpr std::string_view kBackwardKinds[] = {"grad-output", "grad", "param-grad", "input-grad",
                                               "op-grad"};

template <std::size_t N>
bool one_of(std::string_view kind, const std::string_view (&kinds)[N]) {
  return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

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
  auto first_failing = [&](auto is_kind, bool& any) -> std::optional<DivergencePoint> {
    for (const auto& n : ref.order) {
      const std::string* k = tag(ref, n, "kind");
      if (!k || !is_kind(*k) || !seen.count(n)) continue;
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
  d.forward =
      first_failing([](std::string_view k) { return one_of(k, kForwardKinds); }, any_forward);
  // A parameter's gradient is computed by its module from the gradient it received, as the
  // gradient it passes upstream is: a wrong weight gradient alone makes its module the culprit.
  d.backward =
      first_failing([](std::string_view k) { return one_of(k, kBackwardKinds); }, any_backward);
  if (!any_forward && !any_backward) return std::nullopt;
  return d;
}

namespace {

// How wrong a tensor is for the ranking: could-not-judge and failures without a ratio
// (missing from test, another shape) first, then ratio / limit (the ratio itself where the
// limit is 0, as for exact), passes without a ratio last.
double ranking_severity(const TensorResult& r) {
  if (r.verdict != VerdictKind::kPass && !r.ratio) return std::numeric_limits<double>::infinity();
  if (!r.ratio) return 0.0;
  return r.limit && *r.limit != 0 ? *r.ratio / *r.limit : *r.ratio;
}

}  // namespace

std::pair<std::size_t, std::size_t> unjudged_by_direction(const Report& report) {
  std::size_t forward = 0, backward = 0;
  for (const auto& r : report.tensors) {
    if (was_judged(r)) continue;
    const auto kind = r.tags.find("kind");
    if (kind == r.tags.end()) continue;
    forward += one_of(kind->second, kForwardKinds);
    backward += one_of(kind->second, kBackwardKinds);
  }
  return {forward, backward};
}

bool module_inside(std::string_view inner, std::string_view outer) {
  if (inner == outer) return false;
  if (outer.empty()) return true;  // the model holds every module
  return inner.size() > outer.size() && inner.starts_with(outer) && inner[outer.size()] == '.';
}

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
  // A parent runs its children: when one of them fails, the parent's failure may be only
  // theirs, however larger its ratio. Failing modules first, the innermost (no failing module
  // inside) ahead of those that hold one, each group worst first.
  std::vector<bool> holds_failing(entries.size(), false);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].rank.aligned) continue;
    for (const Entry& inner : entries) {
      if (!inner.rank.aligned && module_inside(inner.rank.module, entries[i].rank.module)) {
        holds_failing[i] = true;
        break;
      }
    }
  }
  std::vector<std::size_t> order(entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Entry &x = entries[a], &y = entries[b];
    if (x.rank.aligned != y.rank.aligned) return !x.rank.aligned;
    if (holds_failing[a] != holds_failing[b]) return !holds_failing[a];
    return x.severity > y.severity;
  });
  std::vector<ModuleRank> ranked;
  ranked.reserve(entries.size());
  for (const std::size_t i : order) ranked.push_back(std::move(entries[i].rank));
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
