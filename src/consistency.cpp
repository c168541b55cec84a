// consistency.cpp: every rank's copy of a replicated tensor against rank 0's, by the fused
// pass (bit differences and ULP distance) and a scan for the first differing element.
#include "numalign/consistency.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "format.hpp"
#include "json.hpp"
#include "numalign/error.hpp"
#include "numalign/metrics.hpp"

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

}  // namespace

ConsistencyReport check_consistent(const std::vector<const Trace*>& ranks,
                                   const std::vector<std::string>& files, const Rule& rule,
                                   const std::vector<std::string>& only, int threads) {
  if (rule.kind != RuleKind::kExact && rule.kind != RuleKind::kUlp) {
    fail("--rule", "consistent takes exact or ulp:K, not " + rule.spec());
  }
  if (ranks.size() < 2) fail("consistent", "needs the traces of at least two ranks");
  ConsistencyReport report;
  report.rule = rule.spec();
  report.files = files;
  auto selected = [&](const std::string& n) {
    return only.empty() || std::any_of(only.begin(), only.end(),
                                       [&](const std::string& g) { return glob_match(g, n); });
  };
  // Every (tensor, rank) pair that can be compared goes through one fused pass.
  std::vector<MetricsInput> inputs;
  std::vector<std::pair<std::size_t, std::size_t>> input_of;  // (tensor, index in differing)
  for (const auto& e : ranks[0]->entries()) {
    if (!selected(e.name)) continue;
    TensorConsistency t{e.name, e.view.shape, true, {}};
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      const TraceEntry* other = ranks[r]->find(e.name);
      RankDifference d;
      d.rank = r;
      if (!other) {
        d.problem = "missing";
      } else if (other->view.dtype != e.view.dtype) {
        d.problem = "dtype " + std::string(name(other->view.dtype)) + ", rank 0 has " +
                    std::string(name(e.view.dtype));
      } else if (other->view.shape != e.view.shape) {
        d.problem = "shape " + format_shape(other->view.shape) + ", rank 0 has " +
                    format_shape(e.view.shape);
      } else if (!is_judgeable(e.view.dtype)) {
        d.problem = "dtype " + std::string(name(e.view.dtype)) + " cannot be compared yet";
      } else if (std::memcmp(other->view.data, e.view.data, e.view.nbytes()) == 0) {
        continue;  // bitwise equal: nothing to measure
      } else {
        input_of.emplace_back(report.tensors.size(), t.differing.size());
        inputs.push_back({&other->view, &e.view, nullptr});
      }
      t.differing.push_back(std::move(d));
    }
    report.tensors.push_back(std::move(t));
  }
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    for (const auto& e : ranks[r]->entries()) {
      if (selected(e.name) && !ranks[0]->find(e.name)) {
        RankDifference d;
        d.rank = r;
        d.problem = "only on this rank, not on rank 0";
        report.tensors.push_back({e.name, e.view.shape, false, {d}});
      }
    }
  }
  MetricOptions mo;
  mo.tol = 0;
  const std::vector<Metrics> metrics = compute_metrics(inputs, mo, threads);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const auto [ti, di] = input_of[k];
    RankDifference& d = report.tensors[ti].differing[di];
    const Metrics& m = metrics[k];
    d.elements_differ = m.bits_differ;
    d.first_index = first_differing(*inputs[k].test, *inputs[k].ref);
    const std::size_t es = element_size(inputs[k].test->dtype);
    d.value = to_double(inputs[k].test->dtype, inputs[k].test->data + d.first_index * es);
    d.rank0_value = to_double(inputs[k].ref->dtype, inputs[k].ref->data + d.first_index * es);
    d.max_ulp = m.floating ? m.ulp.max : static_cast<std::uint64_t>(m.max_abs_ref);
    d.ulp_inf = m.floating && m.ulp.any_inf;
  }
  // Within ulp:K the rank agrees: it is dropped from the differing list.
  for (auto& t : report.tensors) {
    std::erase_if(t.differing, [&](const RankDifference& d) {
      return d.problem.empty() && rule.kind == RuleKind::kUlp && !d.ulp_inf &&
             static_cast<double>(d.max_ulp) <= rule.param;
    });
    t.consistent = t.differing.empty();
  }
  std::stable_partition(report.tensors.begin(), report.tensors.end(),
                        [](const TensorConsistency& t) { return !t.consistent; });
  return report;
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
    out += "  rank " + std::to_string(r) + ": " + report.files[r] + "\n";
  }
  out += "\n";
  std::size_t differ = 0;
  std::unordered_set<std::size_t> ranks;
  for (const auto& t : report.tensors) {
    if (t.consistent) continue;
    ++differ;
    out += "DIFFER  " + t.name + "\n";
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
  detail::JsonWriter w;
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
