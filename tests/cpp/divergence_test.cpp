// divergence_test.cpp: the first divergence of a run, forward and backward, from the
// execution order, module tags and inputs of the reference's metadata.
#include "numalign/divergence.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "numalign/judge.hpp"
#include "tensor_store.hpp"

namespace numalign {
namespace {

// A chain of modules a -> b -> c in forward, their gradients in backward. The tensors
// named in `bad` differ between test and ref; everything else is equal.
class DivergenceTest : public ::testing::Test {
 protected:
  // Those named in `missing` are missing from test: they cannot be judged.
  Report judge_run(const std::vector<std::string>& names, const std::vector<std::string>& bad,
                   const std::vector<std::string>& missing = {}) {
    std::vector<TensorTriple> triples;
    for (const auto& n : names) {
      const bool differs = std::find(bad.begin(), bad.end(), n) != bad.end();
      const bool absent = std::find(missing.begin(), missing.end(), n) != missing.end();
      const TensorView* r = view({1.0f, 2.0f, 3.0f});
      const TensorView* t = absent ? nullptr : view({1.0f, 2.0f, differs ? 4.0f : 3.0f});
      triples.push_back({n, t, r, nullptr});
    }
    JudgeOptions o;
    o.default_rule = parse_rule("exact");
    return judge_tensors(triples, o);
  }

  static TraceMetadata chain() {
    TraceMetadata m;
    m.order = {"a.in",       "a.out",  "b.out",  "c.out",  "out",
               "c.grad_out", "c.grad", "b.grad", "a.grad", "grad.param.b.weight"};
    auto tag = [&](const std::string& n, const std::string& module, const std::string& kind) {
      m.tags[n] = {{"module", module}, {"kind", kind}};
    };
    tag("a.in", "a", "input");
    tag("a.out", "a", "output");
    tag("b.out", "b", "output");
    tag("c.out", "c", "output");
    tag("out", "", "output");
    tag("c.grad_out", "c", "grad-output");
    tag("c.grad", "c", "grad");
    tag("b.grad", "b", "grad");
    tag("a.grad", "a", "grad");
    tag("grad.param.b.weight", "b", "param-grad");
    m.inputs = {{"a.out", {"a.in"}},
                {"b.out", {"a.out"}},
                {"c.out", {"b.out"}},
                {"out", {"c.out"}},
                {"c.grad", {"c.grad_out", "b.out"}},
                {"b.grad", {"c.grad", "a.out"}},
                {"a.grad", {"b.grad", "a.in"}}};
    return m;
  }

  const TensorView* view(const std::vector<float>& values) {
    return store_.view(DType::F32, values);
  }

  testing::TensorStore store_;
};

TEST_F(DivergenceTest, TheFirstFailingModuleWithAlignedInputsIsTheCulprit) {
  const TraceMetadata m = chain();
  // b goes wrong; c, the output and every gradient inherit it.
  const Report r = judge_run(m.order, {"b.out", "c.out", "out", "c.grad", "b.grad", "a.grad"});
  const auto d = find_first_divergence(m, r);
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->forward);
  EXPECT_EQ(d->forward->tensor, "b.out");
  EXPECT_EQ(d->forward->module, "b");
  EXPECT_EQ(d->forward->inputs_aligned, true);
  EXPECT_TRUE(d->forward->failing_inputs.empty());
  // Backward, c's gradient fails first, but c's forward input (b.out) already failed.
  ASSERT_TRUE(d->backward);
  EXPECT_EQ(d->backward->tensor, "c.grad");
  EXPECT_EQ(d->backward->inputs_aligned, false);
  EXPECT_EQ(d->backward->failing_inputs, std::vector<std::string>{"b.out"});
}

TEST_F(DivergenceTest, ABackwardOnlyBugIsFoundInBackwardOrder) {
  const TraceMetadata m = chain();
  const Report r = judge_run(m.order, {"b.grad", "a.grad"});
  const auto d = find_first_divergence(m, r);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->forward) << "every forward tensor passes";
  ASSERT_TRUE(d->backward);
  EXPECT_EQ(d->backward->tensor, "b.grad");
  EXPECT_EQ(d->backward->module, "b");
  EXPECT_EQ(d->backward->inputs_aligned, true);
}

TEST_F(DivergenceTest, AWeightGradientAloneMakesItsModuleTheCulprit) {
  TraceMetadata m = chain();
  // b's weight gradient became final right after b's backward, from what b received and
  // its forward input; nothing else in the backward pass depends on it.
  m.order = {"a.in",   "a.out",  "b.out",
             "c.out",  "out",    "c.grad_out",
             "c.grad", "b.grad", "grad.param.b.weight",
             "a.grad"};
  m.inputs["grad.param.b.weight"] = {"c.grad", "a.out"};
  const Report r = judge_run(m.order, {"grad.param.b.weight"});
  const auto d = find_first_divergence(m, r);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->forward);
  ASSERT_TRUE(d->backward) << "a weight gradient takes part in the backward divergence";
  EXPECT_EQ(d->backward->tensor, "grad.param.b.weight");
  EXPECT_EQ(d->backward->module, "b");
  EXPECT_EQ(d->backward->inputs_aligned, true);
}

TEST_F(DivergenceTest, AModelsInputGradientFromItsOwnCodeIsTheModelsFault) {
  TraceMetadata m;
  m.order = {"out", "grad.input.x"};
  m.tags["out"] = {{"kind", "output"}};
  m.tags["grad.input.x"] = {{"kind", "input-grad"}};
  // Computed from the run's own inputs, which are the same in every run.
  m.inputs = {{"out", {}}, {"grad.input.x", {}}};
  const Report r = judge_run(m.order, {"grad.input.x"});
  const auto d = find_first_divergence(m, r);
  ASSERT_TRUE(d && d->backward);
  EXPECT_EQ(d->backward->tensor, "grad.input.x");
  EXPECT_EQ(d->backward->module, "");
  EXPECT_EQ(d->backward->inputs_aligned, true) << "never 'inputs not in the traces'";
}

TEST_F(DivergenceTest, AnInputComputedBetweenModulesNamesTheCodeAroundThem) {
  TraceMetadata m = chain();
  m.tags["a.in"]["producer"] = "";  // computed by the model's own code, outside any module
  m.inputs["a.in"] = {};
  const Report r = judge_run(m.order, {"a.in", "a.out", "b.out"});
  const auto d = find_first_divergence(m, r);
  ASSERT_TRUE(d && d->forward);
  EXPECT_EQ(d->forward->tensor, "a.in");
  EXPECT_EQ(d->forward->module, "");
  EXPECT_EQ(d->forward->inputs_aligned, true);
}

TEST_F(DivergenceTest, InputsMissingFromTheTracesLeaveTheQuestionOpen) {
  TraceMetadata m = chain();
  m.inputs["a.out"] = {"not.recorded"};
  const Report r = judge_run(m.order, {"a.out"});
  const auto d = find_first_divergence(m, r);
  ASSERT_TRUE(d && d->forward);
  EXPECT_EQ(d->forward->tensor, "a.out");
  EXPECT_FALSE(d->forward->inputs_aligned.has_value());
}

// A tensor that could not be judged (missing from test, unmapped) is neither a divergence nor
// an input known to pass: "culprit" only for a judged failure whose inputs were judged and
// pass (issue 35, 6).
TEST_F(DivergenceTest, ATensorNeverJudgedIsNeitherTheCulpritNorAnAlignedInput) {
  const TraceMetadata m = chain();
  Report r = judge_run(m.order, {"b.out"}, {"a.out"});
  const auto a_out = std::find_if(r.tensors.begin(), r.tensors.end(),
                                  [](const TensorResult& t) { return t.name == "a.out"; });
  ASSERT_TRUE(a_out != r.tensors.end() && !was_judged(*a_out));
  r.first_divergence = find_first_divergence(m, r);
  ASSERT_TRUE(r.first_divergence && r.first_divergence->forward);
  EXPECT_EQ(r.first_divergence->forward->tensor, "b.out");
  EXPECT_FALSE(r.first_divergence->forward->inputs_aligned.has_value());
  const std::string text = render_text(r);
  EXPECT_NE(text.find("first divergence, forward: b.out (module b): its inputs were not all "
                      "judged (not in the traces, or could not be judged)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("culprit"), std::string::npos) << text;
}

TEST_F(DivergenceTest, OnlyUnjudgedTensorsAreNoDivergenceAndSaySo) {
  const TraceMetadata m = chain();
  Report r = judge_run(m.order, {}, {"b.out"});
  for (auto& t : r.tensors) t.tags = m.tags.at(t.name);  // as judge() tags them from ref
  r.first_divergence = find_first_divergence(m, r);
  ASSERT_TRUE(r.first_divergence);
  EXPECT_FALSE(r.first_divergence->forward);
  const std::string text = render_text(r);
  EXPECT_NE(text.find("first divergence, forward: none judged to fail (1 tensor(s) not judged: "
                      "missing from test or could not be judged)"),
            std::string::npos)
      << text;
  // Each direction counts its own: every backward tensor was judged, and passes.
  EXPECT_NE(text.find("first divergence, backward: none (every tensor passes)"), std::string::npos)
      << text;
}

TEST_F(DivergenceTest, NoModuleTagsMeansNoDivergenceSection) {
  TraceMetadata m;
  m.order = {"x", "y"};
  const Report r = judge_run(m.order, {"y"});
  EXPECT_FALSE(find_first_divergence(m, r));
}

TEST_F(DivergenceTest, ReportsShowItBeforeTheTableAndInJson) {
  const TraceMetadata m = chain();
  Report r = judge_run(m.order, {"b.out", "c.out"});
  r.first_divergence = find_first_divergence(m, r);
  const std::string text = render_text(r);
  const auto line = text.find("first divergence, forward: b.out (module b): its inputs pass");
  ASSERT_NE(line, std::string::npos) << text;
  EXPECT_LT(line, text.find("verdict  tensor")) << "before the table";
  EXPECT_NE(text.find("first divergence, backward: none"), std::string::npos) << text;
  const std::string json = render_json(r);
  EXPECT_NE(json.find(R"("first_divergence":{"forward":{"tensor":"b.out","module":"b",)"
                      R"("inputs_aligned":true,"failing_inputs":[]},"backward":null})"),
            std::string::npos)
      << json;
}

TEST_F(DivergenceTest, InputsSurviveTheMetadataRoundTrip) {
  const TraceMetadata m = chain();
  const TraceMetadata back = TraceMetadata::from_json(m.to_json(), "test");
  EXPECT_EQ(back.inputs, m.inputs);
  EXPECT_EQ(back.tags, m.tags);
  EXPECT_THROW(TraceMetadata::from_json(R"({"inputs":{"a":"b"}})", "test"), Error);
}

TEST_F(DivergenceTest, WhatTheRecorderLeftOutRoundTripsAndIsReported) {
  TraceMetadata m = chain();
  m.not_recorded = {{"a.in.cache", "a DynamicCache: state updated in place"}};
  const TraceMetadata back = TraceMetadata::from_json(m.to_json(), "test");
  EXPECT_EQ(back.not_recorded, m.not_recorded);
  EXPECT_THROW(TraceMetadata::from_json(R"({"not_recorded":{"a":1}})", "test"), Error);
  Report r = judge_run(m.order, {"out"});
  const std::size_t before = r.warnings.size();
  add_metadata_warnings(nullptr, &m, nullptr, r);
  ASSERT_EQ(r.warnings.size(), before + 1);
  EXPECT_NE(r.warnings.back().find("1 value: a.in.cache (a DynamicCache: state updated in place)"),
            std::string::npos)
      << r.warnings.back();
}

TEST_F(DivergenceTest, ATruthBelowFloat64IsNamedWithTheTensorsItFeeds) {
  TraceMetadata truth = chain();
  truth.below_float64 = {{"b", {"_to_copy (float32)", "pow (float32)"}},
                         {"(backward)", {"mm (float32)"}}};
  truth.tags["b.sub.out"] = {{"module", "b.sub"}, {"kind", "output"}};
  truth.tags["bc.out"] = {{"module", "bc"}, {"kind", "output"}};  // not inside b
  const TraceMetadata back = TraceMetadata::from_json(truth.to_json(), "test");
  EXPECT_EQ(back.below_float64, truth.below_float64);
  EXPECT_THROW(TraceMetadata::from_json(R"({"below_float64":{"b":"pow"}})", "test"), Error);
  std::vector<std::string> names = truth.order;
  names.push_back("b.sub.out");
  names.push_back("bc.out");
  Report r = judge_run(names, {"out"});
  const std::size_t before = r.warnings.size();
  add_metadata_warnings(nullptr, nullptr, &truth, r);
  ASSERT_EQ(r.warnings.size(), before + 1);
  const std::string& w = r.warnings.back();
  EXPECT_NE(w.find("in 2 places: (backward) (mm (float32)); b (_to_copy (float32), pow (float32))"),
            std::string::npos)
      << w;
  // b.out, b.grad, grad.param.b.weight and b.sub.out; not bc.out
  EXPECT_NE(w.find("(4 judged tensors come from those modules"), std::string::npos) << w;
  // A truth all in float64 says nothing.
  Report quiet = judge_run(names, {"out"});
  const std::size_t n = quiet.warnings.size();
  const TraceMetadata pure = chain();
  add_metadata_warnings(nullptr, nullptr, &pure, quiet);
  EXPECT_EQ(quiet.warnings.size(), n);
}

}  // namespace
}  // namespace numalign
