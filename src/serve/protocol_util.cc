#include "serve/protocol_util.h"

#include <chrono>
#include <cmath>

#include "infer/text_stream.h"

namespace astrai::serve {

namespace {
const Json* field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

std::optional<double> opt_number(const Json& body, const char* key, double lo, double hi) {
  const Json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw ApiError(400, str_cat("'", key, "' must be a number"), key);
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    throw ApiError(400, str_cat("'", key, "' must be between ", lo, " and ", hi, ", got ", d), key);
  }
  return d;
}

std::optional<int64_t> opt_int(const Json& body, const char* key, int64_t lo, int64_t hi) {
  const Json* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (d != std::floor(d)) throw ApiError(400, str_cat("'", key, "' must be an integer"), key);
  } else if (!v->is_number_integer()) {
    throw ApiError(400, str_cat("'", key, "' must be an integer"), key);
  }
  int64_t i = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                  ? INT64_MAX
                  : (v->is_number_float() ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>());
  if (i < lo || i > hi) throw ApiError(400, str_cat("'", key, "' must be between ", lo, " and ", hi, ", got ", i), key);
  return i;
}

std::optional<bool> opt_bool(const Json& body, const char* key) {
  const Json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw ApiError(400, str_cat("'", key, "' must be a boolean"), key);
  return v->get<bool>();
}

std::optional<std::string> opt_string(const Json& body, const char* key) {
  const Json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw ApiError(400, str_cat("'", key, "' must be a string"), key);
  return v->get<std::string>();
}

std::vector<std::string> string_or_list(const Json& body, const char* key, size_t max_items) {
  const Json* v = field(body, key);
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const auto& s : *v) {
      if (!s.is_string()) throw ApiError(400, str_cat("'", key, "' must be a string or an array of strings"), key);
      out.push_back(s.get<std::string>());
    }
  } else {
    throw ApiError(400, str_cat("'", key, "' must be a string or an array of strings"), key);
  }
  if (out.size() > max_items) throw ApiError(400, str_cat("'", key, "' has more than ", max_items, " entries"), key);
  for (const auto& s : out) {
    if (s.empty()) throw ApiError(400, str_cat("'", key, "' entries must not be empty"), key);
  }
  return out;
}

void check_model(const Json& body, const std::string& served_model, bool required) {
  auto model = opt_string(body, "model");
  if (!model) {
    if (required) throw ApiError(400, "'model' is required", "model");
    return;
  }
  if (*model != served_model) {
    throw ApiError(404, str_cat("The model '", *model, "' does not exist; this server serves '", served_model, "'"),
                   "model");
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  size_t tail = infer::utf8_sanitize_append(bytes, &out);
  if (tail > 0) out += "\xEF\xBF\xBD";
  return out;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string sse_data(const Json& j) {
  std::string out = "data: ";
  out += dump_json(j);
  out += "\n\n";
  return out;
}

std::string sse_event(std::string_view name, const Json& j) {
  std::string out = "event: ";
  out += name;
  out += "\ndata: ";
  out += dump_json(j);
  out += "\n\n";
  return out;
}

}  // namespace astrai::serve
