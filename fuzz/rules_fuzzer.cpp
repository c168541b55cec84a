// rules_fuzzer.cpp: rule specs (and their printed form), globs and policy files.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "numalign/error.hpp"
#include "numalign/rules.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto nl = text.find('\n');
  const std::string_view first = text.substr(0, nl);
  const std::string_view rest =
      nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  try {
    const numalign::Rule r = numalign::parse_rule(first);
    const numalign::Rule again = numalign::parse_rule(r.spec());
    if (again.kind != r.kind) std::abort();
  } catch (const numalign::Error&) {
  }
  // Properties of any glob matcher: "*" matches everything, "" only "", a literal itself.
  if (!numalign::glob_match("*", rest)) std::abort();
  if (numalign::glob_match("", rest) != rest.empty()) std::abort();
  if (rest.find_first_of("*?") == std::string_view::npos && !numalign::glob_match(rest, rest)) {
    std::abort();
  }
  numalign::glob_match(first, rest);
  try {
    numalign::JudgeOptions o;
    numalign::parse_policy(rest, "fuzz.json", o);
    numalign::check_override_reasons(o);
  } catch (const numalign::Error&) {
  }
  return 0;
}
