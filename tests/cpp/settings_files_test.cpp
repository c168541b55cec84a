// settings_files_test.cpp: map and policy files are read as traces are (regular files only,
// bounded), and a key given twice in them is refused rather than silently taking one value.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "numalign/error.hpp"
#include "numalign/map.hpp"
#include "numalign/rules.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

using testing::TempDir;

// The problem `read` throws for `path`; "" when it does not throw.
template <class Read>
std::string problem_of(const Read& read) {
  try {
    read();
  } catch (const Error& e) {
    return e.problem();
  }
  return "";
}

std::string policy_problem(const std::string& path) {
  return problem_of([&] {
    JudgeOptions o;
    load_policy(path, o);
  });
}

std::string map_problem(const std::string& path) {
  return problem_of([&] { TensorMap::load(path); });
}

// A FIFO would block the open (no writer) or never end; a device can be endless.
TEST(SettingsFilesTest, FifosDevicesAndDirectoriesAreRefusedWithoutReading) {
  TempDir dir;
  const std::string fifo = dir.file("settings.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    EXPECT_NE(policy_problem(path).find("not a regular file"), std::string::npos) << path;
    EXPECT_NE(map_problem(path).find("not a regular file"), std::string::npos) << path;
  }
  EXPECT_NE(policy_problem(dir.path().string()).find("is a directory, not a policy file"),
            std::string::npos);
  EXPECT_NE(map_problem(dir.path().string()).find("is a directory, not a map file"),
            std::string::npos);
  EXPECT_NE(policy_problem(dir.file("absent.json")).find("cannot open"), std::string::npos);
}

TEST(SettingsFilesTest, FilesBeyondTheBoundAreRefused) {
  TempDir dir;
  const std::string big = dir.file("big.json");
  std::ofstream(big) << "{}";
  ASSERT_EQ(::truncate(big.c_str(), (std::int64_t{64} << 20) + 1), 0);  // sparse
  EXPECT_NE(policy_problem(big).find("of more than 64 MiB"), std::string::npos)
      << policy_problem(big);
  EXPECT_NE(map_problem(big).find("of more than 64 MiB"), std::string::npos);
  const std::string small = dir.file("small.json");
  std::ofstream(small) << R"({"tol": 0.001})";
  JudgeOptions o;
  load_policy(small, o);
  EXPECT_EQ(o.tol, 0.001);
}

std::string parsed_policy_problem(const std::string& json) {
  return problem_of([&] {
    JudgeOptions o;
    parse_policy(json, "p.json", o);
  });
}

TEST(SettingsFilesTest, AKeyGivenTwiceIsRefused) {
  EXPECT_NE(parsed_policy_problem(R"({"tol": 0.1, "tol": 1e-4})")
                .find("the policy: the key \"tol\" is given twice"),
            std::string::npos);
  EXPECT_NE(
      parsed_policy_problem(R"({"overrides": [{"match": "a", "rule": "exact", "rule": "ulp:4"}]})")
          .find("\"overrides\"[0]: the key \"rule\" is given twice"),
      std::string::npos)
      << parsed_policy_problem(R"({"overrides": [{"match": "a", "rule": "exact", "rule": "x"}]})");
  EXPECT_EQ(parsed_policy_problem(R"({"tol": 0.1, "check_bias": true})"), "");
  const auto map_of = [](const std::string& json) {
    return problem_of([&] { TensorMap::parse(json, "m.json"); });
  };
  EXPECT_NE(map_of(R"({"map": [{"test": "f", "ref": ["q", "k"], "cat_dim": 5, "cat_dim": 0}]})")
                .find("map entry 1: the key \"cat_dim\" is given twice"),
            std::string::npos)
      << map_of(R"({"map": [{"test": "f", "ref": ["q", "k"], "cat_dim": 5, "cat_dim": 0}]})");
  EXPECT_NE(map_of(R"({"map": [], "map": [{"test": "a", "ref": "b"}]})")
                .find("the map: the key \"map\" is given twice"),
            std::string::npos);
  EXPECT_NE(map_of(R"({"map": [], "ignore": [{"ref": "a", "reason": "x", "reason": "y"}]})")
                .find("the key \"reason\" is given twice"),
            std::string::npos);
}

}  // namespace
}  // namespace numalign
