// cli_test.cpp: the numalign executable end to end on the example traces: exit codes, the
// JSON report's fields, failures first, missing tensors, bad files and bad arguments.
#include <gtest/gtest.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "numalign/metrics.hpp"
#include "numalign/trace.hpp"

namespace numalign {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out;  // stdout and stderr together
};

CliRun cli(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + std::string(NUMALIGN_CLI) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = (fs::temp_directory_path() / "numalign_cli_XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
    const std::string cmd = std::string(NUMALIGN_EXAMPLES) + " " + dir_.string() + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string mm(const std::string& name) {
    return (dir_ / "matmul" / (name + ".safetensors")).string();
  }
  static std::string ar(const std::string& name) {
    return (dir_ / "allreduce" / (name + ".safetensors")).string();
  }
  static inline fs::path dir_;
};

TEST_F(CliTest, AlignedRunExitsZero) {
  const CliRun r = cli("judge " + mm("reordered") + " " + mm("ref") + " " + mm("truth"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ALIGNED: 2 of 2 tensors pass"), std::string::npos) << r.out;
}

TEST_F(CliTest, JsonReportHasEveryFieldAndFailuresFirst) {
  const CliRun r = cli("judge " + mm("dropped_column") + " " + mm("ref") + " " + mm("truth") +
                       " --rule 'bf16.*=rmse' --format json");
  EXPECT_EQ(r.code, 1) << r.out;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_FALSE(parser.parse(simdjson::padded_string(r.out)).get(doc)) << r.out;
  EXPECT_EQ(bool(doc["aligned"]), false);
  EXPECT_EQ(uint64_t(doc["summary"]["tensors"]), 2u);
  EXPECT_EQ(uint64_t(doc["summary"]["failed"]), 2u);
  EXPECT_EQ(std::string_view(doc["summary"]["worst"]), "fp32.out");
  simdjson::dom::array tensors = doc["tensors"];
  ASSERT_EQ(tensors.size(), 2u);
  // Worst first: fp32's ratio (> 1e5) over bf16's (~50).
  EXPECT_EQ(std::string_view(tensors.at(0)["name"]), "fp32.out");
  EXPECT_GT(double(tensors.at(0)["ratio"]), double(tensors.at(1)["ratio"]));
  for (const char* field :
       {"name",   "verdict", "rule",    "reason",    "dtype",    "shape",         "numel",
        "ratio",  "limit",   "error",   "baseline",  "max_abs",  "max_abs_index", "rel_l2",
        "cosine", "bias",    "max_ulp", "frac_diff", "ulp_hist", "nonfinite"}) {
    EXPECT_FALSE(tensors.at(0)[field].error()) << field;
  }
  EXPECT_EQ(std::string_view(tensors.at(0)["verdict"]), "fail");
  EXPECT_EQ(simdjson::dom::array(tensors.at(0)["max_abs_index"]).size(), 2u);
}

TEST_F(CliTest, MissingTensorFailsByName) {
  const Trace full = Trace::open(mm("reordered"));
  const std::string partial = (dir_ / "partial.safetensors").string();
  write_trace(partial, {{"bf16.out", full.find("bf16.out")->view}});
  const CliRun r = cli("judge " + partial + " " + mm("ref") + " " + mm("truth"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("missing from test"), std::string::npos) << r.out;
  const std::size_t fail_at = r.out.find("FAIL"), pass_at = r.out.find("PASS");
  ASSERT_NE(fail_at, std::string::npos);
  EXPECT_LT(fail_at, pass_at) << "failures come before passes";
}

TEST_F(CliTest, ExtraTensorsInTestAreAWarning) {
  const Trace full = Trace::open(mm("ref"));
  const std::string partial = (dir_ / "ref_bf16_only.safetensors").string();
  write_trace(partial, {{"bf16.out", full.find("bf16.out")->view}});
  const CliRun r =
      cli("judge " + mm("reordered") + " " + partial + " " + mm("truth") + " --format json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 tensor(s) only in test, not judged: fp32.out"), std::string::npos)
      << r.out;
}

TEST_F(CliTest, BadFilesExitTwoWithTheFileNamed) {
  const std::string bad = (dir_ / "bad.safetensors").string();
  std::ofstream(bad) << "nope";
  const CliRun r = cli("judge " + bad + " " + mm("ref") + " " + mm("truth"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("numalign: error: " + bad + ": file is 4 bytes"), std::string::npos)
      << r.out;
  // The three traces open at once; with several bad, the first in argument order is named.
  const std::string gone = (dir_ / "gone.safetensors").string();
  const CliRun two_bad = cli("judge " + mm("reordered") + " " + bad + " " + gone);
  EXPECT_EQ(two_bad.code, 2);
  EXPECT_NE(two_bad.out.find("numalign: error: " + bad + ":"), std::string::npos) << two_bad.out;
  EXPECT_EQ(two_bad.out.find(gone), std::string::npos) << two_bad.out;
  const CliRun missing = cli("inspect " + (dir_ / "nowhere.safetensors").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("cannot open"), std::string::npos) << missing.out;
}

TEST_F(CliTest, BadArgumentsExitTwo) {
  EXPECT_EQ(cli("judge " + mm("ref")).code, 2);
  EXPECT_EQ(cli("judge " + mm("ref") + " " + mm("ref") + " --rule ulp:x").code, 2);
  EXPECT_EQ(cli("frobnicate").code, 2);
  const CliRun loose = cli("judge " + ar("fused") + " " + ar("unfused") + " --rule 'out.*=ulp:8'");
  EXPECT_EQ(loose.code, 2);
  EXPECT_NE(loose.out.find("has no reason"), std::string::npos) << loose.out;
}

TEST_F(CliTest, PolicyReasonsArePrinted) {
  const std::string policy = (dir_ / "policy.json").string();
  std::ofstream(policy) << R"({"overrides": [{"match": "out.*", "rule": "ulp:20000",
    "reason": "fused kernel rounds once; cancellation makes ULPs of the tiny output huge"}]})";
  const CliRun r = cli("judge " + ar("fused") + " " + ar("unfused") + " --policy " + policy);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("override reason: fused kernel rounds once"), std::string::npos) << r.out;
}

// --map pairs tensors whose names differ; a map's mistake exits 2 naming the file and entry;
// the output may not replace the map.
TEST_F(CliTest, AMapPairsRenamedTensorsAndItsMistakesExitTwo) {
  const Trace t = Trace::open(mm("dropped_column"));
  std::vector<NamedTensor> renamed;
  for (const auto& e : t.entries()) renamed.push_back({"impl." + e.name, e.view});
  const std::string test = (dir_ / "renamed.safetensors").string();
  write_trace(test, renamed, nullptr);
  const std::string map = (dir_ / "map.json").string();
  std::ofstream(map) << R"({"map": [{"test": "impl.*", "ref": "{1}"}]})";
  const CliRun without = cli("judge " + test + " " + mm("ref") + " " + mm("truth"));
  EXPECT_EQ(without.code, 1) << without.out;
  EXPECT_NE(without.out.find("missing from test"), std::string::npos) << without.out;
  const CliRun with = cli("judge " + test + " " + mm("ref") + " " + mm("truth") + " --map " + map);
  const CliRun plain = cli("judge " + mm("dropped_column") + " " + mm("ref") + " " + mm("truth"));
  EXPECT_EQ(with.code, plain.code) << with.out;
  EXPECT_EQ(with.code, 1) << with.out;
  EXPECT_NE(with.out.find("test: impl."), std::string::npos) << "the source is shown\n" << with.out;
  const CliRun sens =
      cli("sensitivity " + test + " " + mm("ref") + " " + mm("truth") + " --map " + map);
  EXPECT_EQ(sens.code, 0) << sens.out;
  EXPECT_EQ(sens.out.find("missing"), std::string::npos) << sens.out;
  const CliRun sens_ranks = cli("sensitivity " + test + " " + mm("ref") + " --ranks 2");
  EXPECT_EQ(sens_ranks.code, 2) << sens_ranks.out;
  EXPECT_NE(sens_ranks.out.find("--ranks: sensitivity plants bugs in one test run"),
            std::string::npos)
      << sens_ranks.out;
  std::ofstream(map) << R"({"map": [], "ignore": [{"ref": "*"}]})";
  const CliRun bad = cli("judge " + test + " " + mm("ref") + " " + mm("truth") + " --map " + map);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find(map + ": ignore 1 (ref \"*\") needs a written reason"), std::string::npos)
      << bad.out;
  const CliRun clobber =
      cli("judge " + test + " " + mm("ref") + " " + mm("truth") + " --map " + map + " -o " + map);
  EXPECT_EQ(clobber.code, 2) << clobber.out;
}

TEST_F(CliTest, TruthIsRequiredByRmseOnly) {
  const CliRun no_truth = cli("judge " + ar("fused") + " " + ar("unfused"));
  EXPECT_EQ(no_truth.code, 2) << no_truth.out;
  EXPECT_NE(no_truth.out.find("needs a float64 truth"), std::string::npos);
  const CliRun cmp = cli("compare " + ar("fused") + " " + ar("unfused") + " --rule abs:0.13");
  EXPECT_EQ(cmp.code, 1) << cmp.out;
  const CliRun self = cli("compare " + ar("fused") + " " + ar("fused"));
  EXPECT_EQ(self.code, 0) << self.out;
  EXPECT_NE(self.out.find("bit-identical"), std::string::npos) << self.out;
}

TEST_F(CliTest, OutputFileJunitAndInspect) {
  const std::string out = (dir_ / "report.xml").string();
  const CliRun r = cli("judge " + mm("dropped_column") + " " + mm("ref") + " " + mm("truth") +
                       " --format junit -o " + out);
  EXPECT_EQ(r.code, 1);
  std::ifstream in(out);
  const std::string xml((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(xml.find("<testsuite name=\"numalign\" tests=\"2\" failures=\"2\" errors=\"0\">"),
            std::string::npos)
      << xml;
  EXPECT_NE(r.out.find("NOT ALIGNED"), std::string::npos) << "a one-line outcome on stderr";
  const CliRun ins = cli("inspect " + mm("truth"));
  EXPECT_EQ(ins.code, 0);
  EXPECT_NE(ins.out.find("bf16.out"), std::string::npos);
  EXPECT_NE(ins.out.find("F64"), std::string::npos);
  EXPECT_NE(ins.out.find("\"role\":\"truth\""), std::string::npos) << ins.out;
}

TEST_F(CliTest, OnlySelectsTensorsAndShardFoldersAreOneTrace) {
  const CliRun only = cli("judge " + mm("dropped_column") + " " + mm("ref") + " " + mm("truth") +
                          " --only 'bf16.*' --format json");
  EXPECT_EQ(only.code, 1) << only.out;
  EXPECT_NE(only.out.find("\"tensors\":1,"), std::string::npos) << only.out;
  EXPECT_EQ(only.out.find("fp32.out"), std::string::npos) << only.out;
  // The reference split into two shards in a folder judges like the single file.
  const Trace ref = Trace::open(mm("ref"));
  const fs::path shards = dir_ / "ref_shards";
  fs::create_directories(shards);
  write_trace((shards / "a.safetensors").string(), {{"bf16.out", ref.find("bf16.out")->view}});
  write_trace((shards / "b.safetensors").string(), {{"fp32.out", ref.find("fp32.out")->view}});
  const CliRun sharded =
      cli("judge " + mm("reordered") + " " + shards.string() + " " + mm("truth"));
  EXPECT_EQ(sharded.code, 0) << sharded.out;
  EXPECT_NE(sharded.out.find("ALIGNED: 2 of 2 tensors pass"), std::string::npos) << sharded.out;
}

TEST_F(CliTest, DumpAroundAnIndexAsTheReportPrintsIt) {
  // fp32.out is [32, 32]: (3, 17) is element 113; five around it, it marked.
  CliRun r = cli("dump " + mm("ref") + " fp32.out --at 3,17 -n 5");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> lines;
  for (std::size_t at = 0, nl; (nl = r.out.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(r.out.substr(at, nl - at));
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_TRUE(lines[0].starts_with("111 [3,15] 0x")) << r.out;
  EXPECT_TRUE(lines[2].starts_with("113 [3,17] 0x")) << r.out;
  EXPECT_TRUE(lines[2].ends_with(" <")) << r.out;
  EXPECT_FALSE(lines[3].ends_with(" <")) << r.out;
  // The same element as a plain dump prints, bits and value.
  const CliRun plain = cli("dump " + mm("ref") + " fp32.out -n 114");
  const std::size_t line113 = plain.out.find("\n113 ") + 1;
  const std::string expected =
      plain.out.substr(line113 + 4, plain.out.find('\n', line113) - line113 - 4);
  EXPECT_EQ(lines[2], "113 [3,17] " + expected + " <");
  // As the report writes it; and at the end the window stays inside the tensor.
  r = cli("dump " + mm("ref") + " fp32.out --at '(31, 31)' -n 3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(r.out.starts_with("1021 [31,29] ")) << r.out;
  EXPECT_NE(r.out.find("\n1023 [31,31] "), std::string::npos) << r.out;
  // Clear errors, exit 2.
  const std::pair<const char*, const char*> bad[] = {
      {"3,32", "--at 3,32: index 32 is out of range for dimension 1 of size 32 (shape [32, 32])"},
      {"3", "--at 3: 1 index for a tensor of shape [32, 32] (2 dimensions)"},
      {"1,2,3", "--at 1,2,3: 3 indexes for a tensor of shape [32, 32] (2 dimensions)"},
      {"3,-1", "--at 3,-1: expected integers separated by commas, as 3,17"},
      {"3,", "--at 3,: expected integers separated by commas, as 3,17"},
      {"99999999999999999999,0", "index 99999999999999999999 is out of range"},
  };
  for (const auto& [at, message] : bad) {
    r = cli("dump " + mm("ref") + " fp32.out --at '" + at + "'");
    EXPECT_EQ(r.code, 2) << at << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << at << ": " << r.out;
  }
  // "()", the index a report gives a 0-d tensor's element, is the one element of a 0-d tensor
  // and too few indexes for any other.
  r = cli("dump " + mm("ref") + " fp32.out --at '()'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--at (): 0 indexes for a tensor of shape [32, 32]"), std::string::npos)
      << r.out;
  const float value = 2.5f;
  const std::string scalar = (dir_ / "scalar.safetensors").string();
  write_trace(scalar,
              {{"s", TensorView{DType::F32, Shape{}, reinterpret_cast<const std::byte*>(&value)}}});
  r = cli("dump " + scalar + " s --at '()'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(r.out.starts_with("0 [] ")) << r.out;
  EXPECT_NE(r.out.find("2.5"), std::string::npos) << r.out;
  // A count of 0 would print nothing and pass; -1 is no count (not 2^64 - 1).
  for (const char* n : {"0", "-1", "x"}) {
    r = cli("dump " + mm("ref") + " fp32.out --at 1,2 -n " + n);
    EXPECT_EQ(r.code, 2) << n << ": " << r.out;
    EXPECT_NE(r.out.find("--limit"), std::string::npos) << n << ": " << r.out;
  }
  r = cli("dump " + mm("ref") + " fp32.out --at \"$(printf '3,\\033[2J')\"");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << "escaped in the message";
  EXPECT_NE(r.out.find("--at 3,\\x1b[2J: expected integers"), std::string::npos) << r.out;
}

TEST_F(CliTest, HelpAndVersion) {
  const CliRun help = cli("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("Examples:"), std::string::npos);
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos);
  const CliRun version = cli("--version");
  EXPECT_EQ(version.code, 0);
  EXPECT_NE(version.out.find("numalign 0."), std::string::npos);
  // The instruction set the metrics run on, as dispatched on this CPU.
  EXPECT_NE(version.out.find("(SIMD: " + simd_target() + ")"), std::string::npos) << version.out;
}

TEST_F(CliTest, InputFilesAreNeverModified) {
  const auto before = fs::last_write_time(mm("ref"));
  const auto size = fs::file_size(mm("ref"));
  cli("judge " + mm("dropped_column") + " " + mm("ref") + " " + mm("truth") + " -o " +
      (dir_ / "r.txt").string());
  EXPECT_EQ(fs::last_write_time(mm("ref")), before);
  EXPECT_EQ(fs::file_size(mm("ref")), size);
}

// ---- hostile outputs and inputs (issue 20) ----

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST_F(CliTest, AnOutputThatIsAnInputIsRefused) {
  const fs::path work = dir_ / "clobber";
  fs::create_directories(work);
  const fs::path victim = work / "test.safetensors";
  fs::copy_file(mm("dropped_column"), victim, fs::copy_options::overwrite_existing);
  fs::create_symlink(victim, work / "link.json");
  fs::create_hard_link(victim, work / "hard.json");
  const std::string before = read_file(victim);
  const std::string judge = "judge " + victim.string() + " " + mm("ref") + " " + mm("truth");
  for (const fs::path& out : {victim, work / "link.json", work / "hard.json",
                              work / "." / "test.safetensors", fs::path(mm("truth"))}) {
    const CliRun r = cli(judge + " --format json -o " + out.string());
    EXPECT_EQ(r.code, 2) << out << ": " << r.out;
    EXPECT_NE(r.out.find(out.string()), std::string::npos) << "names the output: " << r.out;
    EXPECT_NE(r.out.find("same file"), std::string::npos) << r.out;
    EXPECT_EQ(read_file(victim), before) << out;
  }
  // The policy file and the files of the other commands count too.
  const fs::path policy = work / "policy.json";
  std::ofstream(policy) << R"({"rules": []})";
  const CliRun p = cli(judge + " --policy " + policy.string() + " -o " + policy.string());
  EXPECT_EQ(p.code, 2) << p.out;
  EXPECT_EQ(cli("compare " + victim.string() + " " + mm("ref") + " -o " + victim.string()).code, 2);
  EXPECT_EQ(cli("consistent " + victim.string() + " " + victim.string() + " -o " +
                (work / "hard.json").string())
                .code,
            2);
  EXPECT_EQ(cli("pack " + victim.string() + " -o " + (work / "link.json").string()).code, 2);
  EXPECT_EQ(read_file(victim), before);
  EXPECT_TRUE(fs::is_symlink(work / "link.json"));
}

TEST_F(CliTest, DashAndMagicLinksWriteToStdoutAndLinksStayLinks) {
  const std::string judge = "judge " + mm("reordered") + " " + mm("ref") + " " + mm("truth");
  const CliRun dash = cli(judge + " --format json -o -");
  EXPECT_EQ(dash.code, 0) << dash.out;
  EXPECT_NE(dash.out.find("\"aligned\":true"), std::string::npos) << dash.out;
  // A link to the process's own stdout (as /dev/stdout is) is written through.
  const fs::path link = dir_ / "to_stdout.json";
  fs::remove(link);
  fs::create_symlink("/proc/self/fd/1", link);
  const CliRun through = cli(judge + " --format json -o " + link.string());
  EXPECT_EQ(through.code, 0) << through.out;
  EXPECT_NE(through.out.find("\"aligned\":true"), std::string::npos) << through.out;
  EXPECT_TRUE(fs::is_symlink(link)) << "the link was renamed over";
}

TEST_F(CliTest, TheVerdictLineReachesStderrWhateverTheFormat) {
  for (const char* format : {"text", "json", "junit", "html"}) {
    const fs::path out = dir_ / (std::string("verdict.") + format);
    const CliRun r = cli("judge " + mm("dropped_column") + " " + mm("ref") + " " + mm("truth") +
                         " --format " + std::string(format) + " -o " + out.string());
    EXPECT_EQ(r.code, 1) << format;
    EXPECT_NE(r.out.find("NOT ALIGNED"), std::string::npos) << format << ": " << r.out;
    EXPECT_LT(r.out.size(), 300u) << format << ": one line, not the report: " << r.out;
  }
}

// Run under `timeout`: before the fix these hung forever.
TEST_F(CliTest, FifosAreRefusedNotWaitedOn) {
  const fs::path work = dir_ / "fifos";
  fs::create_directories(work / "shards");
  const fs::path fifo = work / "f.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(fifo, work / "shards" / "a.safetensors");
  std::ofstream(work / "m.safetensors.index.json") << R"({"weight_map": {"x": "f.safetensors"}})";
  for (const fs::path& in : {fifo, work / "shards", work / "m.safetensors.index.json"}) {
    const CliRun r = cli("judge " + in.string() + " " + in.string(), "timeout 20 ");
    EXPECT_EQ(r.code, 2) << in << ": " << r.out;
    EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace numalign
