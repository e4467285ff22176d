// HTTP/1.1 message parsing and serialisation for the server's own epoll loop (see
// docs/server.md for why we do not use a library). The parser is incremental and
// allocation-bounded: it never accepts more than HttpLimits allow, so one connection holds at
// most max_header_bytes + max_body_bytes of input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace astrai::serve {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpLimits {
  size_t max_header_bytes = 64 << 10;  // request line + headers
  size_t max_body_bytes = 8 << 20;     // decoded body; beyond it the answer is 413
};

struct HttpRequest {
  std::string method;
  std::string target;  // as sent: path + optional "?query"
  std::string path;    // target without the query
  std::string query;
  int version_minor = 1;  // HTTP/1.<minor>
  HttpHeaders headers;    // names lower-cased, values trimmed
  std::string body;
  bool keep_alive = true;
  // Set by the server when the request could not be read (400, 413, 431, 501); the handler
  // answers it in its protocol's error shape and the connection is then closed.
  int error_status = 0;
  std::string error_message;

  // The first header with this (lower-case) name, or nullptr.
  const std::string* header(std::string_view name) const;
};

struct HttpParseResult {
  enum class Status { kNeedMore, kComplete, kError };
  Status status = Status::kNeedMore;
  size_t consumed = 0;           // bytes of input the complete request used
  bool headers_complete = false;  // the head is parsed (even while the body is incomplete)
  bool expect_continue = false;   // client sent "Expect: 100-continue" and awaits our go-ahead
  int error_status = 0;           // HTTP status to answer with on kError
  std::string error_message;
  HttpRequest request;  // complete on kComplete; method/path filled as far as known on kError
};

// Parses one request from the front of `input`. kNeedMore: call again with more bytes
// (the parse restarts from the front; heads are small and bodies are only copied once
// complete). Supports Content-Length and chunked request bodies.
HttpParseResult parse_http_request(std::string_view input, const HttpLimits& limits);

const char* http_status_text(int status);

// "HTTP/1.1 <status> <text>\r\n" + headers + framing + "\r\n". content_length < 0 means a
// chunked body follows (write with http_chunk, end with kHttpLastChunk).
std::string http_response_head(int status, const HttpHeaders& headers, int64_t content_length,
                               bool keep_alive);
std::string http_chunk(std::string_view data);
inline constexpr std::string_view kHttpLastChunk = "0\r\n\r\n";

// Case-insensitive ASCII comparison for header names and tokens.
bool iequals(std::string_view a, std::string_view b);

}  // namespace astrai::serve
