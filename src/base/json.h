// JSON is nlohmann::json; helpers give errors that name the file and the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"

namespace astrai {

using Json = nlohmann::json;

// Parses a JSON file; throws astrai::Error naming the path and the parse error.
Json read_json_file(const std::string& path);

// Reads a required field of type T; `where` names the file or object for the message.
template <typename T>
T json_required(const Json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) fail(where, ": missing required field \"", key, "\"");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": field \"", key, "\" has the wrong type (", it->type_name(), ")");
  }
}

// Reads an optional field, returning `fallback` when absent or null.
template <typename T>
T json_optional(const Json& obj, const char* key, T fallback, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": field \"", key, "\" has the wrong type (", it->type_name(), ")");
  }
}

}  // namespace astrai
