#include "serve/http.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

namespace astrai::serve {

namespace {

using Status = HttpParseResult::Status;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_token_char(char c) {
  if (std::isalnum(static_cast<unsigned char>(c))) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

HttpParseResult error(HttpParseResult r, int status, std::string message) {
  r.status = Status::kError;
  r.error_status = status;
  r.error_message = std::move(message);
  return r;
}

// Comma-separated header value contains `token` (case-insensitive).
bool has_token(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    if (iequals(trim(value.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

// Decodes a chunked body starting at input[pos]. Returns kNeedMore, kComplete (consumed set
// to the end of the trailers) or kError.
Status decode_chunked(std::string_view input, size_t pos, size_t max_body, std::string* body, size_t* consumed,
                      int* err_status, std::string* err) {
  body->clear();
  while (true) {
    size_t eol = input.find("\r\n", pos);
    if (eol == std::string_view::npos) {
      if (input.size() - pos > 1024) {
        *err_status = 400;
        *err = "chunk size line too long";
        return Status::kError;
      }
      return Status::kNeedMore;
    }
    std::string_view line = input.substr(pos, eol - pos);
    line = trim(line.substr(0, line.find(';')));
    uint64_t size = 0;
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
    if (line.empty() || ec != std::errc() || ptr != line.data() + line.size()) {
      *err_status = 400;
      *err = "malformed chunk size";
      return Status::kError;
    }
    pos = eol + 2;
    if (size == 0) {
      // Trailers (ignored) end with an empty line.
      while (true) {
        size_t end = input.find("\r\n", pos);
        if (end == std::string_view::npos) return Status::kNeedMore;
        bool empty = end == pos;
        pos = end + 2;
        if (empty) {
          *consumed = pos;
          return Status::kComplete;
        }
      }
    }
    if (size > max_body || body->size() + size > max_body) {
      *err_status = 413;
      *err = "request body exceeds the limit";
      return Status::kError;
    }
    if (input.size() < pos + size + 2) return Status::kNeedMore;
    if (input.substr(pos + size, 2) != "\r\n") {
      *err_status = 400;
      *err = "chunk data not followed by CRLF";
      return Status::kError;
    }
    body->append(input.substr(pos, size));
    pos += size + 2;
  }
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return &v;
  }
  return nullptr;
}

HttpParseResult parse_http_request(std::string_view input, const HttpLimits& limits) {
  HttpParseResult r;
  // RFC 9112 2.2: ignore empty lines before the request line.
  size_t start = 0;
  while (input.size() >= start + 2 && input.substr(start, 2) == "\r\n") start += 2;
  size_t head_end = input.find("\r\n\r\n", start);
  if (head_end == std::string_view::npos) {
    if (input.size() - start > limits.max_header_bytes) return error(std::move(r), 431, "request head too large");
    return r;
  }
  if (head_end - start > limits.max_header_bytes) return error(std::move(r), 431, "request head too large");
  std::string_view head = input.substr(start, head_end - start);
  size_t body_start = head_end + 4;
  HttpRequest& req = r.request;

  // Request line: METHOD SP target SP HTTP/1.x
  size_t line_end = head.find("\r\n");
  std::string_view line = head.substr(0, line_end);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0 || sp2 == sp1 + 1) {
    return error(std::move(r), 400, "malformed request line");
  }
  std::string_view method = line.substr(0, sp1);
  if (!std::all_of(method.begin(), method.end(), is_token_char)) return error(std::move(r), 400, "malformed method");
  req.method = std::string(method);
  req.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  size_t q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  std::string_view version = line.substr(sp2 + 1);
  if (version == "HTTP/1.1") {
    req.version_minor = 1;
  } else if (version == "HTTP/1.0") {
    req.version_minor = 0;
  } else {
    return error(std::move(r), 505, "only HTTP/1.0 and HTTP/1.1 are supported");
  }

  // Header fields.
  std::string_view rest = line_end == std::string_view::npos ? std::string_view() : head.substr(line_end + 2);
  while (!rest.empty()) {
    size_t eol = rest.find("\r\n");
    std::string_view field = rest.substr(0, eol);
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 2);
    if (!field.empty() && (field.front() == ' ' || field.front() == '\t')) {
      return error(std::move(r), 400, "obsolete header line folding");
    }
    size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) return error(std::move(r), 400, "malformed header field");
    std::string_view name = field.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), is_token_char)) return error(std::move(r), 400, "malformed header name");
    req.headers.emplace_back(lower(name), std::string(trim(field.substr(colon + 1))));
  }

  const std::string* connection = req.header("connection");
  req.keep_alive = req.version_minor == 1 ? !(connection && has_token(*connection, "close"))
                                          : (connection && has_token(*connection, "keep-alive"));

  // Body framing (RFC 9112 6.3): Transfer-Encoding wins; both present is a smuggling risk.
  const std::string* te = req.header("transfer-encoding");
  bool chunked = false;
  uint64_t content_length = 0;
  bool have_length = false;
  for (const auto& [k, v] : req.headers) {
    if (k != "content-length") continue;
    uint64_t n = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
      return error(std::move(r), 400, "malformed Content-Length");
    }
    if (have_length && n != content_length) return error(std::move(r), 400, "conflicting Content-Length headers");
    content_length = n;
    have_length = true;
  }
  if (te) {
    if (have_length) return error(std::move(r), 400, "both Transfer-Encoding and Content-Length");
    std::string_view v = trim(*te);
    if (!iequals(v, "chunked")) return error(std::move(r), 501, "unsupported Transfer-Encoding: " + *te);
    chunked = true;
  }
  r.headers_complete = true;
  const std::string* expect = req.header("expect");
  r.expect_continue = expect && iequals(trim(*expect), "100-continue");

  if (chunked) {
    size_t consumed = 0;
    int status = 0;
    std::string message;
    Status s = decode_chunked(input, body_start, limits.max_body_bytes, &req.body, &consumed, &status, &message);
    if (s == Status::kError) return error(std::move(r), status, message);
    if (s == Status::kNeedMore) {
      req.body.clear();
      return r;
    }
    r.consumed = consumed;
  } else {
    if (content_length > limits.max_body_bytes) {
      return error(std::move(r), 413,
                   "request body of " + std::to_string(content_length) + " bytes exceeds the limit of " +
                       std::to_string(limits.max_body_bytes));
    }
    if (input.size() - body_start < content_length) return r;
    req.body = std::string(input.substr(body_start, content_length));
    r.consumed = body_start + content_length;
  }
  r.status = Status::kComplete;
  return r;
}

const char* http_status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

std::string http_response_head(int status, const HttpHeaders& headers, int64_t content_length, bool keep_alive) {
  std::string out;
  out.reserve(256);
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  out += http_status_text(status);
  out += "\r\n";
  for (const auto& [k, v] : headers) {
    out += k;
    out += ": ";
    out += v;
    out += "\r\n";
  }
  if (content_length >= 0) {
    out += "Content-Length: ";
    out += std::to_string(content_length);
    out += "\r\n";
  } else {
    out += "Transfer-Encoding: chunked\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  return out;
}

std::string http_chunk(std::string_view data) {
  char size[20];
  int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out;
  out.reserve(data.size() + static_cast<size_t>(n) + 2);
  out.append(size, static_cast<size_t>(n));
  out.append(data);
  out += "\r\n";
  return out;
}

}  // namespace astrai::serve
