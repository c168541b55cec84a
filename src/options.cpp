// options.cpp: the user's arguments and policy file resolved into JudgeOptions, once, for
// the CLI and Python alike.
#include "numalign/options.hpp"

#include <cmath>
#include <memory>

#include "numalign/error.hpp"
#include "numalign/map.hpp"

namespace numalign {

RuleArgument parse_rule_argument(std::string_view text, const std::string& where) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos) return {"", std::string(text), ""};
  if (eq == 0) fail(where, "'" + std::string(text) + "': empty glob before '='");
  return {std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)), ""};
}

namespace {

template <typename T>
void take(const std::optional<T>& given, T& value) {
  if (given) value = *given;
}

}  // namespace

JudgeOptions resolve_options(const JudgeArguments& args) {
  JudgeOptions o;
  if (args.policy_json) {
    parse_policy(*args.policy_json, args.policy_path.empty() ? "policy" : args.policy_path, o);
  } else if (!args.policy_path.empty()) {
    load_policy(args.policy_path, o);
  }
  if (args.tol && !(std::isfinite(*args.tol) && *args.tol >= 0)) {
    fail("tol", "must be a non-negative number, not " + std::to_string(*args.tol));
  }
  take(args.tol, o.tol);
  take(args.equal_nan, o.equal_nan);
  take(args.check_bias, o.check_bias);
  take(args.larger_multiplier_for_small, o.larger_multiplier_for_small);
  take(args.force_max_multiplier, o.force_max_multiplier);
  take(args.magnitude_profile, o.magnitude_profile);
  take(args.threads, o.threads);
  for (const auto& r : args.rules) {
    const Rule rule = parse_rule(r.spec, args.rules_origin);
    if (r.glob.empty()) {
      o.default_rule = rule;
    } else {
      // A blank reason is no reason, as in a policy file.
      o.overrides.push_back({r.glob, rule, is_blank(r.reason) ? "" : r.reason, args.rules_origin});
    }
  }
  if (args.shared_randomness) {
    if (is_blank(*args.shared_randomness))
      fail("shared randomness", "needs a written reason (why do the runs share their draws?)");
    o.shared_randomness = *args.shared_randomness;
  }
  if (args.map_json) {
    o.map = std::make_shared<TensorMap>(
        TensorMap::parse(*args.map_json, args.map_path.empty() ? "map" : args.map_path));
  } else if (!args.map_path.empty()) {
    o.map = std::make_shared<TensorMap>(TensorMap::load(args.map_path));
  }
  o.only = args.only;
  o.sections = args.sections;
  check_override_reasons(o);
  return o;
}

}  // namespace numalign
