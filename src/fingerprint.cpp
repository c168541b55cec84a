// fingerprint.cpp: see numalign/fingerprint.hpp. XXH3 from Debian's libxxhash-dev, inlined
// (header only), so that nothing is linked.
#include "numalign/fingerprint.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>

namespace numalign {

std::string fingerprint(const TensorView& view) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const std::string prefix = std::string(name(view.dtype)) + "|" + format_shape(view.shape) + "|";
  XXH3_128bits_update(&state, prefix.data(), prefix.size());
  XXH3_128bits_update(&state, view.data, view.nbytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string(kFingerprintAlgorithm) + ":" + hex;
}

std::string_view fingerprint_algorithm(std::string_view fingerprint) {
  const std::size_t colon = fingerprint.find(':');
  return colon == std::string_view::npos ? std::string_view() : fingerprint.substr(0, colon);
}

}  // namespace numalign
