// divergence.cpp: a run fails in many places once one module goes wrong; the first failure
// in execution order, and whether its inputs were still aligned, says where to look.
#include "numalign/divergence.hpp"

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
  std::unordered_map<std::string_view, VerdictKind> verdict;
  for (const auto& r : report.tensors) verdict.emplace(r.name, r.verdict);
  auto failed = [&](const std::string& n) {
    const auto it = verdict.find(n);
    return it != verdict.end() && it->second != VerdictKind::kPass;
  };
  auto first_of_kind = [&](std::string_view kind, bool& any) -> std::optional<DivergencePoint> {
    for (const auto& n : ref.order) {
      const std::string* k = tag(ref, n, "kind");
      if (!k || *k != kind || !verdict.count(n)) continue;
      any = true;
      if (!failed(n)) continue;
      DivergencePoint p;
      p.tensor = n;
      if (const std::string* m = tag(ref, n, "module")) p.module = *m;
      if (const auto in = ref.inputs.find(n); in != ref.inputs.end()) {
        // An input the judge never saw (not in the traces) cannot be called aligned.
        bool known = true;
        for (const auto& i : in->second) {
          if (failed(i)) p.failing_inputs.push_back(i);
          known = known && verdict.count(i);
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
  d.forward = first_of_kind("output", any_forward);
  d.backward = first_of_kind("grad", any_backward);
  if (!any_forward && !any_backward) return std::nullopt;
  return d;
}

}  // namespace numalign
