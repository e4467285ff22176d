// An error answered to an API client: HTTP status plus what each protocol's error JSON needs.
#pragma once

#include <stdexcept>
#include <string>

#include "base/json.h"

namespace astrai::serve {

enum class Protocol { kOpenAi, kAnthropic };

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {})
      : std::runtime_error(message), status(status), param(std::move(param)) {}
  int status;
  std::string param;  // the offending request field (OpenAI's "param"), if known
};

// {"error":{"message","type","param","code"}} (OpenAI) or
// {"type":"error","error":{"type","message"}} (Anthropic), with the type each uses for `status`.
Json error_json(Protocol protocol, int status, const std::string& message, const std::string& param = {});

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD): model output may split
// characters, and a request may carry broken strings.
std::string dump_json(const Json& j);

}  // namespace astrai::serve
