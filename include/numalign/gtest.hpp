// numalign/gtest.hpp: GoogleTest checks on tensor views, or spans and vectors of any judged
// element type, printing numalign's text report on failure. The options (rule, tol, bias
// check, policy) are resolved by the core, as the CLI and Python resolve theirs.
//
//   EXPECT_ALIGNED(test, ref, truth);                    // the default rule (measured)
//   EXPECT_ALIGNED_WITH(test, ref, truth, numalign::check().check_bias().name("out").shape({m,
//   n})); EXPECT_MATCHES_WITH(test, ref, "ulp:1");             // no truth: exact, ulp:K, abs:X
//   EXPECT_MATCHES_WITH(a, b, numalign::check().rule("exact").dtype(numalign::DType::F8_E4M3));
//
// ASSERT_ forms stop the test. A check with a bad option (an unknown rule, a loosening
// override without a reason) fails, naming the option. In a TEST_P sweep, put the case's
// parameters in the name (check().name("out[m=" + std::to_string(m) + "]")): the report of a
// failing case names them (examples/cpp_kernel_test does).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/judge.hpp"
#include "numalign/options.hpp"
#include "numalign/report.hpp"
#include "numalign/trace.hpp"

namespace numalign {

// Raw 16-bit storage types, so spans of kernel outputs can be judged without a half library.
// fp8 outputs are spans of std::uint8_t or std::byte with the dtype named: check().dtype(...).
struct bfloat16_bits {
  std::uint16_t bits;
};
struct float16_bits {
  std::uint16_t bits;
};

// The options of one check, as arguments the core resolves (numalign::resolve_options):
// unset fields keep the defaults (the measured rule against the truth).
class CheckOptions {
 public:
  CheckOptions() { args_.rules_origin = "rule"; }
  // A rule spec alone: EXPECT_MATCHES_WITH(test, ref, "exact").
  CheckOptions(const char* spec) : CheckOptions() { rule(spec); }         // NOLINT
  CheckOptions(const std::string& spec) : CheckOptions() { rule(spec); }  // NOLINT

  // "SPEC" (measured[:L], same[:M], ulp:K, exact, abs:X, allclose[:ATOL,RTOL]) or
  // "GLOB=SPEC" for the names the glob matches.
  CheckOptions& rule(std::string_view text) {
    rules_.push_back({std::string(text), std::nullopt});
    return *this;
  }
  // An override that loosens the default needs its written reason, printed in the report.
  CheckOptions& rule(std::string glob, std::string spec, std::string reason) {
    rules_.push_back({"", RuleArgument{std::move(glob), std::move(spec), std::move(reason)}});
    return *this;
  }
  CheckOptions& tol(double value) {
    args_.tol = value;
    return *this;
  }
  CheckOptions& check_bias(bool on = true) {
    args_.check_bias = on;
    return *this;
  }
  CheckOptions& equal_nan(bool on = true) {
    args_.equal_nan = on;
    return *this;
  }
  CheckOptions& larger_multiplier_for_small(bool on = true) {
    args_.larger_multiplier_for_small = on;
    return *this;
  }
  CheckOptions& force_max_multiplier(bool on = true) {
    args_.force_max_multiplier = on;
    return *this;
  }
  CheckOptions& threads(int n) {
    args_.threads = n;
    return *this;
  }
  // A policy file, as `numalign judge --policy` reads it (arguments given here win over it).
  CheckOptions& policy(std::string path) {
    args_.policy_path = std::move(path);
    return *this;
  }
  // The tensor's name in the report and in override globs (default: the test expression).
  CheckOptions& name(std::string value) {
    name_ = std::move(value);
    return *this;
  }
  // Its shape, so that the report gives multi-dimensional indices (default: 1-D).
  CheckOptions& shape(std::initializer_list<std::uint64_t> dims) { return shape(Shape(dims)); }
  CheckOptions& shape(Shape dims) {
    shape_ = std::move(dims);
    return *this;
  }
  // The dtype of test and ref when their elements are raw storage of that size (fp8 bytes,
  // bf16 as std::uint16_t); the truth keeps its own.
  CheckOptions& dtype(DType value) {
    dtype_ = value;
    return *this;
  }

  // The arguments, rules parsed as the CLI's --rule is (throws Error on a bad one).
  JudgeArguments arguments() const {
    JudgeArguments args = args_;
    for (const auto& [text, given] : rules_)
      args.rules.push_back(given ? *given : parse_rule_argument(text, args.rules_origin));
    return args;
  }
  const std::string& name() const { return name_; }
  const std::optional<Shape>& shape() const { return shape_; }
  std::optional<DType> dtype() const { return dtype_; }

 private:
  JudgeArguments args_;
  std::vector<std::pair<std::string, std::optional<RuleArgument>>> rules_;  // text, or given
  std::string name_;
  std::optional<Shape> shape_;
  std::optional<DType> dtype_;
};

inline CheckOptions check() { return {}; }

namespace gtest_detail {

template <class T>
constexpr std::optional<DType> dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  if constexpr (std::is_same_v<T, bfloat16_bits>) return DType::BF16;
  if constexpr (std::is_same_v<T, float16_bits>) return DType::F16;
  if constexpr (std::is_same_v<T, bool>) return DType::BOOL;
  if constexpr (std::is_same_v<T, std::int8_t>) return DType::I8;
  if constexpr (std::is_same_v<T, std::uint8_t>) return DType::U8;
  if constexpr (std::is_same_v<T, std::int16_t>) return DType::I16;
  if constexpr (std::is_same_v<T, std::uint16_t>) return DType::U16;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::I32;
  if constexpr (std::is_same_v<T, std::uint32_t>) return DType::U32;
  if constexpr (std::is_same_v<T, std::int64_t>) return DType::I64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return DType::U64;
  return std::nullopt;  // std::byte: raw storage, its dtype named by check().dtype()
}

template <class T>
constexpr bool kSupported = dtype_of<T>().has_value() || std::is_same_v<T, std::byte>;

// One side of a check: its elements as a view, before the options give its dtype and shape.
struct Operand {
  std::optional<DType> dtype;  // none: raw bytes
  std::size_t element_size = 0;
  std::uint64_t count = 0;
  std::optional<Shape> shape;  // a TensorView's own
  const std::byte* data = nullptr;
};

inline Operand operand(const TensorView& v) {
  return {v.dtype, element_size(v.dtype), v.numel(), v.shape, v.data};
}
template <class T>
Operand operand(std::span<const T> s) {
  static_assert(kSupported<T>, "numalign checks: unsupported element type");
  return {dtype_of<T>(), sizeof(T), s.size(), std::nullopt,
          reinterpret_cast<const std::byte*>(s.data())};
}
template <class T>
Operand operand(std::span<T> s) {
  return operand(std::span<const T>(s));
}
template <class T>
Operand operand(const std::vector<T>& v) {
  static_assert(!std::is_same_v<T, bool>, "std::vector<bool> holds no bools: use a TensorView");
  return operand(std::span<const T>(v));
}

// The view a check judges: `retype` (check().dtype(), for test and ref) replaces the element
// type when its size is the storage's; the options' shape replaces a 1-D one.
inline TensorView view_of(const Operand& o, const CheckOptions& options, bool retype) {
  std::optional<DType> dtype = o.dtype;
  if (retype && options.dtype()) {
    if (element_size(*options.dtype()) != o.element_size)
      fail("dtype", std::string(name(*options.dtype())) + " elements are " +
                        std::to_string(element_size(*options.dtype())) + " bytes, the data's " +
                        std::to_string(o.element_size));
    dtype = options.dtype();
  }
  if (!dtype) fail("dtype", "raw bytes need their dtype named: check().dtype(...)");
  Shape shape = o.shape.value_or(Shape{o.count});
  if (options.shape()) {
    const TensorView shaped{*dtype, *options.shape(), nullptr};
    if (shaped.numel() != o.count)
      fail("shape", format_shape(*options.shape()) + " holds " + std::to_string(shaped.numel()) +
                        " elements, the data " + std::to_string(o.count));
    shape = *options.shape();
  }
  return TensorView{*dtype, std::move(shape), o.data};
}

// Judges one tensor through the core's one entry point (judge), truth optional.
inline ::testing::AssertionResult check_tensor(const char* test_expr, const char* ref_expr,
                                               const char* truth_expr, const Operand& test,
                                               const Operand& ref, const Operand* truth,
                                               const CheckOptions& options) {
  const std::string name = options.name().empty() ? test_expr : options.name();
  try {
    const JudgeOptions resolved = resolve_options(options.arguments());
    const TensorView t = view_of(test, options, true), r = view_of(ref, options, true);
    const auto run = [&](const TensorView& v, const char* label) {
      return Trace::from_tensors({NamedTensor{name, v}}, {}, label);
    };
    const Trace test_run = run(t, test_expr), ref_run = run(r, ref_expr);
    std::optional<Trace> truth_run;
    if (truth) truth_run = run(view_of(*truth, options, false), truth_expr);
    const Report report = judge(test_run, ref_run, truth_run ? &*truth_run : nullptr, resolved);
    if (report.aligned()) return ::testing::AssertionSuccess();
    auto failure = ::testing::AssertionFailure();
    failure << test_expr << " is not aligned with " << ref_expr;
    if (truth) failure << " (truth " << truth_expr << ")";
    failure << "\n" << render_text(report);
    // Where test and ref differ most, as multi-dimensional indices of the tensor's shape.
    for (const TensorResult& r : report.tensors) {
      if (r.verdict == VerdictKind::kPass || !r.metrics || r.metrics->values_differ == 0) continue;
      const Metrics& m = *r.metrics;
      failure << printable(r.name) << ": max |test - ref| " << m.max_abs_ref << " at "
              << format_index(r.shape, m.max_abs_ref_index);
      if (m.floating && !m.ulp.any_inf)
        failure << ", max ULP " << m.ulp.max << " at " << format_index(r.shape, m.ulp.max_index);
      failure << "\n";
    }
    return failure;
  } catch (const Error& e) {
    return ::testing::AssertionFailure()
           << "numalign could not check " << test_expr << ": " << e.what();
  }
}

template <class A, class B, class C>
::testing::AssertionResult assert_aligned_with(const char* test_expr, const char* ref_expr,
                                               const char* truth_expr, const char*, const A& test,
                                               const B& ref, const C& truth,
                                               const CheckOptions& options) {
  const Operand u = operand(truth);
  return check_tensor(test_expr, ref_expr, truth_expr, operand(test), operand(ref), &u, options);
}

template <class A, class B, class C>
::testing::AssertionResult assert_aligned(const char* test_expr, const char* ref_expr,
                                          const char* truth_expr, const A& test, const B& ref,
                                          const C& truth) {
  return assert_aligned_with(test_expr, ref_expr, truth_expr, "", test, ref, truth, check());
}

template <class A, class B>
::testing::AssertionResult assert_matches_with(const char* test_expr, const char* ref_expr,
                                               const char*, const A& test, const B& ref,
                                               const CheckOptions& options) {
  return check_tensor(test_expr, ref_expr, "", operand(test), operand(ref), nullptr, options);
}

}  // namespace gtest_detail
}  // namespace numalign

// test vs ref under the default rule (measured against the float64 truth).
#define EXPECT_ALIGNED(test, ref, truth) \
  EXPECT_PRED_FORMAT3(::numalign::gtest_detail::assert_aligned, test, ref, truth)
#define ASSERT_ALIGNED(test, ref, truth) \
  ASSERT_PRED_FORMAT3(::numalign::gtest_detail::assert_aligned, test, ref, truth)
// The same with options: a rule spec ("ulp:1") or numalign::check()...
#define EXPECT_ALIGNED_WITH(test, ref, truth, options) \
  EXPECT_PRED_FORMAT4(::numalign::gtest_detail::assert_aligned_with, test, ref, truth, options)
#define ASSERT_ALIGNED_WITH(test, ref, truth, options) \
  ASSERT_PRED_FORMAT4(::numalign::gtest_detail::assert_aligned_with, test, ref, truth, options)
// No truth: for the rules that compare test with ref alone (exact, ulp:K, abs:X).
#define EXPECT_MATCHES_WITH(test, ref, options) \
  EXPECT_PRED_FORMAT3(::numalign::gtest_detail::assert_matches_with, test, ref, options)
#define ASSERT_MATCHES_WITH(test, ref, options) \
  ASSERT_PRED_FORMAT3(::numalign::gtest_detail::assert_matches_with, test, ref, options)
