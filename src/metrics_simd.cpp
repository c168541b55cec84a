// metrics_simd.cpp: the fused pass's SIMD kernel (metrics_simd-inl.hpp), compiled once per
// instruction set by Highway (foreach_target) and dispatched at run time to the best one
// this CPU supports. Each target picks a codec per dtype, once per chunk, and runs the
// kernel's block loop with it; the elements after the last whole vector, and exotic
// tolerances, go to the scalar reference path.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "metrics_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Include order matters: foreach_target re-includes this file once per target.
#include <hwy/highway.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_features.hpp"
#include "isclose.hpp"
#include "metrics_internal.hpp"
#include "metrics_simd-inl.hpp"  // the codecs and the block loop, per target

HWY_BEFORE_NAMESPACE();
namespace numalign::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether this target converts float16 in hardware. Below AVX2 Highway emulates the
// conversion and maps Inf/NaN to finite values (the every-pattern test caught it): there,
// and off x86, f16 takes the exact table decode and the 8-bit floats the integer one.
#if HWY_ARCH_X86 && HWY_TARGET < HWY_SSE4 && !defined(HWY_DISABLE_F16C)
constexpr bool kHardwareHalf = true;
#else
constexpr bool kHardwareHalf = false;
#endif

template <bool kTruth>
Partial AccumulateDispatch(const MetricsInput& in, const MetricOptions& opt, const CloseBand& band,
                           std::uint64_t begin, std::uint64_t end) {
  switch (in.test->dtype) {
    case DType::BF16:
      return AccumulateWith<HalfCodec<DType::BF16>, kTruth>(in, opt, band, begin, end);
    case DType::F16:
      if constexpr (kHardwareHalf) {
        return AccumulateWith<HalfCodec<DType::F16>, kTruth>(in, opt, band, begin, end);
      } else {
        return AccumulateWith<BufferedCodec, kTruth>(in, opt, band, begin, end);
      }
    case DType::F32:
      return AccumulateWith<F32Codec, kTruth>(in, opt, band, begin, end);
    case DType::F64:
      return AccumulateWith<F64Codec, kTruth>(in, opt, band, begin, end);
    case DType::F8_E5M2:
    case DType::F8_E4M3:
    case DType::F8_E4M3FNUZ:
    case DType::F8_E5M2FNUZ:
      return AccumulateWith<Fp8Codec<kHardwareHalf>, kTruth>(in, opt, band, begin, end);
    case DType::F8_E8M0:  // no sign, no mantissa, past float16's range: the integer decode
      return AccumulateWith<Fp8Codec<false>, kTruth>(in, opt, band, begin, end);
    default:
      return AccumulateWith<BufferedCodec, kTruth>(in, opt, band, begin, end);
  }
}

Partial Accumulate(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                   std::uint64_t end) {
  // The allclose bands above assume a non-negative tolerance; anything else is exotic.
  if (!(opt.tol >= 0)) return accumulate_scalar(in, opt, begin, end);
  // Integers compare exactly, in 64-bit integer arithmetic: the scalar path (vectors of
  // doubles cannot tell 2^53 from 2^53 + 1).
  if (!is_floating(in.test->dtype)) return accumulate_scalar(in, opt, begin, end);
  const std::uint64_t simd_end = begin + (end - begin) / hn::Lanes(D()) * hn::Lanes(D());
  const CloseBand band = close_band(in.test->dtype, opt.tol);
  Partial p = in.truth ? AccumulateDispatch<true>(in, opt, band, begin, simd_end)
                       : AccumulateDispatch<false>(in, opt, band, begin, simd_end);
  // The last elements short of a whole vector: the scalar path.
  if (simd_end < end) p.merge(accumulate_scalar(in, opt, simd_end, end));
  return p;
}

// The extensions this target was compiled for: the CPU must have all of them.
const char* TargetFeatures() {
#ifdef HWY_TARGET_STR
  return HWY_TARGET_STR;
#else
  return "";
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace numalign::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace numalign {
namespace detail {

namespace {

// Our own dispatch rather than HWY_DYNAMIC_DISPATCH, which would link every process to
// libhwy.so, whose load-time initializer (a timer calibration) adds about 10 ms to each
// run of the CLI. A target is usable when this CPU supports every extension of the
// attribute Highway compiled it with, which bounds the instructions it can contain.
struct SimdTarget {
  const char* name;
  const char* features;
  Partial (*accumulate)(const MetricsInput&, const MetricOptions&, std::uint64_t, std::uint64_t);
};

#define NUMALIGN_SIMD_TARGET(T) \
  SimdTarget { hwy::TargetName(HWY_##T), N_##T::TargetFeatures(), &N_##T::Accumulate }

// Compiled targets, best first; the last one needs no extension.
std::vector<SimdTarget> compiled_targets() {
  std::vector<SimdTarget> all;
#if HWY_ARCH_X86
#if HWY_TARGETS & HWY_AVX3
  all.push_back(NUMALIGN_SIMD_TARGET(AVX3));
#endif
#if HWY_TARGETS & HWY_AVX2
  all.push_back(NUMALIGN_SIMD_TARGET(AVX2));
#endif
#if HWY_TARGETS & HWY_SSE4
  all.push_back(NUMALIGN_SIMD_TARGET(SSE4));
#endif
#if HWY_TARGETS & HWY_SSSE3
  all.push_back(NUMALIGN_SIMD_TARGET(SSSE3));
#endif
#endif
  // The baseline every build has (SCALAR or EMU128 on x86 without -march flags).
  all.push_back({hwy::TargetName(HWY_STATIC_TARGET), HWY_STATIC_DISPATCH(TargetFeatures)(),
                 &HWY_STATIC_DISPATCH(Accumulate)});
  return all;
}

#undef NUMALIGN_SIMD_TARGET

const std::vector<SimdTarget>& usable_targets() {
  static const std::vector<SimdTarget> usable = [] {
    std::vector<SimdTarget> out;
    for (const SimdTarget& t : compiled_targets()) {
      if (cpu_supports_all(t.features)) out.push_back(t);
    }
    return out;
  }();
  return usable;
}

// Index into usable_targets(): 0, the best, unless a test chose another.
std::atomic<std::size_t> chosen_target{0};

}  // namespace

Partial accumulate_simd(const MetricsInput& in, const MetricOptions& opt, std::uint64_t begin,
                        std::uint64_t end) {
  return usable_targets()[chosen_target.load(std::memory_order_relaxed)].accumulate(in, opt, begin,
                                                                                    end);
}

std::vector<std::string> usable_simd_targets() {
  std::vector<std::string> names;
  for (const SimdTarget& t : usable_targets()) names.push_back(t.name);
  return names;
}

void choose_simd_target(const std::string& name) {
  const auto& usable = usable_targets();
  for (std::size_t i = 0; i < usable.size(); ++i) {
    if (name.empty() ? i == 0 : name == usable[i].name) {
      chosen_target = i;
      return;
    }
  }
  throw std::invalid_argument("no usable SIMD target named " + name);
}

}  // namespace detail

std::string simd_target() { return detail::usable_targets()[detail::chosen_target.load()].name; }

}  // namespace numalign
#endif  // HWY_ONCE
