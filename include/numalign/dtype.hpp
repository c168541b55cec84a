// numalign/dtype.hpp: the element types of safetensors, exact decoding to double, rounding
// from double, and the ordered-integer view of float bit patterns that ULP distances use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace numalign {

// Declared in the order of safetensors 0.8's `Dtype` enum: its serializer sorts entries by
// this order (descending), so the writer can lay files out byte for byte as it does.
enum class DType : std::uint8_t {
  BOOL,
  F4,
  F6_E2M3,
  F6_E3M2,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64,
};
inline constexpr int kDTypeCount = 22;

enum class DTypeKind { kBool, kUnsigned, kSigned, kFloat, kComplex, kPacked };

struct DTypeInfo {
  std::string_view name;  // as spelled in safetensors headers
  int bits;               // per element; F4/F6 are packed below a byte
  DTypeKind kind;
};

const DTypeInfo& info(DType dtype);
inline std::string_view name(DType dtype) { return info(dtype).name; }
inline int bits(DType dtype) { return info(dtype).bits; }
std::optional<DType> dtype_from_name(std::string_view name);

// Judged element by element (every type but the packed F4/F6 and the complex C64).
bool is_judgeable(DType dtype);
bool is_floating(DType dtype);  // a real floating type we can judge
// Types whose `same()` multiplier base is 3.0: fp16, bf16 and every fp8.
bool is_low_precision(DType dtype);
// A floating type's unit roundoff, 2^-p for p bits of precision (the implicit bit counted):
// bf16 2^-8, fp16 2^-11, fp32 2^-24, fp64 2^-53, e4m3 2^-4, e5m2 2^-3, e8m0 2^-1; 0 otherwise.
double unit_roundoff(DType dtype);
inline std::size_t element_size(DType dtype) { return static_cast<std::size_t>(bits(dtype)) / 8; }

// Exact value of one element (floating, integer or bool) read from little-endian bytes.
// 64-bit integers beyond 2^53 round to the nearest double; everything else is exact.
double to_double(DType dtype, const std::byte* element);
// The raw bit pattern of one element (up to 64 bits), zero-extended.
std::uint64_t load_bits(DType dtype, const std::byte* element);
// Value of a floating type's bit pattern.
double float_from_bits(DType dtype, std::uint64_t bits);
// Rounds x to the nearest value of a floating type, ties to even, and returns the bit
// pattern. Overflow gives inf where the type has one, NaN otherwise (fn / fnuz / e8m0).
std::uint64_t round_to_bits(DType dtype, double x);
inline double round_to(DType dtype, double x) {
  return float_from_bits(dtype, round_to_bits(dtype, x));
}
bool is_nan_bits(DType dtype, std::uint64_t bits);

// Ordered-integer image of a floating bit pattern: monotonic in the value, +0 and -0 both
// 0, so |ordinal(a) - ordinal(b)| counts the representable values between a and b.
// Not meaningful for NaN patterns (callers check is_nan_bits first).
std::int64_t ulp_ordinal(DType dtype, std::uint64_t bits);
// Distance between two ordinals; exact for every pair (the difference may exceed int64).
inline std::uint64_t ordinal_distance(std::int64_t a, std::int64_t b) {
  return a >= b ? static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b)
                : static_cast<std::uint64_t>(b) - static_cast<std::uint64_t>(a);
}

// Block forms used by the fused pass: one switch per block, none per element.
void decode_block(DType dtype, const std::byte* src, std::size_t n, double* out);
// For floating types: the ordinals and a NaN flag per element.
void ordinal_block(DType dtype, const std::byte* src, std::size_t n, std::int64_t* ordinals,
                   bool* nan);
// For integer and bool types: |a[i] - b[i]| exactly, for every width (never through double,
// which cannot tell 2^53 from 2^53 + 1); a bool is 0 or 1.
void integer_distance_block(DType dtype, const std::byte* a, const std::byte* b, std::size_t n,
                            std::uint64_t* distances);

}  // namespace numalign
