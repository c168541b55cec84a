// judge_test.cpp: pairing of tensors and the warnings for comparisons that mean little,
// read from the traces' metadata (docs/architecture.md, "Comparisons that mean nothing").
#include "numalign/judge.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "simulations.hpp"

namespace numalign {
namespace {

namespace fs = std::filesystem;
using examples::AllreduceCase;
using examples::AllreduceVariant;
using examples::Buffer;

class JudgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "numalign_judge_XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(const std::string& name, const Buffer& b, const TraceMetadata& meta) {
    const std::string path = (dir_ / name).string();
    const std::map<std::string, std::string> header{{kMetadataKey, meta.to_json()}};
    write_trace(path, {{"out", b.view()}}, &header);
    return path;
  }

  static TraceMetadata meta(const std::string& recipe, const std::string& fingerprint,
                            bool tf32 = false) {
    TraceMetadata m;
    m.dtype_recipe = recipe;
    m.fingerprints = {{"x", fingerprint}};
    m.tf32 = {{"matmul", tf32}};
    return m;
  }

  Report judge_files(const TraceMetadata& test, const TraceMetadata& ref,
                     const TraceMetadata& truth) {
    const AllreduceCase c(4, 2048, 1.0, 5);
    const Trace t = Trace::open(save("test.safetensors", c.run(AllreduceVariant::kFused), test));
    const Trace r = Trace::open(save("ref.safetensors", c.run(AllreduceVariant::kUnfused), ref));
    const Trace u = Trace::open(save("truth.safetensors", c.truth(), truth));
    return judge(t, r, &u, JudgeOptions{});
  }

  static bool warned(const Report& r, const std::string& text) {
    for (const auto& w : r.warnings) {
      if (w.find(text) != std::string::npos) return true;
    }
    return false;
  }

  fs::path dir_;
};

TEST_F(JudgeTest, ConsistentRunsGiveNoWarning) {
  const Report r = judge_files(meta("bf16", "a"), meta("bf16", "a"), meta("fp64", "a"));
  EXPECT_TRUE(r.aligned());
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
}

TEST_F(JudgeTest, DifferentRecipesAreFlagged) {
  const Report r = judge_files(meta("bf16", "a"), meta("fp32", "a"), meta("fp64", "a"));
  EXPECT_TRUE(warned(r, "different precision recipes (ref 'fp32', test 'bf16')"));
}

TEST_F(JudgeTest, DifferentInputsAreFlagged) {
  const Report r = judge_files(meta("bf16", "a"), meta("bf16", "b"), meta("fp64", "a"));
  EXPECT_TRUE(warned(r, "inputs differ between ref and test (fingerprints of x)"));
}

TEST_F(JudgeTest, Tf32IsFlagged) {
  const Report r = judge_files(meta("bf16", "a", true), meta("bf16", "a"), meta("fp64", "a"));
  EXPECT_TRUE(warned(r, "test ran with TF32 on (matmul)"));
}

TEST_F(JudgeTest, TruthAtRefsPrecisionIsFlagged) {
  const Report r = judge_files(meta("bf16", "a"), meta("bf16", "a"), meta("bf16", "a"));
  EXPECT_TRUE(warned(r, "no higher-precision truth"));
}

TEST_F(JudgeTest, MismatchesFailWithTheirReason) {
  const Buffer a = examples::make_buffer(DType::BF16, {4, 2}, std::vector<double>(8, 1.0));
  const Buffer b = examples::make_buffer(DType::F32, {4, 2}, std::vector<double>(8, 1.0));
  const Buffer c = examples::make_buffer(DType::BF16, {8}, std::vector<double>(8, 1.0));
  const Buffer f4{DType::F4, {8}, std::vector<std::byte>(4)};
  const TensorView av = a.view(), bv = b.view(), cv = c.view(), f4v = f4.view();
  const Report r = judge_tensors({{"dtype", &av, &bv, nullptr},
                                  {"shape", &av, &cv, nullptr},
                                  {"missing", nullptr, &av, nullptr},
                                  {"packed", &f4v, &f4v, nullptr}},
                                 JudgeOptions{});
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
  std::map<std::string, const TensorResult*> by;
  for (const auto& t : r.tensors) by[t.name] = &t;
  EXPECT_EQ(by["dtype"]->reason, "dtype mismatch: test BF16, ref F32");
  EXPECT_EQ(by["shape"]->reason, "shape mismatch: test [4, 2], ref [8]");
  EXPECT_EQ(by["missing"]->reason, "missing from test");
  EXPECT_EQ(by["packed"]->verdict, VerdictKind::kError);
  EXPECT_NE(by["packed"]->reason.find("not supported yet"), std::string::npos);
  EXPECT_EQ(r.tensors.front().name, "packed") << "could-not-judge comes first";
}

}  // namespace
}  // namespace numalign
