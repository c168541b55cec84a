// rules_fuzzer.cpp: rule specs (and their printed form), globs and policy files.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

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
  // The linear matcher agrees with the obvious quadratic one (bytes: on ASCII '?' is one byte).
  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return c > 0; });
  if (ascii && first.size() < 64 && rest.size() < 256) {
    std::vector<std::vector<char>> m(first.size() + 1, std::vector<char>(rest.size() + 1, 0));
    m[0][0] = 1;
    for (std::size_t i = 1; i <= first.size(); ++i) {
      for (std::size_t j = 0; j <= rest.size(); ++j) {
        m[i][j] = first[i - 1] == '*' ? (m[i - 1][j] || (j && m[i][j - 1]))
                                      : (j && m[i - 1][j - 1] &&
                                         (first[i - 1] == '?' || first[i - 1] == rest[j - 1]));
      }
    }
    if (numalign::glob_match(first, rest) != static_cast<bool>(m[first.size()][rest.size()])) {
      std::abort();
    }
  } else {
    numalign::glob_match(first, rest);
  }
  try {
    numalign::JudgeOptions o;
    numalign::parse_policy(rest, "fuzz.json", o);
    numalign::check_override_reasons(o);
  } catch (const numalign::Error&) {
  }
  return 0;
}
