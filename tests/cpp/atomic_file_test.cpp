// atomic_file_test.cpp: the target changes only on commit; an abort or an exception leaves it
// as it was and no temporary file behind.
#include "atomic_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "numalign/error.hpp"
#include "temp_dir.hpp"

namespace numalign::detail {
namespace {

namespace fs = std::filesystem;
using numalign::testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t files_in(const TempDir& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++n;
  return n;
}

TEST(AtomicFileTest, TheTargetAppearsOnlyOnCommitWithEverythingWritten) {
  TempDir dir;
  const std::string target = dir.file("out.bin");
  {
    AtomicFile f(target);
    EXPECT_EQ(f.target(), target);
    f.write("abc");
    const char more[2] = {'\0', 'd'};
    f.write(more, 2);
    EXPECT_FALSE(fs::exists(target));
    EXPECT_EQ(files_in(dir), 1u) << "the temporary file, in the target's folder";
    f.commit();
  }
  EXPECT_EQ(read_all(target), std::string("abc\0d", 5));
  EXPECT_EQ(files_in(dir), 1u);
}

TEST(AtomicFileTest, AbortAndDestructionLeaveThePreviousFileAndNoTemporary) {
  TempDir dir;
  const std::string target = dir.file("keep.txt");
  std::ofstream(target) << "before";
  {
    AtomicFile f(target);
    f.write("after");
    f.abort();
    EXPECT_EQ(files_in(dir), 1u) << "abort removes the temporary at once";
  }
  EXPECT_EQ(read_all(target), "before");
  try {
    AtomicFile f(target);
    f.write("after");
    throw std::runtime_error("a writer failed midway");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read_all(target), "before");
  EXPECT_EQ(files_in(dir), 1u);
}

TEST(AtomicFileTest, FailuresNameTheTarget) {
  TempDir dir;
  const std::string nowhere = dir.file("missing/out.bin");
  try {
    AtomicFile f(nowhere);
    FAIL() << "created";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), nowhere);
  }
  // A rename over a directory fails: the temporary is removed and the directory stays.
  const std::string folder = dir.file("folder");
  fs::create_directory(folder);
  fs::create_directory(dir.file("folder/inside"));
  try {
    AtomicFile f(folder);
    f.write("x");
    f.commit();
    FAIL() << "renamed over a non-empty directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), folder);
    EXPECT_EQ(e.problem().rfind("cannot rename into place: ", 0), 0u) << e.problem();
  }
  EXPECT_TRUE(fs::is_directory(folder));
  EXPECT_EQ(files_in(dir), 1u);
}

}  // namespace
}  // namespace numalign::detail
