// cpu_features_test.cpp: our CPUID reading agrees with the compiler's own, and target
// attribute strings are supported only when every extension they name is.
#include "cpu_features.hpp"

#include <gtest/gtest.h>

namespace numalign::detail {
namespace {

TEST(CpuFeaturesTest, AgreesWithTheCompilersCpuChecks) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports takes literals only: one line per extension.
#define NUMALIGN_EXPECT_SAME(name) \
  EXPECT_EQ(cpu_supports(name), __builtin_cpu_supports(name) != 0) << name
  NUMALIGN_EXPECT_SAME("sse2");
  NUMALIGN_EXPECT_SAME("ssse3");
  NUMALIGN_EXPECT_SAME("sse4.1");
  NUMALIGN_EXPECT_SAME("sse4.2");
  NUMALIGN_EXPECT_SAME("avx");
  NUMALIGN_EXPECT_SAME("fma");
  NUMALIGN_EXPECT_SAME("avx2");
  NUMALIGN_EXPECT_SAME("bmi");
  NUMALIGN_EXPECT_SAME("bmi2");
  NUMALIGN_EXPECT_SAME("avx512f");
  NUMALIGN_EXPECT_SAME("avx512dq");
  NUMALIGN_EXPECT_SAME("avx512bw");
  NUMALIGN_EXPECT_SAME("avx512vl");
  NUMALIGN_EXPECT_SAME("avx512vbmi");
#undef NUMALIGN_EXPECT_SAME
  EXPECT_TRUE(cpu_supports("sse2")) << "every x86-64 CPU has it";
#else
  EXPECT_FALSE(cpu_supports("sse2")) << "no extension is known off x86";
#endif
}

TEST(CpuFeaturesTest, AListIsSupportedWhenEveryNameIs) {
  EXPECT_TRUE(cpu_supports_all("")) << "a target without extensions runs anywhere";
  EXPECT_FALSE(cpu_supports("no-such-extension"));
  EXPECT_FALSE(cpu_supports("SSE2")) << "names are GCC's, lower case";
  EXPECT_FALSE(cpu_supports_all("no-such-extension"));
  EXPECT_EQ(cpu_supports_all("sse2,ssse3"), cpu_supports("sse2") && cpu_supports("ssse3"));
  EXPECT_FALSE(cpu_supports_all("sse2,no-such-extension"));
  EXPECT_FALSE(cpu_supports_all("no-such-extension,sse2"));
}

}  // namespace
}  // namespace numalign::detail
