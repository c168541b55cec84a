// report_fuzzer.cpp: the bytes a rank sends with its report. Anything decodes to a report or
// is refused with an Error; what decodes encodes back to the same bytes (the form is
// canonical), and a decoded report renders.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "numalign/error.hpp"
#include "numalign/report_transfer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    numalign::Report r = numalign::decode_report(bytes, "fuzz");
    if (numalign::encode_report(r) != bytes) std::abort();
    numalign::render_text(r, true);
    numalign::render_text(r, false);  // long names shortened by module path
    numalign::render_json(r);
    numalign::render_html(r);  // the module tree and the layer ticks, from any tags
    r.sort();
  } catch (const numalign::Error&) {
  }
  return 0;
}
