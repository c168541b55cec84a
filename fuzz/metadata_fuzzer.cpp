// metadata_fuzzer.cpp: our metadata JSON; what parses must survive a write/read round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "numalign/error.hpp"
#include "numalign/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = numalign::TraceMetadata::from_json(json, "fuzz");
    const std::string again = m.to_json();
    if (numalign::TraceMetadata::from_json(again, "again").to_json() != again) std::abort();
  } catch (const numalign::Error&) {
  }
  return 0;
}
