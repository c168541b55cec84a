// cpu_features.hpp: which instruction-set extensions this CPU and its OS support, by the
// names GCC and Clang use in target attributes ("avx2", "avx512bw", ...).
#pragma once

#include <string_view>

namespace numalign::detail {

// True when the CPU has the extension and, for the AVX families, the OS saves its
// registers. Unknown names (and every name off x86) are unsupported.
bool cpu_supports(std::string_view feature);

// True when every comma-separated name of a target attribute string is supported; the
// empty string (a target without extensions) always is.
bool cpu_supports_all(std::string_view features);

}  // namespace numalign::detail
