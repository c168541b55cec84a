// report.cpp: ordering and the three renderings of a Report (text, JSON, JUnit XML).
#include "numalign/report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "atomic_file.hpp"
#include "background_appender.hpp"
#include "format.hpp"
#include "json.hpp"
#include "numalign/divergence.hpp"
#include "numalign/text.hpp"
#include "parallel.hpp"

namespace numalign {

using detail::format_number;

bool was_judged(const TensorResult& r) {
  return r.verdict != VerdictKind::kError &&
         !(r.verdict == VerdictKind::kFail && r.reason == kMissingFromTest);
}

std::size_t Report::count(VerdictKind k) const {
  return static_cast<std::size_t>(std::count_if(
      tensors.begin(), tensors.end(), [k](const TensorResult& r) { return r.verdict == k; }));
}

ExitCode Report::exit_code() const {
  if (!could_not_judge.empty() || count(VerdictKind::kError)) return kCouldNotJudge;
  return count(VerdictKind::kFail) ? kNotAligned : kAligned;
}

double severity(const TensorResult& r) {
  if (!r.ratio || !r.limit) return std::numeric_limits<double>::infinity();
  const double ratio = *r.ratio, limit = *r.limit;
  if (std::isnan(ratio)) return std::numeric_limits<double>::infinity();
  if (limit > 0) {
    const double s = ratio / limit;  // NaN for an infinite ratio over an infinite limit
    return std::isnan(s) ? std::numeric_limits<double>::infinity() : s;
  }
  if (std::isnan(limit)) return std::numeric_limits<double>::infinity();
  return ratio > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

std::vector<TagGroup> group_by_tags(const Report& report, const std::vector<std::string>& keys) {
  std::vector<const TensorResult*> in_order;
  in_order.reserve(report.tensors.size());
  for (const auto& r : report.tensors) in_order.push_back(&r);
  std::stable_sort(
      in_order.begin(), in_order.end(),
      [](const TensorResult* a, const TensorResult* b) { return a->order < b->order; });
  std::vector<TagGroup> groups;
  std::map<std::vector<std::string>, std::size_t> at;
  for (const TensorResult* r : in_order) {
    std::vector<std::string> values;
    for (const auto& k : keys) {
      const auto v = r->tags.find(k);
      values.push_back(v == r->tags.end() ? "" : v->second);
    }
    auto [it, added] = at.emplace(values, groups.size());
    if (added) {
      groups.emplace_back();
      groups.back().values = std::move(values);
    }
    TagGroup& g = groups[it->second];
    ++g.tensors;
    ++(r->verdict == VerdictKind::kPass   ? g.passed
       : r->verdict == VerdictKind::kFail ? g.failed
                                          : g.errors);
    if (r->ratio) g.max_ratio = g.max_ratio ? std::max(*g.max_ratio, *r->ratio) : *r->ratio;
  }
  return groups;
}

const TensorResult* Report::worst() const {
  const TensorResult* w = nullptr;
  for (const auto& r : tensors) {
    if (r.verdict == VerdictKind::kPass) continue;
    if (!w || severity(r) > severity(*w)) w = &r;
  }
  return w;
}

namespace {

// Puts the result at by[p] at position p, where by[0, front) are the results that do not pass
// and by[front, n) the passes in their present order (so by[p] <= p there): those that do not
// pass are set aside, the passes slide back in one sweep, and the set-aside results fill the
// front. Moving in cycles would jump across the results at every step.
void slide_passes_back(std::vector<TensorResult>& tensors, const std::vector<std::size_t>& by,
                       std::size_t front) {
  std::vector<TensorResult> set_aside;
  set_aside.reserve(front);
  for (std::size_t p = 0; p < front; ++p) set_aside.push_back(std::move(tensors[by[p]]));
  // Positions are written from the top down: a result is read before its position is written.
  for (std::size_t p = by.size(); p-- > front;) {
    if (by[p] != p) tensors[p] = std::move(tensors[by[p]]);
  }
  std::move(set_aside.begin(), set_aside.end(), tensors.begin());
}

// Puts the result at by[p] at position p, for any permutation (`by` is used up): in place,
// cycle by cycle, as a sorted copy would touch as much new memory again.
void move_in_cycles(std::vector<TensorResult>& tensors, std::vector<std::size_t>& by) {
  for (std::size_t start = 0; start < by.size(); ++start) {
    if (by[start] == start) continue;
    TensorResult held = std::move(tensors[start]);
    std::size_t at = start;
    while (by[at] != start) {
      tensors[at] = std::move(tensors[by[at]]);
      const std::size_t next = by[at];
      by[at] = at;
      at = next;
    }
    tensors[at] = std::move(held);
    by[at] = at;
  }
}

}  // namespace

void Report::sort() {
  auto rank = [](VerdictKind k) {
    return k == VerdictKind::kError ? 0 : k == VerdictKind::kFail ? 1 : 2;
  };
  // The results that do not pass are few: they are sorted on keys apart from the results (a
  // comparison then reads 32 bytes that lie together, not two 600-byte results far apart).
  // The passes only need ordering by `order`, which judge already gives them.
  struct Key {
    int rank;
    double severity;  // failures only
    std::size_t order;
    std::size_t at;
  };
  std::vector<Key> not_passing;
  std::vector<std::size_t> passes;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorResult& r = tensors[i];
    if (r.verdict == VerdictKind::kPass) {
      passes.push_back(i);
    } else {
      not_passing.push_back(
          {rank(r.verdict), r.verdict == VerdictKind::kFail ? severity(r) : 0.0, r.order, i});
    }
  }
  std::stable_sort(not_passing.begin(), not_passing.end(), [](const Key& a, const Key& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.rank == 1 && a.severity != b.severity) return a.severity > b.severity;
    return a.order < b.order;
  });
  const auto pass_order = [&](std::size_t i, std::size_t j) {
    return tensors[i].order < tensors[j].order;
  };
  const bool passes_in_order = std::is_sorted(passes.begin(), passes.end(), pass_order);
  if (!passes_in_order) std::stable_sort(passes.begin(), passes.end(), pass_order);
  std::vector<std::size_t> by;  // result positions in sorted order
  by.reserve(tensors.size());
  for (const Key& k : not_passing) by.push_back(k.at);
  by.insert(by.end(), passes.begin(), passes.end());
  if (passes_in_order) {
    slide_passes_back(tensors, by, not_passing.size());
  } else {
    move_in_cycles(tensors, by);
  }
}

const char* verdict_word(VerdictKind k) {
  return k == VerdictKind::kPass ? "pass" : k == VerdictKind::kFail ? "fail" : "error";
}

namespace {

// Names longer than `width` keep their head and tail: the tail is what tells tensors apart.
std::string fit(const std::string& s, std::size_t width) { return fit_columns(s, width); }

std::string pad_left(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

// Appends `text` indented under a table row, wrapped at spaces to fit 100 columns.
void append_detail(std::string& out, const std::string& text) {
  constexpr std::size_t kIndent = 9, kWidth = 100 - kIndent;
  std::size_t start = 0;
  while (text.size() - start > kWidth) {
    std::size_t cut = text.rfind(' ', start + kWidth);
    if (cut == std::string::npos || cut <= start) {  // one long word: cut between characters
      cut = start + kWidth;
      while (cut > start + 1 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    }
    out += std::string(kIndent, ' ') + text.substr(start, cut - start) + "\n";
    start = cut < text.size() && text[cut] == ' ' ? cut + 1 : cut;
  }
  out += std::string(kIndent, ' ') + text.substr(start) + "\n";
}

std::string opt_number(const std::optional<double>& v) { return v ? format_number(*v) : "-"; }

}  // namespace

namespace {

// The first divergence the verdict line names: forward's, else backward's; null when none.
const DivergencePoint* headline_divergence(const Report& r) {
  if (!r.first_divergence) return nullptr;
  if (r.first_divergence->forward) return &*r.first_divergence->forward;
  if (r.first_divergence->backward) return &*r.first_divergence->backward;
  return nullptr;
}

}  // namespace

std::string render_summary(const Report& r) {
  const std::size_t n = r.tensors.size(), f = r.count(VerdictKind::kFail),
                    e = r.count(VerdictKind::kError);
  const bool whole = !r.could_not_judge.empty();
  std::string s = r.aligned() ? "ALIGNED" : (e || whole ? "COULD NOT JUDGE" : "NOT ALIGNED");
  if (whole) s += " (" + printable(r.could_not_judge.front()) + ")";
  s += ": " + std::to_string(n - f - e) + " of " + std::to_string(n) + " tensors pass";
  if (f) s += ", " + std::to_string(f) + " fail";
  if (e) s += ", " + std::to_string(e) + " could not be judged";
  // Where it went wrong first, ahead of the worst tensor (which often only inherited it).
  if (const DivergencePoint* p = headline_divergence(r)) {
    s += std::string(p->inputs_aligned.value_or(false) ? "; culprit: module "
                                                       : "; first divergence: module ") +
         (p->module.empty() ? "(model)" : printable(p->module)) + " (" +
         (r.first_divergence->forward ? "forward" : "backward") + ", " + printable(p->tensor) + ")";
  } else if (!r.ranking.empty() && !r.ranking.front().aligned) {
    const ModuleRank& m = r.ranking.front();
    s += "; worst module in isolation: " + (m.module.empty() ? "(model)" : printable(m.module));
  }
  if (const TensorResult* w = r.worst()) {
    s += "; worst: " + printable(w->name);
    if (w->ratio && w->limit)
      s += " (ratio " + format_number(*w->ratio) + ", limit " + format_number(*w->limit) + ")";
  }
  return s;
}

namespace {

// "first divergence, forward: layers.1.mlp.out (module layers.1.mlp): its inputs were
// aligned, so the module itself is the first to go wrong"
std::string divergence_line(const char* direction, const std::optional<DivergencePoint>& p,
                            std::size_t unjudged) {
  std::string line = std::string("first divergence, ") + direction + ": ";
  if (!p && unjudged) {
    return line + "none judged to fail (" + std::to_string(unjudged) +
           " tensor(s) not judged: missing from test or could not be judged)\n";
  }
  if (!p) return line + "none (every tensor passes)\n";
  line += printable(p->tensor) + " (module " +
          (p->module.empty() ? "(model)" : printable(p->module)) +
          (p->op.empty() ? "" : ", op " + printable(p->op)) + ")";
  if (!p->inputs_aligned)
    return line + ": its inputs were not all judged (not in the traces, or could not be judged)\n";
  if (*p->inputs_aligned)
    return line + ": its inputs pass, so this " + (p->op.empty() ? "module" : "op") +
           " is the culprit\n";
  std::string which;
  for (std::size_t i = 0; i < p->failing_inputs.size() && i < 3; ++i)
    which += (i ? ", " : "") + printable(p->failing_inputs[i]);
  if (p->failing_inputs.size() > 3) which += ", ...";
  return line + ": inherited, its inputs already fail (" + which + ")\n";
}

}  // namespace

std::string divergence_text(const FirstDivergence& d, std::size_t unjudged_forward,
                            std::size_t unjudged_backward) {
  std::string text = divergence_line("forward", d.forward, unjudged_forward) +
                     divergence_line("backward", d.backward, unjudged_backward);
  // Backward computes from the forward pass's saved tensors: a module whose own inputs pass
  // backward may still be handed wrong saved activations by a forward culprit.
  if (d.forward && d.forward->inputs_aligned == true && d.backward) {
    text +=
        "  (backward runs on the forward pass's saved tensors: after a forward culprit, a "
        "backward divergence may be its consequence; fix forward first)\n";
  }
  return text;
}

// "modules in isolation ...": the ranking, worst first, ahead of everything else. A worst
// tensor without a ratio (missing from test, could not judge) says why; a failing module that
// holds a failing one names it.
std::string ranking_text(const Report& report) {
  const std::vector<ModuleRank>& ranking = report.ranking;
  std::string out = "modules in isolation (each on the truth's inputs), worst first:\n";
  for (std::size_t i = 0; i < ranking.size(); ++i) {
    const ModuleRank& m = ranking[i];
    out += pad_left(std::to_string(i + 1), 5) + ". " + fit(m.aligned ? "pass" : "FAIL", 4) + "  " +
           (m.module.empty() ? "(model)" : printable(m.module));
    std::string why = printable(m.tensor);
    if (m.ratio) {
      out += "  ratio " + opt_number(m.ratio) + " / limit " + opt_number(m.limit);
    } else if (m.aligned) {
      // a pass without a ratio: nothing to say
    } else if (const auto t =  // a failure without a ratio: rare, so looked up here
               std::find_if(report.tensors.begin(), report.tensors.end(),
                            [&](const TensorResult& r) { return r.name == m.tensor; });
               t != report.tensors.end() && t->verdict != VerdictKind::kPass) {
      why += ": " + printable(t->reason);
    }
    if (!m.aligned) {
      for (const ModuleRank& inner : ranking) {
        if (!inner.aligned && module_inside(inner.module, m.module)) {
          why += "; a module inside it fails: " + printable(inner.module);
          break;
        }
      }
    }
    out += "  (" + why + ")\n";
  }
  return out + "\n";
}

std::string render_text(const Report& report, bool verbose) {
  std::string out;
  if (!report.could_not_judge.empty()) {  // the reason the verdict means nothing comes first
    out += "could not judge this run:\n";
    for (const auto& why : report.could_not_judge) out += "  - " + printable(why) + "\n";
    out += "\n";
  }
  if (report.first_failing)
    out += "first tensor that differs: " + printable(*report.first_failing) + "\n\n";
  if (!report.ranking.empty()) out += ranking_text(report);
  out += "numalign judge\n";
  std::size_t start = 0;
  while (start < report.title.size()) {  // one line per trace
    const std::size_t end = std::min(report.title.find('\n', start), report.title.size());
    out += "  " + printable(report.title.substr(start, end - start)) + "\n";
    start = end + 1;
  }
  if (!report.settings.empty()) out += "  settings: " + printable(report.settings) + "\n";
  out += "\n";
  if (report.first_divergence) {
    const auto [forward, backward] = unjudged_by_direction(report);
    out += divergence_text(*report.first_divergence, forward, backward) + "\n";
  }
  constexpr std::size_t kName = 38;
  out += "verdict  " + fit("tensor", kName) + " " + fit("rule", 9) + pad_left("ratio", 10) +
         pad_left("limit", 8) + pad_left("max ulp", 9) + pad_left("diff %", 8) + "\n";
  std::size_t passes_shown = 0;
  const std::size_t kMaxPasses = verbose ? SIZE_MAX : 50;
  std::size_t passes_hidden = 0;
  for (const auto& r : report.tensors) {
    if (r.verdict == VerdictKind::kPass && passes_shown >= kMaxPasses) {
      ++passes_hidden;
      continue;
    }
    passes_shown += r.verdict == VerdictKind::kPass;
    std::string word = verdict_word(r.verdict);
    for (auto& c : word) c = static_cast<char>(std::toupper(c));
    std::string max_ulp = "-", diff = "-";
    if (r.metrics) {
      if (r.metrics->floating)
        max_ulp =
            r.metrics->ulp.any_inf ? "inf" : format_number(static_cast<double>(r.metrics->ulp.max));
      if (r.metrics->numel) {
        diff = format_number(100.0 * static_cast<double>(r.metrics->values_differ) /
                             static_cast<double>(r.metrics->numel));
      }
    }
    // A long module path loses whole components, never a layer index; verbose, or when that
    // is not enough, the name is whole on the row and the numbers go on the next line.
    const std::string shown = printable(r.name);
    const std::string name = verbose ? shown : shorten_path(shown, kName);
    out += fit(word, 8) + " ";
    if (display_width(name) > kName)
      out += name + "\n" + std::string(9 + kName, ' ');
    else
      out += fit(name, kName);
    out += " " + fit(r.rule, 9) + pad_left(opt_number(r.ratio), 10) +
           pad_left(opt_number(r.limit), 8) + pad_left(max_ulp, 9) + pad_left(diff, 8) + "\n";
    // A pass whose ratio is above its limit (same()'s allclose fast path decided it) says why
    // it passed, as every failure says why it failed.
    const bool pass_above_limit =
        r.verdict == VerdictKind::kPass && r.ratio && r.limit && *r.ratio > *r.limit;
    if (r.verdict != VerdictKind::kPass || verbose || pass_above_limit) {
      append_detail(out, printable(r.reason));
      // A tensor paired through a map: where in test it was read.
      if (const auto src = r.tags.find("test_source"); src != r.tags.end())
        append_detail(out, "test: " + printable(src->second));
      if (r.metrics && r.metrics->has_truth && r.verdict != VerdictKind::kPass) {
        const Metrics& m = *r.metrics;
        append_detail(out, "error " + format_number(m.error) + ", baseline " +
                               format_number(m.baseline) + ", max |test-truth| " +
                               format_number(m.max_abs_truth) + " at " +
                               format_index(r.shape, m.max_abs_truth_index) + ", error balance " +
                               format_number(m.eb_test) + " (ref " + format_number(m.eb_ref) + ")");
      }
    }
    if (!r.override_reason.empty())
      append_detail(out, "override reason: " + printable(r.override_reason));
  }
  if (passes_hidden) {
    out += "         ... " + std::to_string(passes_hidden) +
           " more passing tensors (--verbose lists all)\n";
  }
  if (!report.warnings.empty()) {
    out += "\nwarnings:\n";
    for (const auto& w : report.warnings) out += "  - " + printable(w) + "\n";
  }
  out += "\n" + render_summary(report) + "\n";
  return out;
}

namespace {

// unravel_index's numbers, without a vector per index for the common ranks.
void write_index(detail::JsonWriter& w, const Shape& shape, std::uint64_t flat) {
  constexpr std::size_t kRanks = 8;
  w.begin_array();
  if (shape.size() > kRanks) {
    for (auto v : unravel_index(shape, flat)) w.integer(v);
  } else if (std::array<std::uint64_t, kRanks> idx; unravel_index_into(shape, flat, idx)) {
    for (std::size_t i = 0; i < shape.size(); ++i) w.integer(idx[i]);
  }
  w.end_array();
}

// The histogram's bin labels, made once.
const std::array<std::string, kUlpBins>& ulp_bin_labels() {
  static const auto labels = [] {
    std::array<std::string, kUlpBins> out;
    for (int b = 0; b < kUlpBins; ++b) out[b] = ulp_bin_label(b);
    return out;
  }();
  return labels;
}

void write_optional(detail::JsonWriter& w, detail::PlainKey key, const std::optional<double>& v) {
  w.field(key);
  if (v)
    w.number(*v);
  else
    w.null();
}

void write_tensor(detail::JsonWriter& w, const TensorResult& r) {
  w.begin_object();
  w.field("name").string(r.name);
  // Paired through a map: where in test it was read (absent for namesakes).
  if (const auto src = r.tags.find("test_source"); src != r.tags.end())
    w.field("test_source").string(src->second);
  w.field("verdict").string(verdict_word(r.verdict));
  w.field("rule").string(r.rule);
  w.field("reason").string(r.reason);
  w.field("override_reason");
  if (r.override_reason.empty())
    w.null();
  else
    w.string(r.override_reason);
  w.field("dtype");
  if (r.dtype)
    w.string(name(*r.dtype));
  else
    w.null();
  w.field("shape").begin_array();
  for (auto d : r.shape) w.integer(d);
  w.end_array();
  const Metrics* m = r.metrics ? &*r.metrics : nullptr;
  w.field("numel");
  if (m)
    w.integer(m->numel);
  else
    w.null();
  write_optional(w, "ratio", r.ratio);
  write_optional(w, "limit", r.limit);
  const bool truth = m && m->has_truth;
  write_optional(w, "error", truth ? std::optional(m->error) : std::nullopt);
  write_optional(w, "baseline", truth ? std::optional(m->baseline) : std::nullopt);
  write_optional(w, "max_abs", truth ? std::optional(m->max_abs_truth) : std::nullopt);
  w.field("max_abs_index");
  if (truth)
    write_index(w, r.shape, m->max_abs_truth_index);
  else
    w.null();
  write_optional(w, "max_abs_ref", m ? std::optional(m->max_abs_ref) : std::nullopt);
  w.field("max_abs_ref_index");
  if (m)
    write_index(w, r.shape, m->max_abs_ref_index);
  else
    w.null();
  write_optional(w, "rel_l2", truth ? std::optional(m->rel_l2) : std::nullopt);
  write_optional(w, "cosine", truth ? std::optional(m->cosine) : std::nullopt);
  w.field("bias");
  if (truth && m->floating) {
    w.begin_object();
    w.field("mean_error").number(m->mean_error);
    w.field("eb_test").number(m->eb_test);
    w.field("eb_ref").number(m->eb_ref);
    w.field("would_fail").boolean(r.bias_failed);
    w.end_object();
  } else {
    w.null();
  }
  const bool ulp = m && m->floating;
  w.field("max_ulp");
  if (ulp && !m->ulp.any_inf)
    w.integer(m->ulp.max);
  else
    w.null();
  w.field("max_ulp_index");
  if (ulp && !m->ulp.any_inf)
    write_index(w, r.shape, m->ulp.max_index);
  else
    w.null();
  write_optional(w, "frac_diff",
                 m && m->numel ? std::optional(static_cast<double>(m->values_differ) /
                                               static_cast<double>(m->numel))
                               : std::nullopt);
  w.field("ulp_hist");
  if (ulp) {
    w.begin_object();
    for (int b = 0; b < kUlpBins; ++b) {
      if (m->ulp.hist[b]) w.key(ulp_bin_labels()[b]).integer(m->ulp.hist[b]);
    }
    w.end_object();
  } else {
    w.null();
  }
  w.field("nonfinite");
  if (m) {
    w.begin_object();
    const std::pair<detail::PlainKey, const NonFinite*> parts[] = {
        {detail::PlainKey("test"), &m->test_nonfinite},
        {detail::PlainKey("ref"), &m->ref_nonfinite},
        {detail::PlainKey("truth"), &m->truth_nonfinite}};
    for (const auto& [k, nf] : parts) {
      if (nf == &m->truth_nonfinite && !m->has_truth) continue;
      w.field(k).begin_object().field("nan").integer(nf->nan).field("inf").integer(nf->inf);
      w.end_object();
    }
    w.end_object();
  } else {
    w.null();
  }
  w.end_object();
}

// The tensors' objects, formatted in blocks on all cores and handed on in order: formatting
// is most of the time of a report of many tensors (about 670 bytes and 20 numbers a tensor).
// A wave of at most 32 blocks is formatted at once, so that the text held stays a few tens
// of megabytes whatever the cores.
void write_tensors(detail::JsonWriter& w, const std::vector<TensorResult>& tensors,
                   const std::function<void(std::string_view)>& sink, int threads_asked) {
  constexpr std::size_t kBlock = 1024;
  const int threads = detail::resolve_threads(threads_asked);
  const std::size_t blocks = (tensors.size() + kBlock - 1) / kBlock;
  const std::size_t wave = std::min<std::size_t>(32, 4 * static_cast<std::size_t>(threads));
  std::vector<std::string> texts(std::min(wave, blocks));
  for (std::size_t first = 0; first < blocks; first += wave) {
    const std::size_t count = std::min(wave, blocks - first);
    detail::parallel_for(count, threads, [&](std::size_t j) {
      auto items = detail::JsonWriter::items(detail::JsonStyle::kTerminalSafe);
      items.reserve(kBlock * 768);  // about a tensor's text each: no regrowth
      const std::size_t begin = (first + j) * kBlock;
      const std::size_t end = std::min(tensors.size(), begin + kBlock);
      for (std::size_t i = begin; i < end; ++i) write_tensor(items, tensors[i]);
      texts[j] = items.take();
    });
    for (std::size_t j = 0; j < count; ++j) w.raw_to(sink, texts[j]);
  }
}

}  // namespace

void render_json(const Report& report, const std::function<void(std::string_view)>& sink,
                 int threads) {
  detail::JsonWriter w(detail::JsonStyle::kTerminalSafe);
  w.begin_object();
  w.key("aligned").boolean(report.aligned());
  w.key("summary").begin_object();
  w.key("tensors").integer(report.tensors.size());
  w.key("passed").integer(report.count(VerdictKind::kPass));
  w.key("failed").integer(report.count(VerdictKind::kFail));
  w.key("errors").integer(report.count(VerdictKind::kError));
  const TensorResult* worst = report.worst();
  double max_ratio = -1;
  const TensorResult* max_ratio_of = nullptr;
  for (const auto& r : report.tensors) {
    if (r.ratio && !std::isnan(*r.ratio) && *r.ratio > max_ratio && allowance_from_ref(r.rule)) {
      max_ratio = *r.ratio;
      max_ratio_of = &r;
    }
  }
  w.key("max_ratio");
  if (max_ratio_of)
    w.number(max_ratio);
  else
    w.null();
  w.key("worst");
  if (worst)
    w.string(worst->name);
  else
    w.null();
  w.key("settings").string(report.settings);
  w.end_object();
  w.key("warnings").begin_array();
  for (const auto& s : report.warnings) w.string(s);
  w.end_array();
  w.key("could_not_judge").begin_array();
  for (const auto& s : report.could_not_judge) w.string(s);
  w.end_array();
  if (report.first_divergence) {
    w.key("first_divergence").begin_object();
    const std::pair<const char*, const std::optional<DivergencePoint>*> directions[] = {
        {"forward", &report.first_divergence->forward},
        {"backward", &report.first_divergence->backward}};
    for (const auto& [direction, point] : directions) {
      w.key(direction);
      if (!*point) {
        w.null();
        continue;
      }
      const DivergencePoint& p = **point;
      w.begin_object();
      w.key("tensor").string(p.tensor);
      w.key("module").string(p.module);
      if (!p.op.empty()) w.key("op").string(p.op);
      w.key("inputs_aligned");
      if (p.inputs_aligned)
        w.boolean(*p.inputs_aligned);
      else
        w.null();
      w.key("failing_inputs").begin_array();
      for (const auto& n : p.failing_inputs) w.string(n);
      w.end_array();
      w.end_object();
    }
    w.end_object();
  }
  if (!report.ranking.empty()) {
    w.key("ranking").begin_array();
    for (const auto& m : report.ranking) {
      w.begin_object();
      w.key("module").string(m.module);
      w.key("tensor").string(m.tensor);
      write_optional(w, "ratio", m.ratio);
      write_optional(w, "limit", m.limit);
      w.key("aligned").boolean(m.aligned);
      w.end_object();
    }
    w.end_array();
  }
  if (report.first_failing) w.key("first_failing").string(*report.first_failing);
  w.key("tensors").begin_array();
  write_tensors(w, report.tensors, sink, threads);
  w.end_array();
  w.end_object();
  w.flush_to(sink);
  sink("\n");
}

std::string render_json(const Report& report) {
  std::string out;
  render_json(report, [&out](std::string_view piece) { out += piece; });
  return out;
}

void write_json_file(const Report& report, const std::string& path, int threads) {
  detail::AtomicFile out(path);
  if (out.written_through()) {  // stdout, a FIFO, a device: in order, on this thread
    render_json(
        report, [&out](std::string_view piece) { out.write(piece); }, threads);
    out.commit();
    return;
  }
  // Into the temporary file on a thread of its own, its writeback to disk started as it goes:
  // the next tensors are formatted meanwhile, and the final fsync has little left to wait
  // for (a million tensors make 700 MB).
  {
    detail::BackgroundAppender writer(out.fd(), 0, path,
                                      {std::size_t{1} << 20, 8, 0, "the report"});
    render_json(
        report, [&writer](std::string_view piece) { writer.append(piece.data(), piece.size()); },
        threads);
    writer.finish();
  }
  out.commit();
}

namespace {

// `classname`: every test case's, or "" for "numalign.<rule>" (the CLI's one report).
void append_junit_suite(std::string& out, const std::string& name, const Report& report,
                        const std::string& classname) {
  const auto class_of = [&](const std::string& rule) {
    return detail::markup_escape(classname.empty() ? "numalign." + rule : classname,
                                 detail::Markup::kXml);
  };
  using detail::Markup;
  const std::size_t f = report.count(VerdictKind::kFail), e = report.count(VerdictKind::kError);
  const std::size_t whole = report.could_not_judge.empty() ? 0 : 1;
  out += "<testsuite name=\"" + detail::markup_escape(name, Markup::kXml) + "\" tests=\"" +
         std::to_string(report.tensors.size() + whole) + "\" failures=\"" + std::to_string(f) +
         "\" errors=\"" + std::to_string(e + whole) + "\">\n";
  if (!report.warnings.empty()) {
    out += "<system-out>";
    for (const auto& w : report.warnings)
      out += detail::markup_escape("warning: " + w, Markup::kXml) + "\n";
    out += "</system-out>\n";
  }
  if (whole) {  // the run itself, so that a CI dashboard shows an error and not a green 0/0
    const std::string why = detail::joined(report.could_not_judge, "; ");
    out += "<testcase classname=\"" + (classname.empty() ? "numalign" : class_of("")) +
           "\" name=\"(the run)\"><error message=\"" +
           detail::markup_escape("could not judge: " + why, Markup::kXml) + "\"/></testcase>\n";
  }
  for (const auto& r : report.tensors) {
    out += "<testcase classname=\"" + class_of(r.rule) + "\" name=\"" +
           detail::markup_escape(r.name, Markup::kXml) + "\">";
    const std::string detail =
        r.reason + (r.ratio && r.limit ? " (ratio " + format_number(*r.ratio) + ", limit " +
                                             format_number(*r.limit) + ")"
                                       : std::string());
    if (r.verdict == VerdictKind::kFail) {
      out += "<failure message=\"" + detail::markup_escape(detail, Markup::kXml) + "\"/>";
    } else if (r.verdict == VerdictKind::kError) {
      out += "<error message=\"" + detail::markup_escape(detail, Markup::kXml) + "\"/>";
    }
    out += "</testcase>\n";
  }
  out += "</testsuite>";
}

}  // namespace

std::string render_junit_suites(const std::vector<JunitSuite>& suites) {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>";
  for (const auto& s : suites) append_junit_suite(out, s.name, *s.report, s.name);
  return out + "</testsuites>\n";
}

std::string render_junit(const Report& report) {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>";
  append_junit_suite(out, "numalign", report, "");
  return out + "</testsuites>\n";
}

}  // namespace numalign
