// fault_guard_test.cpp: a mapped trace truncated under the judge is an error naming the file;
// the process survives and judges again.
#include "fault_guard.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

#include "numalign/consistency.hpp"
#include "numalign/error.hpp"
#include "numalign/judge.hpp"
#include "numalign/trace.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

using testing::TempDir;

void write_floats(const std::string& path, DType dtype, std::size_t n, double scale) {
  std::vector<double> d(n);
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = f[i] = static_cast<float>(scale * (i % 1000) / 7.0);
  const auto* bytes = dtype == DType::F64 ? reinterpret_cast<const std::byte*>(d.data())
                                          : reinterpret_cast<const std::byte*>(f.data());
  write_trace(path, {{"a", {dtype, {n}, bytes}}, {"b", {dtype, {n}, bytes}}});
}

TEST(FaultGuardTest, ATraceTruncatedAfterOpeningIsAnErrorNamingItNotASignal) {
  TempDir dir;
  constexpr std::size_t n = std::size_t{1} << 20;  // 4 MiB of F32 per tensor
  const std::string test = dir.file("test.safetensors"), ref = dir.file("ref.safetensors"),
                    truth = dir.file("truth.safetensors");
  write_floats(test, DType::F32, n, 1.0);
  write_floats(ref, DType::F32, n, 1.0);
  write_floats(truth, DType::F64, n, 1.0);
  for (const int threads : {1, 2}) {
    const Trace t = Trace::open(test), r = Trace::open(ref), u = Trace::open(truth);
    ASSERT_EQ(::truncate(test.c_str(), 4096), 0);
    JudgeOptions options;
    options.threads = threads;
    try {
      judge(t, r, &u, options);
      FAIL() << "judged a file that shrank";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), test);
      EXPECT_NE(e.problem().find("changed while being read"), std::string::npos) << e.problem();
    }
    write_floats(test, DType::F32, n, 1.0);  // the process is fine: judge again
    EXPECT_TRUE(judge(Trace::open(test), r, &u, options).aligned());
  }
}

// The replica check compares ranks' bytes before any metric: a rank's file that shrank there
// is an error naming it too (it was a SIGBUS that killed the process).
TEST(FaultGuardTest, ARankTruncatedBeforeTheReplicaCheckIsAnError) {
  TempDir dir;
  constexpr std::size_t n = std::size_t{1} << 20;
  const std::string r0 = dir.file("r0.safetensors"), r1 = dir.file("r1.safetensors");
  write_floats(r0, DType::F32, n, 1.0);
  write_floats(r1, DType::F32, n, 1.0);
  const Trace a = Trace::open(r0), b = Trace::open(r1);
  ASSERT_EQ(::truncate(r1.c_str(), 4096), 0);
  try {
    check_consistent({&a, &b}, {r0, r1}, parse_rule("exact"), {}, 1);
    FAIL() << "compared a file that shrank";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), r1);
    EXPECT_NE(e.problem().find("changed while being read"), std::string::npos) << e.problem();
  }
}

TEST(FaultGuardTest, ExceptionsOfAGuardedCallPassThrough) {
  EXPECT_THROW(detail::guarded([] { fail("x", "y"); }), Error);
  int calls = 0;
  detail::guarded([&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace numalign
