// dtype.cpp: bit-level definitions of every floating format, derived from its parameters.
#include "numalign/dtype.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace numalign {
namespace {

constexpr std::array<DTypeInfo, kDTypeCount> kInfo = {{
    {"BOOL", 8, DTypeKind::kBool},         {"F4", 4, DTypeKind::kPacked},
    {"F6_E2M3", 6, DTypeKind::kPacked},    {"F6_E3M2", 6, DTypeKind::kPacked},
    {"U8", 8, DTypeKind::kUnsigned},       {"I8", 8, DTypeKind::kSigned},
    {"F8_E5M2", 8, DTypeKind::kFloat},     {"F8_E4M3", 8, DTypeKind::kFloat},
    {"F8_E8M0", 8, DTypeKind::kFloat},     {"F8_E4M3FNUZ", 8, DTypeKind::kFloat},
    {"F8_E5M2FNUZ", 8, DTypeKind::kFloat}, {"I16", 16, DTypeKind::kSigned},
    {"U16", 16, DTypeKind::kUnsigned},     {"F16", 16, DTypeKind::kFloat},
    {"BF16", 16, DTypeKind::kFloat},       {"I32", 32, DTypeKind::kSigned},
    {"U32", 32, DTypeKind::kUnsigned},     {"F32", 32, DTypeKind::kFloat},
    {"C64", 64, DTypeKind::kComplex},      {"F64", 64, DTypeKind::kFloat},
    {"I64", 64, DTypeKind::kSigned},       {"U64", 64, DTypeKind::kUnsigned},
}};

// How a format spends its all-ones exponent and its negative zero.
enum class Special {
  kIeee,  // all-ones exponent: inf (mantissa 0) or NaN
  kFn,    // no inf; only S.1111.111 is NaN (e4m3fn)
  kFnuz,  // no inf, no -0; 0x80 is the one NaN
  kE8M0,  // unsigned exponent only; 0xFF is NaN
};

struct Format {
  int exp_bits;
  int man_bits;
  int bias;
  Special special;
  int total_bits() const { return (special == Special::kE8M0 ? 0 : 1) + exp_bits + man_bits; }
};

Format format_of(DType d) {
  switch (d) {
    case DType::F16:
      return {5, 10, 15, Special::kIeee};
    case DType::BF16:
      return {8, 7, 127, Special::kIeee};
    case DType::F32:
      return {8, 23, 127, Special::kIeee};
    case DType::F64:
      return {11, 52, 1023, Special::kIeee};
    case DType::F8_E5M2:
      return {5, 2, 15, Special::kIeee};
    case DType::F8_E4M3:
      return {4, 3, 7, Special::kFn};
    case DType::F8_E4M3FNUZ:
      return {4, 3, 8, Special::kFnuz};
    case DType::F8_E5M2FNUZ:
      return {5, 2, 16, Special::kFnuz};
    case DType::F8_E8M0:
      return {8, 0, 127, Special::kE8M0};
    default:
      return {0, 0, 0, Special::kIeee};
  }
}

std::uint64_t sign_mask(const Format& f) {
  return f.special == Special::kE8M0 ? 0 : std::uint64_t{1} << (f.exp_bits + f.man_bits);
}

bool format_is_nan(const Format& f, std::uint64_t b) {
  const std::uint64_t man = b & ((std::uint64_t{1} << f.man_bits) - 1);
  const std::uint64_t exp = (b >> f.man_bits) & ((std::uint64_t{1} << f.exp_bits) - 1);
  const std::uint64_t exp_max = (std::uint64_t{1} << f.exp_bits) - 1;
  switch (f.special) {
    case Special::kIeee:
      return exp == exp_max && man != 0;
    case Special::kFn:
      return exp == exp_max && man == (std::uint64_t{1} << f.man_bits) - 1;
    case Special::kFnuz:
      return b == sign_mask(f);
    case Special::kE8M0:
      return b == 0xFF;
  }
  return false;
}

std::uint64_t format_nan(const Format& f) {
  switch (f.special) {
    case Special::kIeee:  // quiet NaN: all-ones exponent, top mantissa bit
      return ((std::uint64_t{1} << f.exp_bits) - 1) << f.man_bits | std::uint64_t{1}
                                                                        << (f.man_bits - 1);
    case Special::kFn:
      return (std::uint64_t{1} << (f.exp_bits + f.man_bits)) - 1;
    case Special::kFnuz:
      return sign_mask(f);
    case Special::kE8M0:
      return 0xFF;
  }
  return 0;
}

// The largest finite pattern (positive), used to detect overflow after rounding.
std::uint64_t format_max_finite(const Format& f) {
  const std::uint64_t all = (std::uint64_t{1} << (f.exp_bits + f.man_bits)) - 1;
  switch (f.special) {
    case Special::kIeee:
      return ((std::uint64_t{1} << f.exp_bits) - 2) << f.man_bits |
             ((std::uint64_t{1} << f.man_bits) - 1);
    case Special::kFn:
      return all - 1;
    case Special::kFnuz:
      return all;
    case Special::kE8M0:
      return 0xFE;
  }
  return 0;
}

double format_decode(const Format& f, std::uint64_t b) {
  if (format_is_nan(f, b)) return std::numeric_limits<double>::quiet_NaN();
  const bool neg = (b & sign_mask(f)) != 0;
  const std::uint64_t man = b & ((std::uint64_t{1} << f.man_bits) - 1);
  const std::uint64_t exp = (b >> f.man_bits) & ((std::uint64_t{1} << f.exp_bits) - 1);
  double v;
  if (f.special == Special::kE8M0) {
    v = std::ldexp(1.0, static_cast<int>(exp) - f.bias);
  } else if (f.special == Special::kIeee && exp == (std::uint64_t{1} << f.exp_bits) - 1) {
    v = std::numeric_limits<double>::infinity();
  } else if (exp == 0) {  // zero or subnormal: no implicit leading one
    v = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(man | std::uint64_t{1} << f.man_bits),
                   static_cast<int>(exp) - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

std::uint64_t format_encode(const Format& f, double x) {
  if (std::isnan(x)) return format_nan(f);
  const bool neg = std::signbit(x);
  const double a = std::fabs(x);
  const std::uint64_t overflow = f.special == Special::kIeee
                                     ? ((std::uint64_t{1} << f.exp_bits) - 1) << f.man_bits
                                     : format_nan(f);
  if (f.special == Special::kE8M0 && (neg && a != 0)) return format_nan(f);
  const std::uint64_t sign = neg ? sign_mask(f) : 0;
  if (a == 0) return f.special == Special::kIeee || f.special == Special::kFn ? sign : 0;
  if (std::isinf(a)) return overflow | (f.special == Special::kIeee ? sign : 0);
  // Exponent of the smallest normal (e8m0 has no subnormals: field 0 is 2^-127).
  const int emin = f.special == Special::kE8M0 ? -f.bias : 1 - f.bias;
  int e = std::ilogb(a);
  if (e < emin) e = emin;
  // a * 2^(M - e) is exact in double; nearbyint rounds half to even (default mode).
  double q = std::nearbyint(std::ldexp(a, f.man_bits - e));
  const double implicit = std::ldexp(1.0, f.man_bits);
  if (q >= 2 * implicit) {  // rounding carried into the next binade
    q /= 2;
    ++e;
  }
  std::uint64_t bits;
  if (f.special == Special::kE8M0) {
    bits = static_cast<std::uint64_t>(e + f.bias);
  } else if (q < implicit) {  // subnormal (e == emin)
    bits = static_cast<std::uint64_t>(q);
  } else {
    bits = static_cast<std::uint64_t>(e + f.bias) << f.man_bits |
           (static_cast<std::uint64_t>(q) - (std::uint64_t{1} << f.man_bits));
  }
  if (e + f.bias >= (1 << f.exp_bits) || bits > format_max_finite(f)) {
    return f.special == Special::kIeee ? (overflow | sign) : overflow;
  }
  return bits | sign;
}

}  // namespace

const DTypeInfo& info(DType dtype) { return kInfo[static_cast<std::size_t>(dtype)]; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kDTypeCount; ++i) {
    if (kInfo[i].name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

bool is_judgeable(DType d) {
  const DTypeKind k = info(d).kind;
  return k != DTypeKind::kPacked && k != DTypeKind::kComplex;
}
bool is_floating(DType d) { return info(d).kind == DTypeKind::kFloat; }
bool is_low_precision(DType d) { return is_floating(d) && bits(d) <= 16; }

double unit_roundoff(DType d) {
  switch (d) {
    case DType::BF16:
      return 0x1p-8;
    case DType::F16:
      return 0x1p-11;
    case DType::F32:
      return 0x1p-24;
    case DType::F64:
      return 0x1p-53;
    case DType::F8_E4M3:
    case DType::F8_E4M3FNUZ:
      return 0x1p-4;
    case DType::F8_E5M2:
    case DType::F8_E5M2FNUZ:
      return 0x1p-3;
    case DType::F8_E8M0:
      return 0x1p-1;
    default:
      return 0;
  }
}

std::uint64_t load_bits(DType dtype, const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, element_size(dtype));  // little-endian host assumed (x86-64, arm64)
  return v;
}

double float_from_bits(DType dtype, std::uint64_t b) {
  if (dtype == DType::F64) {
    double d;
    std::memcpy(&d, &b, 8);
    return d;
  }
  if (dtype == DType::F32) {
    const auto u = static_cast<std::uint32_t>(b);
    float fl;
    std::memcpy(&fl, &u, 4);
    return fl;
  }
  return format_decode(format_of(dtype), b);
}

std::uint64_t round_to_bits(DType dtype, double x) {
  if (dtype == DType::F64) {
    std::uint64_t b;
    std::memcpy(&b, &x, 8);
    return b;
  }
  return format_encode(format_of(dtype), x);
}

bool is_nan_bits(DType dtype, std::uint64_t b) {
  return is_floating(dtype) && format_is_nan(format_of(dtype), b);
}

std::int64_t ulp_ordinal(DType dtype, std::uint64_t b) {
  const Format f = format_of(dtype);
  const std::uint64_t s = sign_mask(f);
  if (s == 0) return static_cast<std::int64_t>(b);
  const auto magnitude = static_cast<std::int64_t>(b & (s - 1));
  return (b & s) ? -magnitude : magnitude;
}

double to_double(DType dtype, const std::byte* p) {
  const std::uint64_t b = load_bits(dtype, p);
  switch (info(dtype).kind) {
    case DTypeKind::kBool:
      return b != 0 ? 1.0 : 0.0;
    case DTypeKind::kUnsigned:
      return static_cast<double>(b);
    case DTypeKind::kSigned: {
      const int shift = 64 - bits(dtype);  // sign-extend
      return static_cast<double>(static_cast<std::int64_t>(b << shift) >> shift);
    }
    case DTypeKind::kFloat:
      return float_from_bits(dtype, b);
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

namespace {

// Lookup tables for the narrow floats, built once from the per-pattern definitions.
struct Tables {
  std::array<std::array<double, 256>, kDTypeCount> fp8{};
  std::array<std::array<std::int64_t, 256>, kDTypeCount> fp8_ordinal{};
  std::array<std::array<bool, 256>, kDTypeCount> fp8_nan{};
  std::array<float, 65536> fp16{};
  Tables() {
    for (DType d :
         {DType::F8_E5M2, DType::F8_E4M3, DType::F8_E8M0, DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ}) {
      const int k = static_cast<int>(d);
      for (int b = 0; b < 256; ++b) {
        const auto bits = static_cast<std::uint64_t>(b);
        fp8[k][b] = format_decode(format_of(d), bits);
        fp8_ordinal[k][b] = ulp_ordinal(d, bits);
        fp8_nan[k][b] = is_nan_bits(d, bits);
      }
    }
    for (int b = 0; b < 65536; ++b) {
      fp16[b] = static_cast<float>(format_decode(format_of(DType::F16), b));
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

template <class T>
void decode_as(const std::byte* src, std::size_t n, double* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    out[i] = static_cast<double>(v);
  }
}

template <class Bits>
void ordinals_sign_magnitude(const std::byte* src, std::size_t n, Bits sign, Bits nan_exp,
                             Bits man_mask, std::int64_t* ord, bool* nan) {
  for (std::size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, src + i * sizeof(Bits), sizeof(Bits));
    const Bits mag = b & static_cast<Bits>(sign - 1);
    nan[i] = (mag & nan_exp) == nan_exp && (mag & man_mask) != 0;
    const auto m = static_cast<std::int64_t>(mag);
    ord[i] = (b & sign) ? -m : m;
  }
}

}  // namespace

namespace {

// |a - b| of integers of type T, exact: the wider of the two minus the other, in uint64
// (two's complement wraps to the true difference, which always fits).
template <typename T>
void distance_as(const std::byte* a, const std::byte* b, std::size_t n, std::uint64_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    out[i] = x >= y ? static_cast<std::uint64_t>(x) - static_cast<std::uint64_t>(y)
                    : static_cast<std::uint64_t>(y) - static_cast<std::uint64_t>(x);
  }
}

}  // namespace

void integer_distance_block(DType dtype, const std::byte* a, const std::byte* b, std::size_t n,
                            std::uint64_t* out) {
  switch (dtype) {
    case DType::BOOL:
      for (std::size_t i = 0; i < n; ++i) out[i] = (a[i] != std::byte{0}) != (b[i] != std::byte{0});
      return;
    case DType::U8:
      return distance_as<std::uint8_t>(a, b, n, out);
    case DType::I8:
      return distance_as<std::int8_t>(a, b, n, out);
    case DType::U16:
      return distance_as<std::uint16_t>(a, b, n, out);
    case DType::I16:
      return distance_as<std::int16_t>(a, b, n, out);
    case DType::U32:
      return distance_as<std::uint32_t>(a, b, n, out);
    case DType::I32:
      return distance_as<std::int32_t>(a, b, n, out);
    case DType::U64:
      return distance_as<std::uint64_t>(a, b, n, out);
    case DType::I64:
      return distance_as<std::int64_t>(a, b, n, out);
    default:
      throw std::logic_error("integer_distance_block: not an integer dtype");
  }
}

void decode_block(DType dtype, const std::byte* src, std::size_t n, double* out) {
  switch (dtype) {
    case DType::BOOL:
      for (std::size_t i = 0; i < n; ++i) out[i] = src[i] != std::byte{0} ? 1.0 : 0.0;
      return;
    case DType::U8:
      return decode_as<std::uint8_t>(src, n, out);
    case DType::I8:
      return decode_as<std::int8_t>(src, n, out);
    case DType::U16:
      return decode_as<std::uint16_t>(src, n, out);
    case DType::I16:
      return decode_as<std::int16_t>(src, n, out);
    case DType::U32:
      return decode_as<std::uint32_t>(src, n, out);
    case DType::I32:
      return decode_as<std::int32_t>(src, n, out);
    case DType::U64:
      return decode_as<std::uint64_t>(src, n, out);
    case DType::I64:
      return decode_as<std::int64_t>(src, n, out);
    case DType::F32:
      return decode_as<float>(src, n, out);
    case DType::F64:
      return decode_as<double>(src, n, out);
    case DType::BF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;  // bf16 = top half of f32
        float fl;
        std::memcpy(&fl, &w, 4);
        out[i] = fl;
      }
      return;
    case DType::F16: {
      const auto& t = tables().fp16;
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = t[h];
      }
      return;
    }
    case DType::F8_E5M2:
    case DType::F8_E4M3:
    case DType::F8_E8M0:
    case DType::F8_E4M3FNUZ:
    case DType::F8_E5M2FNUZ: {
      const auto& t = tables().fp8[static_cast<int>(dtype)];
      for (std::size_t i = 0; i < n; ++i) out[i] = t[static_cast<std::uint8_t>(src[i])];
      return;
    }
    default:
      for (std::size_t i = 0; i < n; ++i) out[i] = std::numeric_limits<double>::quiet_NaN();
      return;
  }
}

void ordinal_block(DType dtype, const std::byte* src, std::size_t n, std::int64_t* ord, bool* nan) {
  switch (dtype) {
    case DType::F64:
      return ordinals_sign_magnitude<std::uint64_t>(
          src, n, std::uint64_t{1} << 63, 0x7FF0000000000000ULL, 0xFFFFFFFFFFFFFULL, ord, nan);
    case DType::F32:
      return ordinals_sign_magnitude<std::uint32_t>(src, n, 0x80000000u, 0x7F800000u, 0x7FFFFFu,
                                                    ord, nan);
    case DType::BF16:
      return ordinals_sign_magnitude<std::uint16_t>(src, n, 0x8000, 0x7F80, 0x7F, ord, nan);
    case DType::F16:
      return ordinals_sign_magnitude<std::uint16_t>(src, n, 0x8000, 0x7C00, 0x3FF, ord, nan);
    default: {  // 8-bit formats with their own NaN and sign rules, tabulated
      const int k = static_cast<int>(dtype);
      const auto& ordinals = tables().fp8_ordinal[k];
      const auto& nans = tables().fp8_nan[k];
      for (std::size_t i = 0; i < n; ++i) {
        const auto b = static_cast<std::uint8_t>(src[i]);
        nan[i] = nans[b];
        ord[i] = ordinals[b];
      }
      return;
    }
  }
}

}  // namespace numalign
