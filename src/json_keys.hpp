// json_keys.hpp: every JSON object numalign reads (map and policy files, a sharded trace's
// index, our metadata in a trace) names each key once: a repeated key would silently take one
// of its values (or join two lists).
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

// The same for every object within `element`, at any depth (`where` names the top one).
inline void refuse_repeated_keys_within(simdjson::dom::element element, const std::string& origin,
                                        const std::string& where) {
  simdjson::dom::object object;
  simdjson::dom::array array;
  if (!element.get(object)) {
    refuse_repeated_keys(object, origin, where);
    for (auto field : object) {
      if (field.value.is_object() || field.value.is_array()) {  // no name built for a leaf
        refuse_repeated_keys_within(field.value, origin, where + "." + std::string(field.key));
      }
    }
  } else if (!element.get(array)) {
    for (auto item : array) {
      if (item.is_object() || item.is_array()) {
        refuse_repeated_keys_within(item, origin, where + "[]");
      }
    }
  }
}

}  // namespace numalign::detail
