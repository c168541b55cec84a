// json_keys.hpp: JSON objects numalign reads as settings (map and policy files) name each
// key once: a repeated key would silently take its last value (or join two lists).
#pragma once

#include <simdjson.h>

#include <string>
#include <string_view>
#include <unordered_set>

#include "numalign/error.hpp"

namespace numalign::detail {

// Throws Error naming `origin` and `where` at the first key `object` repeats.
inline void refuse_repeated_keys(simdjson::dom::object object, const std::string& origin,
                                 const std::string& where) {
  std::unordered_set<std::string_view> seen;
  for (auto field : object) {
    if (!seen.insert(field.key).second) {
      fail(origin, where + ": the key \"" + std::string(field.key) +
                       "\" is given twice (each key once: which one was meant?)");
    }
  }
}

}  // namespace numalign::detail
