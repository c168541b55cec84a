// op_sequence.cpp: where two runs recorded op by op stop running the same ops, so that
// pairing by name does not judge one op against another.
#include "numalign/op_sequence.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace numalign {

namespace {

struct OpName {
  std::string group;  // everything before the last '/'
  std::string op;     // "aten.mm"
  std::size_t k = 0;  // position in the group's sequence
};

// GROUP/OP#k or GROUP/OP#k.i; nothing for any other name.
std::optional<OpName> parse_op_name(std::string_view name) {
  const auto slash = name.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  const std::string_view rest = name.substr(slash + 1);
  const auto hash = rest.rfind('#');
  if (hash == std::string_view::npos || hash == 0) return std::nullopt;
  const char* first = rest.data() + hash + 1;
  const char* last = rest.data() + rest.size();
  std::size_t k = 0;
  auto [p, ec] = std::from_chars(first, last, k);
  if (ec != std::errc() || p == first) return std::nullopt;
  if (p != last) {  // an output index: ".i"
    if (*p != '.') return std::nullopt;
    std::size_t i = 0;
    const char* start = p + 1;
    auto [q, ec2] = std::from_chars(start, last, i);
    if (ec2 != std::errc() || q == start || q != last) return std::nullopt;
  }
  return OpName{std::string(name.substr(0, slash)), std::string(rest.substr(0, hash)), k};
}

using Sequence = std::map<std::size_t, std::string>;  // k -> op

// ref's op tensors (tagged "op" in its metadata), by group.
struct RefOps {
  std::map<std::string, Sequence> sequences;
  std::map<std::string, std::vector<std::pair<std::size_t, std::string>>> tensors;  // (k, name)
  std::vector<std::string> groups;  // in ref's order
};

RefOps ref_ops(const Trace& ref) {
  RefOps ops;
  if (!ref.metadata()) return ops;
  const auto& tags = ref.metadata()->tags;
  if (tags.empty()) return ops;  // no tensor has an op tag
  auto add = [&](const std::string& n) {
    const auto t = tags.find(n);
    if (t == tags.end() || !t->second.count("op")) return;
    auto parsed = parse_op_name(n);
    if (!parsed) return;
    if (!ops.sequences.count(parsed->group)) ops.groups.push_back(parsed->group);
    ops.sequences[parsed->group].emplace(parsed->k, parsed->op);
    ops.tensors[parsed->group].emplace_back(parsed->k, n);
  };
  std::unordered_set<std::string_view> seen;
  for (const auto& n : ref.metadata()->order) {
    if (ref.find(n) && seen.insert(n).second) add(n);
  }
  for (const auto& e : ref.entries()) {  // any not in the recorded order
    if (seen.insert(e.name).second) add(e.name);
  }
  return ops;
}

std::vector<OpSequenceMismatch> mismatches(const RefOps& ops, const Trace& other,
                                           const std::string& role) {
  std::map<std::string, Sequence> theirs;
  for (const auto& e : other.entries()) {
    auto parsed = parse_op_name(e.name);
    if (parsed && ops.sequences.count(parsed->group))
      theirs[parsed->group].emplace(parsed->k, parsed->op);
  }
  std::vector<OpSequenceMismatch> found;
  for (const auto& group : ops.groups) {
    const Sequence& mine = ops.sequences.at(group);
    const Sequence& other_seq = theirs[group];
    // Walk both sequences' positions in order: the first where their ops differ.
    auto a = mine.begin(), b = other_seq.begin();
    std::optional<OpSequenceMismatch> m;
    while (a != mine.end() || b != other_seq.end()) {
      const std::size_t k = a == mine.end()        ? b->first
                            : b == other_seq.end() ? a->first
                                                   : std::min(a->first, b->first);
      const bool in_a = a != mine.end() && a->first == k;
      const bool in_b = b != other_seq.end() && b->first == k;
      const std::string ref_op = in_a ? a->second : "(none)";
      const std::string other_op = in_b ? b->second : "(none)";
      if (ref_op != other_op) {
        m = OpSequenceMismatch{group, k, role, ref_op, other_op, {}};
        break;
      }
      if (in_a) ++a;
      if (in_b) ++b;
    }
    if (!m) continue;
    auto tensors = ops.tensors.at(group);
    std::stable_sort(tensors.begin(), tensors.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [k, name] : tensors) {
      if (k >= m->at) m->unpaired.push_back(name);
    }
    found.push_back(std::move(*m));
  }
  return found;
}

std::size_t ops_from(const RefOps& ops, const OpSequenceMismatch& m) {
  const Sequence& s = ops.sequences.at(m.group);
  return static_cast<std::size_t>(std::distance(s.lower_bound(m.at), s.end()));
}

}  // namespace

std::vector<OpSequenceMismatch> find_op_sequence_mismatches(const Trace& ref, const Trace& other,
                                                            const std::string& role) {
  return mismatches(ref_ops(ref), other, role);
}

void mark_unpaired_ops(const Trace& test, const Trace& ref, const Trace* truth, Report& report) {
  const RefOps ops = ref_ops(ref);
  if (ops.groups.empty()) return;
  std::vector<OpSequenceMismatch> found = mismatches(ops, test, "test");
  if (truth) {
    auto more = mismatches(ops, *truth, "truth");
    found.insert(found.end(), std::make_move_iterator(more.begin()),
                 std::make_move_iterator(more.end()));
  }
  if (found.empty()) return;
  std::unordered_map<std::string_view, std::size_t> at;
  for (std::size_t i = 0; i < report.tensors.size(); ++i) at.emplace(report.tensors[i].name, i);
  // A ref op that a map paired with a test tensor explicitly (test_source) is paired by the
  // map, not by name: test's op sequence says nothing about it.
  auto mapped = [&](const std::string& name) {
    const auto it = at.find(name);
    return it != at.end() && report.tensors[it->second].tags.count("test_source");
  };
  for (auto& m : found) {
    if (m.role != "test") continue;
    std::erase_if(m.unpaired, mapped);
  }
  std::erase_if(found, [](const OpSequenceMismatch& m) {
    return m.role == "test" && m.unpaired.empty() && m.ref_op != "(none)";
  });
  for (const auto& m : found) {
    const std::string where = "op sequences of " + m.group + " stop matching at #" +
                              std::to_string(m.at) + ": ref " + m.ref_op + ", " + m.role + " " +
                              m.other_op;
    const std::size_t n = ops_from(ops, m);
    if (n == 0) {
      report.warnings.push_back(where + "; ref has no ops from there on, so " + m.role +
                                "'s further ops are not judged");
      continue;
    }
    report.warnings.push_back(where + "; the " + std::to_string(n) + " op" + (n == 1 ? "" : "s") +
                              " of ref from there on are not paired (could not judge)");
    for (const auto& name : m.unpaired) {
      const auto it = at.find(name);
      if (it == at.end()) continue;  // not selected (only / --only)
      TensorResult& r = report.tensors[it->second];
      if (r.tags.count("unpaired")) continue;  // the first mismatch found says why
      r.verdict = VerdictKind::kError;
      r.reason = "not paired: " + where;
      r.metrics.reset();
      r.ratio.reset();
      r.limit.reset();
      r.bias_failed = false;
      r.tags["unpaired"] = m.role;
    }
  }
  report.sort();
}

}  // namespace numalign
