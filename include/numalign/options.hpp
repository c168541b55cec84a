// numalign/options.hpp: a judgement's options as the user gives them (arguments, a policy
// file), resolved once for every front end. Precedence: defaults < policy < arguments; an
// argument the user did not give leaves the policy's value (or the default) in place.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numalign/rules.hpp"

namespace numalign {

// A rule argument: the default rule (empty glob) or an override of the tensors matching
// `glob`, with the written reason a loosening needs.
struct RuleArgument {
  std::string glob;
  std::string spec;
  std::string reason;
};

// "SPEC" (the default rule) or "GLOB=SPEC" (an override): the CLI's --rule and Python's
// rules="..." / rules=[...]. Throws Error naming `where` on an empty glob.
RuleArgument parse_rule_argument(std::string_view text, const std::string& where = "--rule");

// What the user asked for. Unset fields were not given.
struct JudgeArguments {
  std::optional<double> tol;
  std::optional<bool> equal_nan;
  std::optional<bool> check_bias;
  std::optional<bool> larger_multiplier_for_small;
  std::optional<bool> force_max_multiplier;
  std::optional<bool> magnitude_profile;
  std::optional<int> threads;
  std::vector<RuleArgument> rules;      // in order; later ones win over earlier ones and the policy
  std::string rules_origin = "--rule";  // how messages name the rule arguments
  // A policy file (read from `policy_path`), or its JSON text (`policy_json`, named
  // `policy_path` in messages when given, else "policy").
  std::string policy_path;
  std::optional<std::string> policy_json;
  // A map between the runs' names and layouts (map.hpp): a file (`map_path`), or its JSON
  // text (`map_json`, named `map_path` in messages when given, else "map").
  std::string map_path;
  std::optional<std::string> map_json;
  std::vector<std::string> only;                 // globs of the ref tensors to judge (empty: all)
  std::optional<std::string> shared_randomness;  // a written reason; blank is refused
  ReportSections sections;
};

// Options for the judge: the defaults, then the policy's fields, then the arguments given.
// Throws Error (naming the policy file or the argument) on a bad policy, a bad rule, a
// negative or non-finite tol, or a loosening override without a reason.
JudgeOptions resolve_options(const JudgeArguments& args);

}  // namespace numalign
