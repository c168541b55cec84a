// metrics.cpp: the fused pass. Each chunk decodes blocks of the three inputs into small
// stack buffers (one dtype switch per block) and folds every metric from them at once.
#include "numalign/metrics.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "isclose.hpp"
#include "metrics_internal.hpp"
#include "numalign/layout.hpp"
#include "page_populator.hpp"
#include "parallel.hpp"

namespace numalign {

UlpHistogram::UlpHistogram(const std::array<std::uint64_t, kUlpBins>& dense) {
  std::size_t used = dense.size();
  while (used > 0 && dense[used - 1] == 0) --used;
  counts_.assign(dense.begin(), dense.begin() + static_cast<std::ptrdiff_t>(used));
}

void UlpHistogram::set(int bin, std::uint64_t count) {
  const auto b = static_cast<std::size_t>(bin);
  if (b >= counts_.size()) {
    if (count == 0) return;
    counts_.resize(b + 1);
  }
  counts_[b] = count;
  while (!counts_.empty() && counts_.back() == 0) counts_.pop_back();
}

std::string ulp_bin_label(int bin) {
  if (bin == kUlpInfBin) return "inf";
  if (bin <= 2) return std::to_string(bin);
  // Bins 3.. cover (2^(bin-2), 2^(bin-1)]; the last finite one ends at 2^64 - 1.
  const std::uint64_t lo = (std::uint64_t{1} << (bin - 2)) + 1;
  const std::uint64_t hi = bin - 1 < 64 ? std::uint64_t{1} << (bin - 1) : ~std::uint64_t{0};
  return std::to_string(lo) + "-" + std::to_string(hi);
}

namespace {

using detail::kBlock;
using detail::Partial;

constexpr std::uint64_t kChunk = 1u << 20;  // elements per parallel task
// Small tensors are run in batches of consecutive ones of about this many elements: one
// thread then reads each file's bytes in order (they lie back to back), which the hardware
// prefetcher follows, where tensors dealt out one at a time leave every stream broken.
constexpr std::uint64_t kBatch = 1u << 16;

}  // namespace

namespace {

// Error balance counters: does |x| overshoot or undershoot |u| where x != u?
void count_balance(double x, double u, std::uint64_t& differs, std::uint64_t& over,
                   std::uint64_t& under) {
  if (x == u || (std::isnan(x) && std::isnan(u))) return;
  ++differs;
  const double ax = std::fabs(x), au = std::fabs(u);
  over += ax > au;
  under += ax < au;
}

}  // namespace

void MagnitudeProfile::add(const MagnitudeProfile& o) {
  if (o.empty()) return;
  if (empty()) {
    *this = o;
    return;
  }
  for (int b = 0; b < kMagnitudeBins; ++b) {
    bins[b].count += o.bins[b].count;
    bins[b].sq_err_test += o.bins[b].sq_err_test;
    bins[b].sq_err_ref += o.bins[b].sq_err_ref;
  }
}

namespace detail {

void add_magnitude_profile(const double* t, const double* r, const double* u, std::size_t n,
                           MagnitudeProfile& profile) {
  if (profile.empty()) profile.bins.assign(kMagnitudeBins, MagnitudeBin());
  for (std::size_t i = 0; i < n; ++i) {
    const double e = t[i] - u[i], er = r[i] - u[i];
    if (!std::isfinite(e) || !std::isfinite(er)) continue;
    const int b =
        u[i] == 0 ? 0 : std::clamp(std::ilogb(u[i]) + kMagnitudeBias, 0, kMagnitudeBins - 1);
    MagnitudeBin& bin = profile.bins[b];
    ++bin.count;
    bin.sq_err_test += e * e;
    bin.sq_err_ref += er * er;
  }
}

void add_magnitude_profile(const MetricsInput& in, std::uint64_t begin, std::uint64_t end,
                           MagnitudeProfile& profile) {
  const std::size_t es = element_size(in.test->dtype), us = element_size(in.truth->dtype);
  double t[kBlock], r[kBlock], u[kBlock];
  for (std::uint64_t base = begin; base < end; base += kBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, end - base));
    decode_block(in.test->dtype, in.test->data + base * es, n, t);
    decode_block(in.test->dtype, in.ref->data + base * es, n, r);
    decode_block(in.truth->dtype, in.truth->data + base * us, n, u);
    add_magnitude_profile(t, r, u, n, profile);
  }
}

void Partial::merge(const Partial& o) {
  n += o.n;
  magnitude.add(o.magnitude);
  sq_err_test.merge(o.sq_err_test);
  sq_err_ref.merge(o.sq_err_ref);
  sq_truth.merge(o.sq_truth);
  sq_test.merge(o.sq_test);
  test_dot_truth.merge(o.test_dot_truth);
  err_sum.merge(o.err_sum);
  // On ties the smaller index wins: the first occurrence, whatever the merge order.
  const auto other_wins = [](auto value, auto current, std::uint64_t index, std::uint64_t at) {
    return value > current || (value == current && index < at);
  };
  if (other_wins(o.max_abs_truth, max_abs_truth, o.max_abs_truth_index, max_abs_truth_index)) {
    max_abs_truth = o.max_abs_truth;
    max_abs_truth_index = o.max_abs_truth_index;
  }
  max_abs_ref_truth = std::max(max_abs_ref_truth, o.max_abs_ref_truth);
  if (other_wins(o.max_abs_ref, max_abs_ref, o.max_abs_ref_index, max_abs_ref_index)) {
    max_abs_ref = o.max_abs_ref;
    max_abs_ref_index = o.max_abs_ref_index;
  }
  test_differs += o.test_differs;
  test_over += o.test_over;
  test_under += o.test_under;
  ref_differs += o.ref_differs;
  ref_over += o.ref_over;
  ref_under += o.ref_under;
  not_close += o.not_close;
  bits_differ += o.bits_differ;
  values_differ += o.values_differ;
  if (other_wins(o.ulp.max, ulp.max, o.ulp.max_index, ulp.max_index)) {
    ulp.max = o.ulp.max;
    ulp.max_index = o.ulp.max_index;
  }
  ulp.any_inf = ulp.any_inf || o.ulp.any_inf;
  ulp.both_nan += o.ulp.both_nan;
  for (int b = 0; b < kUlpBins; ++b) ulp.hist[b] += o.ulp.hist[b];
  for (auto [dst, src] : {std::pair{&nf_test, &o.nf_test}, std::pair{&nf_ref, &o.nf_ref},
                          std::pair{&nf_truth, &o.nf_truth}}) {
    dst->nan += src->nan;
    dst->inf += src->inf;
  }
}

Partial accumulate_scalar(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                          std::uint64_t end) {
  Partial p;
  const DType dt = in.test->dtype;
  const bool floating = is_floating(dt);
  const std::size_t es = element_size(dt);
  const bool with_truth = in.truth != nullptr;
  const std::size_t us = with_truth ? element_size(in.truth->dtype) : 0;
  double t[kBlock], r[kBlock], u[kBlock];
  std::int64_t ot[kBlock], orf[kBlock];
  std::uint64_t int_distance[kBlock];
  bool nt[kBlock], nr[kBlock];
  for (std::uint64_t base = begin; base < end; base += kBlock) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, end - base));
    const std::byte* tp = in.test->data + base * es;
    const std::byte* rp = in.ref->data + base * es;
    decode_block(dt, tp, n, t);
    decode_block(dt, rp, n, r);
    count_nonfinite(t, n, p.nf_test);
    count_nonfinite(r, n, p.nf_ref);
    if (floating) {
      ordinal_block(dt, tp, n, ot, nt);
      ordinal_block(dt, rp, n, orf, nr);
    } else {
      integer_distance_block(dt, tp, rp, n, int_distance);
    }
    for (std::size_t i = 0; i < n; ++i) {
      p.bits_differ += std::memcmp(tp + i * es, rp + i * es, es) != 0;
      p.not_close += !torch_isclose(dt, r[i], t[i], opt.tol, opt.tol, opt.equal_nan);
      if (!floating) {  // exact distances (finish() reads max |test - ref| from them)
        const std::uint64_t d = int_distance[i];
        p.values_differ += d != 0;
        if (d > p.ulp.max) {
          p.ulp.max = d;
          p.ulp.max_index = base + i;
        }
        continue;
      }
      const double diff = std::fabs(t[i] - r[i]);
      if (diff > p.max_abs_ref) {
        p.max_abs_ref = diff;
        p.max_abs_ref_index = base + i;
      }
      if (nt[i] || nr[i]) {
        p.ulp.both_nan += nt[i] && nr[i];
        if (nt[i] && nr[i] && opt.equal_nan) {
          ++p.ulp.hist[0];
        } else {
          ++p.values_differ;
          ++p.ulp.hist[kUlpInfBin];
          p.ulp.any_inf = true;
        }
        continue;
      }
      const std::uint64_t d = ordinal_distance(ot[i], orf[i]);
      p.values_differ += d != 0;
      ++p.ulp.hist[ulp_bin(d)];
      if (d > p.ulp.max) {
        p.ulp.max = d;
        p.ulp.max_index = base + i;
      }
    }
    if (with_truth) {
      decode_block(in.truth->dtype, in.truth->data + base * us, n, u);
      count_nonfinite(u, n, p.nf_truth);
      double se_t = 0, se_r = 0, su = 0, st = 0, stu = 0, se = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double e = t[i] - u[i];
        const double er = r[i] - u[i];
        se_t += e * e;
        se_r += er * er;
        su += u[i] * u[i];
        st += t[i] * t[i];
        stu += t[i] * u[i];
        se += e;
        const double ae = std::fabs(e);
        if (ae > p.max_abs_truth) {
          p.max_abs_truth = ae;
          p.max_abs_truth_index = base + i;
        }
        const double aer = std::fabs(er);
        if (aer > p.max_abs_ref_truth) p.max_abs_ref_truth = aer;  // NaN never wins
        count_balance(t[i], u[i], p.test_differs, p.test_over, p.test_under);
        count_balance(r[i], u[i], p.ref_differs, p.ref_over, p.ref_under);
      }
      p.sq_err_test.add(se_t);
      p.sq_err_ref.add(se_r);
      p.sq_truth.add(su);
      p.sq_test.add(st);
      p.test_dot_truth.add(stu);
      p.err_sum.add(se);
      if (opt.magnitude_profile) add_magnitude_profile(t, r, u, n, p.magnitude);
    }
  }
  p.n = end - begin;
  return p;
}

// The kernel the options choose, over contiguous views.
Partial accumulate_with(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                        std::uint64_t end) {
  return opt.kernel == MetricKernel::scalar ? accumulate_scalar(in, opt, begin, end)
                                            : accumulate_simd(in, opt, begin, end);
}

// A task over views that are not all contiguous (a piece of a fused tensor, shards): their
// elements are gathered, a block at a time, into buffers of this thread that stay in its
// cache (a whole chunk would go out to memory and back: half again the pass's traffic);
// contiguous views are read where they are. Block partials merge in order, indices put back
// in place.
Partial accumulate_gathered(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                            std::uint64_t end) {
  constexpr std::uint64_t kGatherBlock = 1u << 14;  // elements: 128 KiB of float64
  thread_local std::vector<std::byte> buffers[3];
  Partial total;
  for (std::uint64_t b = begin; b < end; b += kGatherBlock) {
    const std::uint64_t e = std::min(end, b + kGatherBlock), n = e - b;
    TensorView local[3];
    auto piece = [&](const TensorView* v, int k) -> const TensorView* {
      if (!v) return nullptr;
      const std::size_t es = element_size(v->dtype);
      const std::byte* data = v->data ? v->data + b * es : nullptr;
      if (v->layout) {
        buffers[k].resize(n * es);
        copy_elements(*v, b, e, buffers[k].data());
        data = buffers[k].data();
      }
      local[k] = TensorView{v->dtype, Shape{n}, data};
      return &local[k];
    };
    const MetricsInput gathered{piece(in.test, 0), piece(in.ref, 1), piece(in.truth, 2)};
    Partial p = accumulate_with(gathered, opt, 0, n);
    p.max_abs_ref_index += b;
    p.max_abs_truth_index += b;
    p.ulp.max_index += b;
    if (b == begin)
      total = std::move(p);
    else
      total.merge(p);
  }
  total.n = end - begin;
  return total;
}

}  // namespace detail

namespace {

double balance(std::uint64_t over, std::uint64_t under, std::uint64_t differs) {
  if (differs == 0) return 0;
  return (static_cast<double>(over) - static_cast<double>(under)) / static_cast<double>(differs);
}

Metrics finish(const MetricsInput& in, const Partial& p) {
  Metrics m;
  m.numel = p.n;
  m.floating = is_floating(in.test->dtype);
  m.max_abs_ref = std::max(p.max_abs_ref, 0.0);
  m.max_abs_ref_index = p.max_abs_ref_index;
  if (!m.floating) {  // integers: the exact largest distance, shown rounded to a double
    m.max_abs_ref = static_cast<double>(p.ulp.max);
    m.max_abs_ref_index = p.ulp.max_index;
  }
  m.not_close = p.not_close;
  m.bits_differ = p.bits_differ;
  m.values_differ = p.values_differ;
  m.ulp.max = p.ulp.max;
  m.ulp.any_inf = p.ulp.any_inf;
  m.ulp.both_nan = p.ulp.both_nan;
  m.ulp.max_index = p.ulp.max_index;
  m.ulp.hist = UlpHistogram(p.ulp.hist);
  m.test_nonfinite = p.nf_test;
  m.ref_nonfinite = p.nf_ref;
  m.truth_nonfinite = p.nf_truth;
  m.magnitude = p.magnitude;
  if (in.truth == nullptr) return m;
  m.has_truth = true;
  const double n = static_cast<double>(p.n);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // sqrt(mean(square(.))) as torch computes it; an empty tensor's mean is NaN there too.
  m.error = p.n ? std::sqrt(p.sq_err_test.value() / n) : nan;
  m.baseline = p.n ? std::sqrt(p.sq_err_ref.value() / n) : nan;
  m.max_abs_truth = std::max(p.max_abs_truth, 0.0);
  m.max_abs_truth_index = p.max_abs_truth_index;
  m.max_abs_ref_truth = p.max_abs_ref_truth;
  const double err_norm = std::sqrt(p.sq_err_test.value());
  const double truth_norm = std::sqrt(p.sq_truth.value());
  m.rms_truth = p.n ? std::sqrt(p.sq_truth.value() / n) : nan;
  const double test_norm = std::sqrt(p.sq_test.value());
  m.rel_l2 = truth_norm > 0 ? err_norm / truth_norm
                            : (err_norm == 0 ? 0.0 : std::numeric_limits<double>::infinity());
  m.cosine =
      (truth_norm > 0 && test_norm > 0) ? p.test_dot_truth.value() / truth_norm / test_norm : nan;
  m.mean_error = p.n ? p.err_sum.value() / n : nan;
  m.eb_test = balance(p.test_over, p.test_under, p.test_differs);
  m.eb_ref = balance(p.ref_over, p.ref_under, p.ref_differs);
  m.test_differs_truth = p.test_differs;
  m.ref_differs_truth = p.ref_differs;
  return m;
}

}  // namespace

void detail::compute_metrics_into(std::span<const MetricsInput> inputs, const MetricsSink& store,
                                  const MetricOptions& options, int threads,
                                  const std::function<void(double, double)>& progress,
                                  const detail::PagePopulator* pages) {
  struct Task {
    std::size_t tensor;
    std::uint64_t begin, end;
    std::size_t partial;  // slot of a chunk of a tensor of several chunks; kWhole: one chunk
  };
  constexpr std::size_t kWhole = ~std::size_t{0};
  std::vector<Task> tasks;
  std::vector<std::size_t> first_task(inputs.size() + 1);
  std::size_t chunked = 0;
  double total_bytes = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    first_task[k] = tasks.size();
    const std::uint64_t n = inputs[k].test->numel();
    if (n <= kChunk) {
      tasks.push_back({k, 0, n, kWhole});
    } else {
      for (std::uint64_t b = 0; b < n; b += kChunk) {
        tasks.push_back({k, b, std::min(n, b + kChunk), chunked++});
      }
    }
    total_bytes += static_cast<double>(inputs[k].test->nbytes() * 2 +
                                       (inputs[k].truth ? inputs[k].truth->nbytes() : 0));
  }
  first_task[inputs.size()] = tasks.size();
  // Batches of consecutive tasks: batch j runs tasks [batch_start[j], batch_start[j + 1]).
  std::vector<std::size_t> batch_start;
  std::uint64_t in_batch = 0;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const std::uint64_t n = tasks[i].end - tasks[i].begin;
    if (batch_start.empty() || in_batch + n > kBatch) {
      batch_start.push_back(i);
      in_batch = 0;
    }
    in_batch += n;
  }
  batch_start.push_back(tasks.size());
  // Only chunks of large tensors wait to be merged: a small tensor is finished where it is
  // computed, straight into its result (no partial kept per tensor, no second copy).
  std::vector<Partial> partials(chunked);
  std::atomic<double> done_bytes{0};
  // Calls f(input, bytes, size) for each file range a task reads (input 0 test, 1 ref, 2
  // truth; none for gathered views).
  const auto for_each_range = [&](const Task& task, auto f) {
    const MetricsInput& in = inputs[task.tensor];
    if (in.test->layout || in.ref->layout || (in.truth && in.truth->layout)) return;
    const std::size_t es = element_size(in.test->dtype), n = task.end - task.begin;
    f(0, in.test->data + task.begin * es, n * es);
    f(1, in.ref->data + task.begin * es, n * es);
    if (in.truth) {
      const std::size_t us = element_size(in.truth->dtype);
      f(2, in.truth->data + task.begin * us, n * us);
    }
  };
  // Drop-behind bookkeeping per run of adjacent bytes, not per tensor: consecutive tensors
  // usually lie side by side in their files, and a million small tensors would otherwise
  // mean three million updates of a few shared counters.
  const auto for_each_run = [&](std::size_t first, std::size_t last, auto f) {
    std::array<std::span<const std::byte>, 3> run{};
    for (std::size_t i = first; i < last; ++i) {
      for_each_range(tasks[i], [&](int k, const std::byte* p, std::size_t n) {
        if (run[k].data() + run[k].size() == p && !run[k].empty()) {
          run[k] = {run[k].data(), run[k].size() + n};
        } else {
          if (!run[k].empty()) f(run[k]);
          run[k] = {p, n};
        }
      });
    }
    for (const auto& r : run) {
      if (!r.empty()) f(r);
    }
  };
  if (pages) {
    for_each_run(0, tasks.size(),
                 [&](std::span<const std::byte> r) { pages->will_read(r.data(), r.size()); });
  }
  auto run = [&](const Task& task) {
    const MetricsInput& in = inputs[task.tensor];
    const bool laid_out = in.test->layout || in.ref->layout || (in.truth && in.truth->layout);
    if (pages) {
      for_each_range(task,
                     [&](int, const std::byte* p, std::size_t n) { pages->before_reading(p, n); });
    }
    Partial p = laid_out ? detail::accumulate_gathered(in, options, task.begin, task.end)
                         : detail::accumulate_with(in, options, task.begin, task.end);
    if (task.partial == kWhole) {
      store(task.tensor, finish(in, p));
    } else {
      partials[task.partial] = std::move(p);
    }
    if (!progress) return;
    const double per_element = 2.0 * static_cast<double>(element_size(in.test->dtype)) +
                               (in.truth ? static_cast<double>(element_size(in.truth->dtype)) : 0);
    double expected = done_bytes.load();
    const double add = per_element * static_cast<double>(task.end - task.begin);
    while (!done_bytes.compare_exchange_weak(expected, expected + add)) {
    }
  };
  detail::parallel_for(
      batch_start.size() - 1, detail::resolve_threads(threads),
      [&](std::size_t j) {
        for (std::size_t i = batch_start[j]; i < batch_start[j + 1]; ++i) run(tasks[i]);
        if (pages) {
          for_each_run(batch_start[j], batch_start[j + 1], [&](std::span<const std::byte> r) {
            pages->done_reading(r.data(), r.size());
          });
        }
      },
      progress ? std::function<void()>([&] { progress(done_bytes.load(), total_bytes); })
               : std::function<void()>());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Task& first = tasks[first_task[k]];
    if (first.partial == kWhole) continue;
    Partial total = std::move(partials[first.partial]);
    for (std::size_t i = first_task[k] + 1; i < first_task[k + 1]; ++i) {
      total.merge(partials[tasks[i].partial]);
    }
    store(k, finish(inputs[k], total));
  }
}

std::vector<Metrics> compute_metrics(std::span<const MetricsInput> inputs,
                                     const MetricOptions& options, int threads,
                                     const std::function<void(double, double)>& progress) {
  std::vector<Metrics> metrics(inputs.size());
  detail::compute_metrics_into(
      inputs, [&](std::size_t k, Metrics&& m) { metrics[k] = std::move(m); }, options, threads,
      progress);
  return metrics;
}

Metrics compute_metrics(const TensorView& test, const TensorView& ref, const TensorView* truth,
                        const MetricOptions& options) {
  const MetricsInput in{&test, &ref, truth};
  return compute_metrics(std::span<const MetricsInput>(&in, 1), options)[0];
}

}  // namespace numalign
