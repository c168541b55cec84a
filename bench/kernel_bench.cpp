// kernel_bench: the fused metrics pass on one thread, per test dtype, with a float64 truth.
// Bytes/s counts the three inputs. Two sizes: one that stays in the core's L2 (the
// kernel's arithmetic alone) and one that streams from memory (what a trace sees).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "numalign/metrics.hpp"
#include "simulations.hpp"

namespace {

using numalign::DType;
using numalign::examples::Buffer;
using numalign::examples::make_buffer;

struct Inputs {
  Buffer test, ref, truth;
};

// A kernel output's shape of error: truth ~ N(0, 1), ref its rounding, test a small
// relative perturbation of the truth rounded to the dtype (fp8: at its own scale).
Inputs make_inputs(DType dtype, std::size_t n) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  const double rel = bits(dtype) == 8 ? 0x1p-4 : 0x1p-9;
  std::vector<double> truth(n), test(n);
  for (std::size_t i = 0; i < n; ++i) {
    truth[i] = normal(rng);
    test[i] = truth[i] * (1 + rel * normal(rng));
  }
  const numalign::Shape shape{n};
  return {make_buffer(dtype, shape, test), make_buffer(dtype, shape, truth),
          make_buffer(DType::F64, shape, truth)};
}

void BM_FusedPass(benchmark::State& state, DType dtype) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Inputs in = make_inputs(dtype, n);
  const numalign::TensorView t = in.test.view(), r = in.ref.view(), u = in.truth.view();
  const numalign::MetricsInput input{&t, &r, &u};
  const numalign::MetricOptions options;
  for (auto _ : state) {
    auto metrics = numalign::compute_metrics({&input, 1}, options, /*threads=*/1);
    benchmark::DoNotOptimize(metrics);
  }
  const auto bytes = in.test.bytes.size() + in.ref.bytes.size() + in.truth.bytes.size();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(numalign::simd_target());
}

// 64 Ki elements: at most 1.2 MB of inputs, inside L2. 32 Mi: 300-500 MB, from memory.
void Sizes(benchmark::internal::Benchmark* b) { b->Arg(64 << 10)->Arg(32 << 20)->UseRealTime(); }

BENCHMARK_CAPTURE(BM_FusedPass, bf16, DType::BF16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_FusedPass, fp16, DType::F16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_FusedPass, fp32, DType::F32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_FusedPass, fp8_e4m3, DType::F8_E4M3)->Apply(Sizes);

}  // namespace

BENCHMARK_MAIN();
