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
  // Forward: what modules received and produced; backward: the gradients they received
  // and passed on. Everything recorded before the first failure passed.
  auto first_failing = [&](std::string_view received, std::string_view produced,
                           bool& any) -> std::optional<DivergencePoint> {
    for (const auto& n : ref.order) {
      const std::string* k = tag(ref, n, "kind");
      if (!k || (*k != received && *k != produced) || !verdict.count(n)) continue;
      any = true;
      if (!failed(n)) continue;
      DivergencePoint p;
      p.tensor = n;
      // A module's input (or received gradient) was computed by the code around it.
      const std::string* by = tag(ref, n, "producer");
      if (!by) by = tag(ref, n, "module");
      if (by) p.module = *by;
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
  d.forward = first_failing("input", "output", any_forward);
  d.backward = first_failing("grad-output", "grad", any_backward);
  if (!any_forward && !any_backward) return std::nullopt;
  return d;
}

}  // namespace numalign
