// op_sequence_test.cpp: runs recorded op by op pair their ops by name only while both ran
// the same ops; where the sequences stop matching, ref's ops from there on could not be
// judged (never judged as pairs of different ops, never passed).
#include "numalign/op_sequence.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "numalign/judge.hpp"
#include "numalign/map.hpp"
#include "simulations.hpp"

namespace numalign {
namespace {

using examples::Buffer;

class OpSequenceTest : public ::testing::Test {
 protected:
  // Ops in order, each {name, off}: `off` makes its values differ from the reference's.
  Trace run(const std::vector<std::pair<std::string, bool>>& tensors, DType dt = DType::F32,
            bool tag_ops = true) {
    std::vector<NamedTensor> named;
    TraceMetadata meta;
    for (const auto& [n, off] : tensors) {
      const Buffer& b =
          buffers_.emplace_back(examples::make_buffer(dt, {4}, {1, 2, 3, off ? 5.0 : 4.0}));
      named.push_back({n, b.view()});
      meta.order.push_back(n);
      const auto slash = n.rfind('/');
      if (tag_ops && slash != std::string::npos) {
        const std::string op = n.substr(slash + 1, n.rfind('#') - slash - 1);
        const bool grad = n.find("/grad/") != std::string::npos;
        meta.tags[n] = {{"module", "m"}, {"kind", grad ? "op-grad" : "op"}, {"op", op}};
      } else {
        meta.tags[n] = {{"module", "m"}, {"kind", n == "m.in" ? "input" : "output"}};
      }
    }
    meta.inputs["m/aten.mm#0"] = {"m.in"};
    meta.inputs["m/aten.add#1"] = {"m/aten.mm#0"};
    std::map<std::string, std::string> raw{{kMetadataKey, meta.to_json()}};
    return Trace::from_tensors(std::move(named), raw);
  }
  static std::map<std::string, const TensorResult*> by_name(const Report& r) {
    std::map<std::string, const TensorResult*> by;
    for (const auto& t : r.tensors) by[t.name] = &t;
    return by;
  }
  static bool warned(const Report& r, const std::string& w) {
    for (const auto& s : r.warnings)
      if (s == w) return true;
    return false;
  }
  std::deque<Buffer> buffers_;
};

TEST_F(OpSequenceTest, SameSequencesPairOpByOp) {
  const Trace ref = run({{"m.in", false}, {"m/aten.mm#0", false}, {"m/aten.add#1", false}});
  const Trace test = run({{"m.in", false}, {"m/aten.mm#0", false}, {"m/aten.add#1", true}});
  EXPECT_TRUE(find_op_sequence_mismatches(ref, test, "test").empty());
  JudgeOptions o;
  o.default_rule = parse_rule("exact");
  const Report r = judge(test, ref, nullptr, o);
  EXPECT_EQ(r.exit_code(), kNotAligned);
  EXPECT_EQ(by_name(r).at("m/aten.add#1")->verdict, VerdictKind::kFail);
  ASSERT_TRUE(r.first_divergence && r.first_divergence->forward);
  EXPECT_EQ(r.first_divergence->forward->tensor, "m/aten.add#1");
  EXPECT_EQ(r.first_divergence->forward->op, "aten.add");
  EXPECT_EQ(divergence_text(*r.first_divergence),
            "first divergence, forward: m/aten.add#1 (module m, op aten.add): its inputs pass, "
            "so this op is the culprit\n"
            "first divergence, backward: none (every tensor passes)\n");
}

TEST_F(OpSequenceTest, OpsFromTheMismatchOnAreNotPairedButNeverPassed) {
  // ref: mm, add, relu; test: addmm, relu (the same relu, one position earlier), then an op
  // named as ref's #2 that is not the same op at all.
  const Trace ref = run({{"m.in", false},
                         {"m/aten.mm#0", false},
                         {"m/aten.add#1", false},
                         {"m/aten.relu#2", false},
                         {"m.out", false}});
  const Trace test = run({{"m.in", false},
                          {"m/aten.addmm#0", false},
                          {"m/aten.relu#1", false},
                          {"m/aten.relu#2", false},
                          {"m.out", false}});
  const auto found = find_op_sequence_mismatches(ref, test, "test");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].group, "m");
  EXPECT_EQ(found[0].at, 0u);
  EXPECT_EQ(found[0].ref_op, "aten.mm");
  EXPECT_EQ(found[0].other_op, "aten.addmm");
  EXPECT_EQ(found[0].unpaired,
            (std::vector<std::string>{"m/aten.mm#0", "m/aten.add#1", "m/aten.relu#2"}));
  JudgeOptions o;
  o.default_rule = parse_rule("exact");
  const Report r = judge(test, ref, nullptr, o);
  EXPECT_TRUE(warned(r,
                     "op sequences of m stop matching at #0: ref aten.mm, test aten.addmm; the 3 "
                     "ops of ref from there on are not paired (could not judge)"))
      << r.warnings.front();
  const auto by = by_name(r);
  for (const char* n : {"m/aten.mm#0", "m/aten.add#1", "m/aten.relu#2"}) {
    EXPECT_EQ(by.at(n)->verdict, VerdictKind::kError) << n;
    EXPECT_EQ(by.at(n)->reason,
              "not paired: op sequences of m stop matching at #0: ref aten.mm, test aten.addmm")
        << n;
    EXPECT_FALSE(by.at(n)->metrics.has_value());
    EXPECT_EQ(by.at(n)->tags.at("unpaired"), "test");
  }
  EXPECT_EQ(by.at("m.out")->verdict, VerdictKind::kPass) << "the module is still judged";
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
  EXPECT_FALSE(r.aligned());
  ASSERT_TRUE(r.first_divergence);
  EXPECT_FALSE(r.first_divergence->forward) << "an unpaired op is no divergence";
}

TEST_F(OpSequenceTest, OpsBeforeTheMismatchKeepTheirVerdicts) {
  const Trace ref = run({{"m.in", false},
                         {"m/aten.mm#0", false},
                         {"m/aten.add#1", false},
                         {"m/aten.relu#2", false},
                         {"m/grad/aten.mm#0", false}});
  const Trace test = run({{"m.in", false},
                          {"m/aten.mm#0", true},
                          {"m/aten.mul#1", false},
                          {"m/aten.relu#2", false},
                          {"m/grad/aten.mm#0", false}});
  JudgeOptions o;
  o.default_rule = parse_rule("exact");
  const Report r = judge(test, ref, nullptr, o);
  const auto by = by_name(r);
  EXPECT_EQ(by.at("m/aten.mm#0")->verdict, VerdictKind::kFail);
  EXPECT_EQ(by.at("m/aten.add#1")->verdict, VerdictKind::kError);
  EXPECT_EQ(by.at("m/aten.relu#2")->verdict, VerdictKind::kError)
      << "same name, but not the same op";
  EXPECT_EQ(by.at("m/grad/aten.mm#0")->verdict, VerdictKind::kPass) << "another sequence";
  EXPECT_TRUE(warned(r,
                     "op sequences of m stop matching at #1: ref aten.add, test aten.mul; the 2 "
                     "ops of ref from there on are not paired (could not judge)"));
  ASSERT_TRUE(r.first_divergence && r.first_divergence->forward);
  EXPECT_EQ(r.first_divergence->forward->tensor, "m/aten.mm#0");
  EXPECT_EQ(r.first_divergence->forward->inputs_aligned, std::optional<bool>(true));
  EXPECT_EQ(r.exit_code(), kCouldNotJudge);
}

TEST_F(OpSequenceTest, ShorterAndLongerSequencesAndTheTruth) {
  const Trace ref = run({{"m/aten.mm#0", false}, {"m/aten.add#1", false}}, DType::F32);
  const Trace longer =
      run({{"m/aten.mm#0", false}, {"m/aten.add#1", false}, {"m/aten.sum#2", false}});
  const Trace shorter = run({{"m/aten.mm#0", false}});
  JudgeOptions o;
  o.default_rule = parse_rule("exact");
  const Report more = judge(longer, ref, nullptr, o);
  EXPECT_TRUE(warned(more,
                     "op sequences of m stop matching at #2: ref (none), test aten.sum; ref has "
                     "no ops from there on, so test's further ops are not judged"));
  EXPECT_EQ(more.count(VerdictKind::kError), 0u);
  const Report fewer = judge(shorter, ref, nullptr, o);
  EXPECT_EQ(by_name(fewer).at("m/aten.add#1")->reason,
            "not paired: op sequences of m stop matching at #1: ref aten.add, test (none)");
  // The truth must run the same ops as ref, or its values are another op's.
  const Trace truth = run({{"m/aten.mm#0", false}, {"m/aten.mul#1", false}}, DType::F64);
  const Report t = judge(ref, ref, &truth, JudgeOptions{});
  EXPECT_EQ(by_name(t).at("m/aten.add#1")->reason,
            "not paired: op sequences of m stop matching at #1: ref aten.add, truth aten.mul");
  EXPECT_EQ(by_name(t).at("m/aten.mm#0")->verdict, VerdictKind::kPass);
}

TEST_F(OpSequenceTest, OnlyTaggedOpsAndWellFormedNamesCount) {
  // Names that look like ops but that ref does not tag as ops, and malformed ones.
  const Trace ref = run({{"a/b#1", false}, {"m/aten.mm#x", false}, {"m/#0", false}}, DType::F32,
                        /*tag_ops=*/false);
  const Trace test = run({{"a/c#1", false}});
  EXPECT_TRUE(find_op_sequence_mismatches(ref, test, "test").empty());
  const Trace tagged = run({{"m/aten.mm#x", false}, {"m/#0", false}, {"m/aten.mm#0.1", false}});
  const Trace other = run({{"m/aten.add#0.0", false}});
  const auto found = find_op_sequence_mismatches(tagged, other, "test");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].unpaired, std::vector<std::string>{"m/aten.mm#0.1"});
}

}  // namespace
}  // namespace numalign

namespace numalign {
namespace {

// A map that pairs ref's ops with test tensors of another name (a port's ops) pairs them
// explicitly: test's missing op sequence under ref's module name leaves nothing unpaired.
TEST_F(OpSequenceTest, OpsAMapPairsAreNotUnpaired) {
  const Trace ref = run({{"m.in", false}, {"m/aten.mm#0", false}, {"m/aten.add#1", false}});
  const Trace test = run({{"m.in", false}, {"port/aten.mm#0", false}, {"port/aten.add#1", true}});
  JudgeOptions o;
  o.map = std::make_shared<TensorMap>(
      TensorMap::parse(R"({"map": [{"test": "port/*", "ref": "m/{1}"}]})", "map.json"));
  o.default_rule = parse_rule("exact");
  const Report r = judge(test, ref, nullptr, o);
  const auto by = by_name(r);
  EXPECT_EQ(by.at("m/aten.mm#0")->verdict, VerdictKind::kPass);
  EXPECT_EQ(by.at("m/aten.add#1")->verdict, VerdictKind::kFail) << "judged, against port's add";
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("op sequences"), std::string::npos) << w;
  EXPECT_EQ(r.exit_code(), kNotAligned);
}

}  // namespace
}  // namespace numalign
