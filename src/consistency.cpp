// consistency.cpp: every rank's copy of a replicated tensor against rank 0's, by the fused
// pass (bit differences and ULP distance) and a scan for the first differing element.
#include "numalign/consistency.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "fault_guard.hpp"
#include "format.hpp"
#include "json.hpp"
#include "numalign/error.hpp"
#include "numalign/metrics.hpp"
#include "numalign/text.hpp"

namespace numalign {

bool ConsistencyReport::consistent() const {
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const TensorConsistency& t) { return t.consistent; });
}

namespace {

std::uint64_t first_differing(const TensorView& a, const TensorView& b) {
  const std::size_t es = element_size(a.dtype);
  const std::byte* end = a.data + a.nbytes();
  const auto [pa, pb] = std::mismatch(a.data, end, b.data);
  return static_cast<std::uint64_t>(pa - a.data) / es;
}

void check_rule(const Rule& rule) {
  if (rule.kind != RuleKind::kExact && rule.kind != RuleKind::kUlp) {
    fail("--rule", "consistent takes exact or ulp:K, not " + rule.spec());
  }
}

// Both read mapped files: under the fault guard, a file that shrank is an Error naming it,
// not a SIGBUS that kills the process.
bool same_bytes(const TensorView& a, const TensorView& b) {
  bool same = false;
  detail::guarded([&] { same = std::memcmp(a.data, b.data, a.nbytes()) == 0; });
  return same;
}

// The difference of two tensors of one dtype and shape that are not bitwise equal, from
// their metrics.
RankDifference difference_of(const TensorView& mine, const TensorView& rank0, std::size_t rank,
                             const Metrics& m) {
  RankDifference d;
  d.rank = rank;
  d.elements_differ = m.bits_differ;
  detail::guarded([&] {
    d.first_index = first_differing(mine, rank0);
    const std::size_t es = element_size(mine.dtype);
    d.value = to_double(mine.dtype, mine.data + d.first_index * es);
    d.rank0_value = to_double(rank0.dtype, rank0.data + d.first_index * es);
  });
  d.max_ulp = m.ulp.max;  // exact for integers too: their largest difference
  d.ulp_inf = m.floating && m.ulp.any_inf;
  return d;
}

std::optional<RankDifference> uncomparable(const TensorView& v, std::size_t rank) {
  if (is_judgeable(v.dtype)) return std::nullopt;
  RankDifference d;
  d.rank = rank;
  d.problem = "dtype " + std::string(name(v.dtype)) + " cannot be compared yet";
  return d;
}

// Where a rank's summary of a tensor disagrees with rank 0's by dtype or shape.
std::string mismatch(const RankTensorSummary& mine, const RankTensorSummary& rank0) {
  if (mine.dtype != rank0.dtype) {
    return "dtype " + std::string(name(mine.dtype)) + ", rank 0 has " +
           std::string(name(rank0.dtype));
  }
  if (mine.shape != rank0.shape) {
    return "shape " + format_shape(mine.shape) + ", rank 0 has " + format_shape(rank0.shape);
  }
  return "";
}

using SummaryIndex = std::unordered_map<std::string_view, const RankTensorSummary*>;

SummaryIndex index_of(const std::vector<RankTensorSummary>& rank) {
  SummaryIndex index;
  index.reserve(rank.size());
  for (const auto& s : rank) index.emplace(s.name, &s);
  return index;
}

}  // namespace

std::vector<std::string> tensors_to_compare(
    const std::vector<std::vector<RankTensorSummary>>& ranks) {
  std::vector<std::string> names;
  if (ranks.empty()) return names;
  std::vector<SummaryIndex> indexes;
  for (std::size_t r = 1; r < ranks.size(); ++r) indexes.push_back(index_of(ranks[r]));
  for (const auto& s : ranks[0]) {
    const bool differs = std::any_of(indexes.begin(), indexes.end(), [&](const SummaryIndex& i) {
      const auto it = i.find(s.name);
      return it != i.end() && mismatch(*it->second, s).empty() && it->second->digest != s.digest;
    });
    if (differs) names.push_back(s.name);
  }
  return names;
}

std::optional<RankDifference> compare_with_rank0(const TensorView& mine, const TensorView& rank0,
                                                 std::size_t rank, int threads) {
  if (mine.dtype != rank0.dtype || mine.shape != rank0.shape) {
    fail("rank " + std::to_string(rank), "compared with rank 0's tensor of another dtype or shape");
  }
  if (same_bytes(mine, rank0)) return std::nullopt;
  if (auto d = uncomparable(mine, rank)) return d;
  MetricOptions mo;
  mo.tol = 0;
  const std::vector<MetricsInput> input{{&mine, &rank0, nullptr}};
  const std::vector<Metrics> m = compute_metrics(input, mo, threads);
  return difference_of(mine, rank0, rank, m.front());
}

ConsistencyReport consistency_report(const std::vector<std::vector<RankTensorSummary>>& ranks,
                                     const std::vector<MeasuredDifference>& measured,
                                     const Rule& rule, std::vector<std::string> files) {
  check_rule(rule);
  if (ranks.size() < 2) fail("consistent", "needs the traces of at least two ranks");
  ConsistencyReport report;
  report.rule = rule.spec();
  report.files = std::move(files);
  std::map<std::pair<std::string_view, std::size_t>, const RankDifference*> found;
  for (const auto& m : measured) found[{m.name, m.difference.rank}] = &m.difference;
  std::vector<SummaryIndex> indexes;
  for (const auto& rank : ranks) indexes.push_back(index_of(rank));
  for (const auto& s : ranks[0]) {
    TensorConsistency t{s.name, s.shape, true, {}};
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      const auto other = indexes[r].find(s.name);
      RankDifference d;
      d.rank = r;
      if (other == indexes[r].end()) {
        d.problem = "missing";
      } else if (d.problem = mismatch(*other->second, s); d.problem.empty()) {
        const auto it = found.find({s.name, r});
        if (it == found.end()) continue;  // equal
        d = *it->second;
      }
      t.differing.push_back(std::move(d));
    }
    report.tensors.push_back(std::move(t));
  }
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    for (const auto& s : ranks[r]) {
      if (indexes[0].count(s.name)) continue;
      RankDifference d;
      d.rank = r;
      d.problem = "only on this rank, not on rank 0";
      report.tensors.push_back({s.name, s.shape, false, {d}});
    }
  }
  // Within ulp:K the rank agrees: it is dropped from the differing list.
  for (auto& t : report.tensors) {
    std::erase_if(t.differing, [&](const RankDifference& d) {
      return d.problem.empty() && rule.kind == RuleKind::kUlp && !d.ulp_inf &&
             distance_within(d.max_ulp, rule.param);
    });
    t.consistent = t.differing.empty();
  }
  std::stable_partition(report.tensors.begin(), report.tensors.end(),
                        [](const TensorConsistency& t) { return !t.consistent; });
  return report;
}

ConsistencyReport check_consistent(const std::vector<const Trace*>& ranks,
                                   const std::vector<std::string>& files, const Rule& rule,
                                   const std::vector<std::string>& only, int threads) {
  check_rule(rule);
  std::vector<std::vector<RankTensorSummary>> summaries(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& e : ranks[r]->entries()) {
      if (selected_by(only, e.name))
        summaries[r].push_back({e.name, e.view.dtype, e.view.shape, ""});
    }
  }
  // Every (tensor, rank) pair whose bytes differ goes through one fused pass.
  std::vector<MeasuredDifference> measured;
  std::vector<MetricsInput> inputs;
  std::vector<std::pair<std::size_t, std::size_t>> measured_of;  // (index in measured, rank)
  for (const auto& e : ranks[0]->entries()) {
    if (!selected_by(only, e.name)) continue;
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      const TraceEntry* other = ranks[r]->find(e.name);
      if (!other || other->view.dtype != e.view.dtype || other->view.shape != e.view.shape ||
          same_bytes(other->view, e.view)) {
        continue;
      }
      if (auto d = uncomparable(e.view, r)) {
        measured.push_back({e.name, std::move(*d)});
        continue;
      }
      measured_of.emplace_back(measured.size(), r);
      measured.push_back({e.name, RankDifference{}});
      inputs.push_back({&other->view, &e.view, nullptr});
    }
  }
  MetricOptions mo;
  mo.tol = 0;
  const std::vector<Metrics> metrics = compute_metrics(inputs, mo, threads);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const auto [at, rank] = measured_of[k];
    measured[at].difference = difference_of(*inputs[k].test, *inputs[k].ref, rank, metrics[k]);
  }
  return consistency_report(summaries, measured, rule, files);
}

namespace {

std::string describe(const TensorConsistency& t, const RankDifference& d) {
  std::string s = "rank " + std::to_string(d.rank) + ": ";
  if (!d.problem.empty()) return s + d.problem;
  s += std::to_string(d.elements_differ) + " element(s) differ, the first at " +
       format_index(t.shape, d.first_index) + ": " + detail::format_number(d.value) +
       " (rank 0: " + detail::format_number(d.rank0_value) + "); max ulp " +
       (d.ulp_inf ? std::string("inf") : std::to_string(d.max_ulp));
  return s;
}

}  // namespace

std::string render_consistency_text(const ConsistencyReport& report) {
  std::string out = "numalign consistent: " + std::to_string(report.files.size()) +
                    " ranks, rule " + report.rule + "\n";
  for (std::size_t r = 0; r < report.files.size(); ++r) {
    out += "  rank " + std::to_string(r) + ": " + printable(report.files[r]) + "\n";
  }
  out += "\n";
  std::size_t differ = 0;
  std::unordered_set<std::size_t> ranks;
  for (const auto& t : report.tensors) {
    if (t.consistent) continue;
    ++differ;
    out += "DIFFER  " + printable(t.name) + "\n";
    for (const auto& d : t.differing) {
      out += "        " + describe(t, d) + "\n";
      ranks.insert(d.rank);
    }
  }
  const std::size_t n = report.tensors.size();
  if (differ == 0) {
    out += "CONSISTENT: " + std::to_string(n) + " of " + std::to_string(n) + " tensors agree (" +
           report.rule + ") across " + std::to_string(report.files.size()) + " ranks\n";
  } else {
    std::vector<std::size_t> list(ranks.begin(), ranks.end());
    std::sort(list.begin(), list.end());
    std::string which;
    for (std::size_t r : list) which += (which.empty() ? "" : ", ") + std::to_string(r);
    out += "NOT CONSISTENT: " + std::to_string(differ) + " of " + std::to_string(n) +
           " tensors differ from rank 0 on rank(s) " + which + "\n";
  }
  return out;
}

std::string render_consistency_json(const ConsistencyReport& report) {
  detail::JsonWriter w(detail::JsonStyle::kTerminalSafe);
  w.begin_object();
  w.key("consistent").boolean(report.consistent());
  w.key("rule").string(report.rule);
  w.key("files").begin_array();
  for (const auto& f : report.files) w.string(f);
  w.end_array();
  w.key("tensors").begin_array();
  for (const auto& t : report.tensors) {
    w.begin_object();
    w.key("name").string(t.name);
    w.key("consistent").boolean(t.consistent);
    w.key("differing").begin_array();
    for (const auto& d : t.differing) {
      w.begin_object();
      w.key("rank").integer(d.rank);
      if (!d.problem.empty()) {
        w.key("problem").string(d.problem);
      } else {
        w.key("elements_differ").integer(d.elements_differ);
        w.key("first_index").string(format_index(t.shape, d.first_index));
        w.key("value").number(d.value);
        w.key("rank0_value").number(d.rank0_value);
        w.key("max_ulp");
        if (d.ulp_inf)
          w.null();
        else
          w.integer(d.max_ulp);
      }
      w.end_object();
    }
    w.end_array();
    w.end_object();
  }
  w.end_array();
  w.end_object();
  return w.take() + "\n";
}

}  // namespace numalign
