// names_test.cpp: a trace's names grouped by module in execution order (numalign names), and
// by dotted prefix without tags.
#include "numalign/names.hpp"

#include <gtest/gtest.h>

#include "tensor_store.hpp"

namespace numalign {
namespace {

Trace trace_of(testing::TensorStore& store, const std::vector<std::string>& names,
               const std::optional<TraceMetadata>& meta) {
  std::vector<NamedTensor> named;
  for (const auto& n : names)
    named.push_back({n, *store.view(DType::F32, std::vector<float>{1, 2})});
  std::map<std::string, std::string> raw;
  if (meta) raw[kMetadataKey] = meta->to_json();
  return Trace::from_tensors(std::move(named), raw);
}

TEST(NamesTest, TaggedNamesAreGroupedByModuleInExecutionOrder) {
  testing::TensorStore store;
  TraceMetadata m;
  // File order differs from execution order: the execution order decides.
  m.order = {"layers.0.attn.in.hidden_states", "layers.0.attn.out", "out", "layers.0.attn.grad_out",
             "grad.param.layers.0.attn.weight"};
  m.tags = {
      {"layers.0.attn.in.hidden_states", {{"module", "layers.0.attn"}, {"kind", "input"}}},
      {"layers.0.attn.out", {{"module", "layers.0.attn"}, {"kind", "output"}}},
      {"out", {{"module", ""}, {"kind", "output"}}},
      {"layers.0.attn.grad_out", {{"module", "layers.0.attn"}, {"kind", "grad-output"}}},
      {"grad.param.layers.0.attn.weight", {{"module", "layers.0.attn"}, {"kind", "param-grad"}}}};
  const Trace t = trace_of(store,
                           {"out", "layers.0.attn.grad_out", "grad.param.layers.0.attn.weight",
                            "layers.0.attn.out", "layers.0.attn.in.hidden_states", "stray"},
                           m);
  const std::string text = render_names(t);
  EXPECT_EQ(text.rfind("6 tensors in 3 modules, in execution order", 0), 0u) << text;
  const auto attn = text.find("\nlayers.0.attn\n  .in.hidden_states ");
  const auto model = text.find("\n(model)\n  out ");
  const auto untagged = text.find("\n(untagged)\n  stray ");
  ASSERT_NE(attn, std::string::npos) << text;
  ASSERT_NE(model, std::string::npos) << text;
  ASSERT_NE(untagged, std::string::npos) << text;
  EXPECT_LT(attn, model);
  EXPECT_LT(model, untagged);
  // A name that does not start with its module's path is shown whole.
  EXPECT_NE(text.find("  grad.param.layers.0.attn.weight      param-grad"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  .out                                 output       F32    [2]\n"),
            std::string::npos)
      << text;
}

TEST(NamesTest, UntaggedNamesAreGroupedByDottedPrefixAndEscaped) {
  testing::TensorStore store;
  const Trace t = trace_of(
      store, {"blocks.0.qkv", "blocks.0.o", "blocks.1.qkv", "top", "e\x1b[31m"}, std::nullopt);
  const std::string text = render_names(t);
  EXPECT_EQ(text.rfind("5 tensors in 3 groups by dotted prefix", 0), 0u) << text;
  EXPECT_NE(text.find("\nblocks.0\n  .qkv "), std::string::npos) << text;
  EXPECT_NE(text.find("  .o "), std::string::npos) << text;
  EXPECT_NE(text.find("\n(top level)\n  top "), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << "escaped";
}

}  // namespace
}  // namespace numalign
