#include "serve/api_error.h"

namespace astrai::serve {

namespace {

const char* openai_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

const char* anthropic_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

}  // namespace

Json error_json(Protocol protocol, int status, const std::string& message, const std::string& param) {
  if (protocol == Protocol::kAnthropic) {
    return Json{{"type", "error"}, {"error", {{"type", anthropic_type(status)}, {"message", message}}}};
  }
  Json code = nullptr;
  if (status == 401) code = "invalid_api_key";
  if (status == 404 && param == "model") code = "model_not_found";
  if (status == 413) code = "request_too_large";
  return Json{{"error",
               {{"message", message},
                {"type", openai_type(status)},
                {"param", param.empty() ? Json(nullptr) : Json(param)},
                {"code", code}}}};
}

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace astrai::serve
