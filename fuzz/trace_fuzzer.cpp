// trace_fuzzer.cpp: the trace parser (header, layout validation) and reading every tensor.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/metrics.hpp"
#include "numalign/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const numalign::Trace trace = numalign::Trace::parse(
        {reinterpret_cast<const std::byte*>(data), size}, "fuzz.safetensors");
    std::vector<numalign::MetricsInput> inputs;
    for (const auto& e : trace.entries()) {
      if (numalign::is_judgeable(e.view.dtype)) inputs.push_back({&e.view, &e.view, &e.view});
    }
    numalign::compute_metrics(inputs, {}, 1);  // touches every byte of every tensor
  } catch (const numalign::Error&) {
  }
  return 0;
}
