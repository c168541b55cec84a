// report_transfer_test.cpp: a report survives its encoding bit for bit, bad bytes are
// refused with a message, and merged reports keep every part's results, prefixed and ordered.
#include "numalign/report_transfer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "numalign/divergence.hpp"
#include "numalign/judge.hpp"
#include "tensor_store.hpp"

namespace numalign {
namespace {

class ReportTransferTest : public ::testing::Test {
 protected:
  // Every kind of result: a pass, an rmse failure, a NaN, a missing tensor, a truth whose
  // shape cannot be judged, integers, a
  // loosened override with its reason, the magnitude profile, warnings, a first divergence.
  Report varied_report(double scale = 1.1) {
    std::vector<TensorTriple> triples;
    std::vector<double> u(300);
    for (std::size_t i = 0; i < u.size(); ++i) {
      u[i] = std::ldexp(1.0 + static_cast<double>(i) / 300 + 1e-9, static_cast<int>(i % 9) - 4);
    }
    auto floats = [&](double factor, bool nan) {
      std::vector<float> v(u.size());
      for (std::size_t i = 0; i < u.size(); ++i) v[i] = static_cast<float>(u[i] * factor);
      if (nan) v[7] = std::numeric_limits<float>::quiet_NaN();
      return v;
    };
    const auto* ref = view(DType::F32, floats(1.0, false));
    const auto* truth = view(DType::F64, u);
    triples.push_back({"good", view(DType::F32, floats(1.0, false)), ref, truth});
    triples.push_back({"bad", view(DType::F32, floats(scale, false)), ref, truth});
    triples.push_back({"nan", view(DType::F32, floats(1.0, true)), ref, truth});
    triples.push_back({"loose", view(DType::F32, floats(1.0 + 1e-7, false)), ref, nullptr});
    triples.push_back({"missing", nullptr, ref, truth});
    triples.push_back({"shape", view(DType::F32, floats(1.0, false)), ref,
                       view(DType::F64, std::vector<double>(299))});
    triples.push_back({"ids", view(DType::I64, std::vector<std::int64_t>{1, 2, 3}),
                       view(DType::I64, std::vector<std::int64_t>{1, 2, 4}), nullptr});
    JudgeOptions o;
    o.magnitude_profile = true;
    o.overrides.push_back({"loose", parse_rule("ulp:4"), "a fused kernel's rounding", "test"});
    Report r = judge_tensors(triples, o);
    r.title = "test vs ref (truth: truth)";
    r.warnings.push_back("inputs differ: x");
    TraceMetadata m;
    m.order = {"good", "bad", "nan", "loose", "missing", "shape", "ids"};
    for (const auto& name : m.order) m.tags[name] = {{"module", "m." + name}, {"kind", "output"}};
    m.inputs = {{"bad", {"good"}}};
    r.first_divergence = find_first_divergence(m, r);
    return r;
  }

  template <typename T>
  const TensorView* view(DType dt, const std::vector<T>& values) {
    return store_.view(dt, values);
  }

  testing::TensorStore store_;
};

TEST_F(ReportTransferTest, EveryRenderingSurvivesTheRoundTrip) {
  const Report r = varied_report();
  ASSERT_TRUE(r.first_divergence && r.first_divergence->forward);
  ASSERT_FALSE(r.tensors.front().metrics.has_value()) << "the unjudgeable shape comes first";
  const std::string bytes = encode_report(r);
  const Report back = decode_report(bytes);
  EXPECT_EQ(encode_report(back), bytes);
  EXPECT_EQ(render_text(back, true), render_text(r, true));
  EXPECT_EQ(render_json(back), render_json(r));
  EXPECT_EQ(render_junit(back), render_junit(r));
  EXPECT_EQ(render_html(back), render_html(r));
}

TEST_F(ReportTransferTest, FieldsTheRenderingsRoundOffAreKeptExactly) {
  Report r = varied_report();
  TensorResult& t = r.tensors.back();
  ASSERT_TRUE(t.metrics.has_value());
  t.ratio = std::numeric_limits<double>::quiet_NaN();
  t.limit = -std::numeric_limits<double>::infinity();
  t.metrics->cosine = std::nextafter(1.0, 0.0);
  t.metrics->not_close = 12345678901234ull;
  const Report back = decode_report(encode_report(r));
  const TensorResult& b = back.tensors.back();
  EXPECT_TRUE(std::isnan(*b.ratio));
  EXPECT_EQ(*b.limit, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(b.metrics->cosine, std::nextafter(1.0, 0.0));
  EXPECT_EQ(b.metrics->not_close, 12345678901234ull);
  EXPECT_EQ(b.metrics->magnitude.bins, t.metrics->magnitude.bins);
  EXPECT_EQ(b.metrics->ulp.hist, t.metrics->ulp.hist);
}

TEST_F(ReportTransferTest, BadBytesAreRefusedWithAReason) {
  const std::string bytes = encode_report(varied_report());
  // Every truncation is refused, none crashes (the sanitizer build runs this too).
  for (std::size_t n = 0; n < bytes.size(); n += 7) {
    EXPECT_THROW(decode_report(std::string_view(bytes).substr(0, n), "rank1"), Error) << n;
  }
  try {
    decode_report(bytes + "x", "rank1");
    FAIL() << "a trailing byte was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "rank1");
    EXPECT_NE(std::string(e.what()).find("bytes left after the last tensor"), std::string::npos);
  }
  std::string other_version = bytes;
  other_version[std::string_view("numalign-report/").size()] = '9';
  EXPECT_THROW(decode_report(other_version), Error);
  // Any single corrupted byte decodes to some report or is refused: never a crash.
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string corrupt = bytes;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0xA5);
    try {
      decode_report(corrupt);
    } catch (const Error&) {
    }
  }
}

TEST_F(ReportTransferTest, MergePrefixesNamesAndOrdersFailuresAcrossParts) {
  Report rank0 = varied_report(1.1), rank1 = varied_report(1.5);
  const std::size_t per_rank = rank0.tensors.size();
  rank1.settings = "rule ulp:1, tol 1e-04";
  const Report merged =
      merge_reports({{"rank0/", rank0, {}}, {"rank1/", rank1, {{"rank", "1"}}}}, "2 ranks");
  EXPECT_EQ(merged.title, "2 ranks");
  ASSERT_EQ(merged.tensors.size(), 2 * per_rank);
  EXPECT_EQ(merged.count(VerdictKind::kFail), rank0.count(VerdictKind::kFail) * 2);
  // The could-not-judge first, then failures by severity, whichever rank they come from.
  EXPECT_EQ(merged.tensors[0].verdict, VerdictKind::kError);
  EXPECT_EQ(merged.tensors[1].verdict, VerdictKind::kError);
  const TensorResult* bad1 = nullptr;
  const TensorResult* bad0 = nullptr;
  for (const auto& t : merged.tensors) {
    if (t.name == "rank1/bad") bad1 = &t;
    if (t.name == "rank0/bad") bad0 = &t;
  }
  ASSERT_TRUE(bad0 && bad1);
  EXPECT_LT(bad1, bad0) << "rank 1's larger error sorts first";
  // Passes: rank 0's in its order, then rank 1's.
  std::vector<std::string> passes;
  for (const auto& t : merged.tensors) {
    if (t.verdict == VerdictKind::kPass) passes.push_back(t.name);
  }
  ASSERT_EQ(passes.size() % 2, 0u);
  for (std::size_t i = 0; i < passes.size() / 2; ++i) {
    EXPECT_EQ(passes[i].rfind("rank0/", 0), 0u) << passes[i];
    EXPECT_EQ(passes[i + passes.size() / 2], "rank1/" + passes[i].substr(6));
  }
  auto warned = [&](const std::string& start) {
    for (const auto& w : merged.warnings) {
      if (w.rfind(start, 0) == 0) return true;
    }
    return false;
  };
  EXPECT_TRUE(warned("rank0: inputs differ: x"));
  EXPECT_TRUE(warned("rank1: inputs differ: x"));
  EXPECT_TRUE(warned("rank1: judged with other settings (rule ulp:1"));
  EXPECT_FALSE(warned("rank0: judged with other settings"));
  ASSERT_TRUE(merged.first_divergence && merged.first_divergence->forward);
  EXPECT_EQ(merged.first_divergence->forward->tensor.rfind("rank0/", 0), 0u);
  EXPECT_EQ(merged.first_divergence->forward->module.rfind("rank0/m.", 0), 0u);
}

}  // namespace
}  // namespace numalign
