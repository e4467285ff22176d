// A small blocking HTTP/1.1 client for http:// URLs (no TLS): one request per connection
// ("Connection: close"), Content-Length or chunked responses. Enough to call an
// OpenAI-compatible server from `astrai eval tasks --url`; not a general client.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace astrai::eval {

struct HttpUrl {
  std::string host;
  std::string port = "80";
  std::string path = "/";  // path and query as given, "/" when none
};

// Parses "http://HOST[:PORT][/PATH]" (IPv6 hosts in brackets). Throws astrai::Error for other
// schemes (https is not supported) and malformed URLs.
HttpUrl parse_http_url(const std::string& url);

struct HttpResponse {
  int status = 0;
  std::string body;
};

// POSTs `body` (Content-Type: application/json) to url.host:port at `path`, with the extra
// headers, and returns the status and decoded body. Throws astrai::Error naming the host when
// it cannot connect, on a timeout (each send or receive waiting longer than timeout_seconds)
// or on a malformed response.
HttpResponse http_post_json(const HttpUrl& url, const std::string& path, const std::string& body,
                            const std::vector<std::pair<std::string, std::string>>& headers, double timeout_seconds);

}  // namespace astrai::eval
