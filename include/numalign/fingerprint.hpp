// numalign/fingerprint.hpp: a hash of a tensor, to tell whether two runs were given the same
// inputs and parameters (trace metadata "fingerprints").
#pragma once

#include <string>
#include <string_view>

#include "numalign/tensor.hpp"

namespace numalign {

// Fingerprints start with the algorithm's name and a colon: two made by different
// algorithms (traces from different numalign versions) cannot be compared.
inline constexpr std::string_view kFingerprintAlgorithm = "xxh3-128";

// "xxh3-128:" and 32 hex digits of XXH3's 128-bit hash of the dtype, the shape and the bytes:
// equal tensors give equal fingerprints on every machine. Not a cryptographic hash: it tells
// runs apart, it does not resist someone forging inputs. Fast (memory bandwidth), because a
// capture fingerprints every parameter of the model.
std::string fingerprint(const TensorView& view);

// The algorithm part of a fingerprint ("sha256" for those of numalign before XXH3).
std::string_view fingerprint_algorithm(std::string_view fingerprint);

}  // namespace numalign
