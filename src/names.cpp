// names.cpp: see numalign/names.hpp.
#include "numalign/names.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "numalign/text.hpp"

namespace numalign {

namespace {

// Execution order when the metadata records it (names it lists that the trace lacks are
// skipped, and names it does not list follow in file order), else file order.
std::vector<const TraceEntry*> in_order(const Trace& trace) {
  std::vector<const TraceEntry*> out;
  std::unordered_set<const TraceEntry*> placed;
  if (trace.metadata()) {
    for (const auto& n : trace.metadata()->order) {
      const TraceEntry* e = trace.find(n);
      if (e && placed.insert(e).second) out.push_back(e);
    }
  }
  for (const auto& e : trace.entries()) {
    if (placed.insert(&e).second) out.push_back(&e);
  }
  return out;
}

std::string tag_of(const Trace& trace, const std::string& name, const char* key) {
  if (!trace.metadata()) return "";
  const auto t = trace.metadata()->tags.find(name);
  if (t == trace.metadata()->tags.end()) return "";
  const auto v = t->second.find(key);
  return v == t->second.end() ? "" : v->second;
}

}  // namespace

std::string render_names(const Trace& trace) {
  struct Group {
    std::string title;
    std::string prefix;  // stripped from its names ("" when none)
    std::vector<const TraceEntry*> tensors;
  };
  const bool tagged = trace.metadata() && !trace.metadata()->tags.empty();
  std::vector<Group> groups;
  std::unordered_map<std::string, std::size_t> at;
  for (const TraceEntry* e : in_order(trace)) {
    std::string key, title, prefix;
    if (tagged) {
      const bool has_tag = trace.metadata()->tags.count(e->name) > 0;
      key = has_tag ? tag_of(trace, e->name, "module") : "\x01untagged";
      title = !has_tag ? "(untagged)" : key.empty() ? "(model)" : key;
      prefix = key.empty() || !has_tag ? "" : key + ".";
    } else {
      const std::size_t dot = e->name.rfind('.');
      key = dot == std::string::npos ? "" : e->name.substr(0, dot);
      title = key.empty() ? "(top level)" : key;
      prefix = key.empty() ? "" : key + ".";
    }
    auto [it, added] = at.emplace(key, groups.size());
    if (added) groups.push_back({title, prefix, {}});
    groups[it->second].tensors.push_back(e);
  }
  std::string out = std::to_string(trace.entries().size()) + " tensors in " +
                    std::to_string(groups.size()) +
                    (tagged ? " modules, in execution order" : " groups by dotted prefix") +
                    "; a name is its group's path followed by what is shown (.out, ...)\n";
  for (const Group& g : groups) {
    out += "\n" + printable(g.title) + "\n";
    for (const TraceEntry* e : g.tensors) {
      const std::string_view n = e->name;
      const bool strip = !g.prefix.empty() && n.starts_with(g.prefix) && n.size() > g.prefix.size();
      const std::string shown = strip ? "." + std::string(n.substr(g.prefix.size())) : e->name;
      const std::string kind = tagged ? tag_of(trace, e->name, "kind") : "";
      out += "  " + pad_columns(printable(shown), 36) + " " +
             pad_columns(kind.empty() ? "-" : printable(kind), 12) + " " +
             pad_columns(name(e->view.dtype), 6) + " " + format_shape(e->view.shape) + "\n";
    }
  }
  return out;
}

}  // namespace numalign
