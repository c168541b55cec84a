// json_keys.hpp: every JSON object numalign reads (map and policy files, a sharded trace's
// index, our metadata in a trace) names each key once: a repeated key would silently take one
// of its values (or join two lists).
#pragma once

#include <simdjson.h>

#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

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

// The same for every object within `element`, at any depth (`where` names the top one; the
// path to a nested object is spelled out only when it repeats a key).
inline void refuse_repeated_keys_within(simdjson::dom::element element, const std::string& origin,
                                        const std::string& where,
                                        std::vector<std::string_view>* path = nullptr) {
  std::vector<std::string_view> root;
  if (!path) path = &root;
  simdjson::dom::object object;
  simdjson::dom::array array;
  if (!element.get(object)) {
    std::unordered_set<std::string_view> seen;
    for (auto field : object) {
      if (!seen.insert(field.key).second) {
        std::string at = where;
        for (const auto& p : *path) at += std::string(p);
        fail(origin, at + ": the key \"" + std::string(field.key) +
                         "\" is given twice (each key once: which one was meant?)");
      }
    }
    for (auto field : object) {
      if (field.value.is_object() || field.value.is_array()) {  // leaves need no path
        path->push_back(".");
        path->push_back(field.key);
        refuse_repeated_keys_within(field.value, origin, where, path);
        path->resize(path->size() - 2);
      }
    }
  } else if (!element.get(array)) {
    for (auto item : array) {
      if (item.is_object() || item.is_array()) {
        path->push_back("[]");
        refuse_repeated_keys_within(item, origin, where, path);
        path->pop_back();
      }
    }
  }
}

}  // namespace numalign::detail
