// cpu_features.cpp: CPUID and XGETBV, read once.
#include "cpu_features.hpp"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace numalign::detail {

namespace {

#if defined(__x86_64__) || defined(__i386__)

struct CpuidBits {
  std::uint32_t ecx1 = 0, edx1 = 0;  // leaf 1
  std::uint32_t ebx7 = 0, ecx7 = 0;  // leaf 7, subleaf 0
  std::uint64_t xcr0 = 0;            // register state the OS saves on context switches
};

CpuidBits read_cpuid() {
  CpuidBits b;
  unsigned a = 0, bx = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &bx, &c, &d)) {
    b.ecx1 = c;
    b.edx1 = d;
  }
  if (__get_cpuid_count(7, 0, &a, &bx, &c, &d)) {
    b.ebx7 = bx;
    b.ecx7 = c;
  }
  if (b.ecx1 & (1u << 27)) {  // OSXSAVE: XGETBV is usable
    std::uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    b.xcr0 = (static_cast<std::uint64_t>(hi) << 32) | lo;
  }
  return b;
}

struct Feature {
  std::string_view name;
  enum Register { kEcx1, kEdx1, kEbx7, kEcx7 } reg;
  int bit;
  enum State { kNone, kAvx, kAvx512 } state;  // register state the extension needs
};

// The extensions named in Highway's x86 target attributes (hwy/ops/set_macros-inl.h).
constexpr Feature kFeatures[] = {
    {"sse2", Feature::kEdx1, 26, Feature::kNone},
    {"ssse3", Feature::kEcx1, 9, Feature::kNone},
    {"sse4.1", Feature::kEcx1, 19, Feature::kNone},
    {"sse4.2", Feature::kEcx1, 20, Feature::kNone},
    {"pclmul", Feature::kEcx1, 1, Feature::kNone},
    {"aes", Feature::kEcx1, 25, Feature::kNone},
    {"avx", Feature::kEcx1, 28, Feature::kAvx},
    {"fma", Feature::kEcx1, 12, Feature::kAvx},
    {"f16c", Feature::kEcx1, 29, Feature::kAvx},
    {"avx2", Feature::kEbx7, 5, Feature::kAvx},
    {"bmi", Feature::kEbx7, 3, Feature::kNone},
    {"bmi2", Feature::kEbx7, 8, Feature::kNone},
    {"avx512f", Feature::kEbx7, 16, Feature::kAvx512},
    {"avx512dq", Feature::kEbx7, 17, Feature::kAvx512},
    {"avx512bw", Feature::kEbx7, 30, Feature::kAvx512},
    {"avx512vl", Feature::kEbx7, 31, Feature::kAvx512},
    {"avx512vbmi", Feature::kEcx7, 1, Feature::kAvx512},
    {"avx512vbmi2", Feature::kEcx7, 6, Feature::kAvx512},
    {"gfni", Feature::kEcx7, 8, Feature::kNone},
    {"vaes", Feature::kEcx7, 9, Feature::kAvx},
    {"vpclmulqdq", Feature::kEcx7, 10, Feature::kAvx},
    {"avx512vnni", Feature::kEcx7, 11, Feature::kAvx512},
    {"avx512bitalg", Feature::kEcx7, 12, Feature::kAvx512},
    {"avx512vpopcntdq", Feature::kEcx7, 14, Feature::kAvx512},
};

bool supported(const Feature& f, const CpuidBits& b) {
  const std::uint32_t regs[] = {b.ecx1, b.edx1, b.ebx7, b.ecx7};
  if (!(regs[f.reg] & (1u << f.bit))) return false;
  constexpr std::uint64_t kXmmYmm = 0x6;  // SSE and AVX state
  constexpr std::uint64_t kZmm = 0xe0;    // opmask, upper ZMM halves, ZMM16-31
  switch (f.state) {
    case Feature::kNone:
      return true;
    case Feature::kAvx:
      return (b.xcr0 & kXmmYmm) == kXmmYmm;
    case Feature::kAvx512:
      return (b.xcr0 & (kXmmYmm | kZmm)) == (kXmmYmm | kZmm);
  }
  return false;
}

#endif

}  // namespace

bool cpu_supports(std::string_view feature) {
#if defined(__x86_64__) || defined(__i386__)
  static const CpuidBits bits = read_cpuid();
  for (const Feature& f : kFeatures) {
    if (f.name == feature) return supported(f, bits);
  }
#else
  (void)feature;
#endif
  return false;
}

bool cpu_supports_all(std::string_view features) {
  while (!features.empty()) {
    const auto comma = features.find(',');
    if (!cpu_supports(features.substr(0, comma))) return false;
    if (comma == std::string_view::npos) break;
    features.remove_prefix(comma + 1);
  }
  return true;
}

}  // namespace numalign::detail
