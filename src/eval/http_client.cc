#include "eval/http_client.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "base/error.h"

namespace astrai::eval {

namespace {

// Closes the socket on every path out.
struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

std::string where(const HttpUrl& u) { return str_cat("http://", u.host, ":", u.port); }

void connect_to(const HttpUrl& url, double timeout_seconds, Socket* s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(url.host.c_str(), url.port.c_str(), &hints, &res);
  if (rc != 0) fail(where(url), ": cannot resolve the host (", ::gai_strerror(rc), ")");
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    s->fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (s->fd < 0) continue;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_seconds);
    tv.tv_usec = static_cast<suseconds_t>((timeout_seconds - static_cast<double>(tv.tv_sec)) * 1e6);
    ::setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(s->fd, a->ai_addr, a->ai_addrlen) == 0) break;
    last = std::strerror(errno);
    ::close(s->fd);
    s->fd = -1;
  }
  ::freeaddrinfo(res);
  if (s->fd < 0) fail(where(url), ": cannot connect (", last, ")");
}

void send_all(const HttpUrl& url, int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(where(url), ": sending the request failed (", std::strerror(errno), ")");
    data.remove_prefix(static_cast<size_t>(n));
  }
}

std::string receive_all(const HttpUrl& url, int fd) {
  std::string out;
  char buf[64 << 10];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fail(where(url), errno == EAGAIN || errno == EWOULDBLOCK ? ": no response before the timeout"
                                                              : str_cat(": receiving failed (", std::strerror(errno), ")"));
    }
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string dechunk(const HttpUrl& url, std::string_view in) {
  std::string out;
  while (true) {
    const size_t eol = in.find("\r\n");
    if (eol == std::string_view::npos) fail(where(url), ": truncated chunked response");
    const std::string_view line = trim(in.substr(0, in.substr(0, eol).find(';')));
    size_t size = 0;
    const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
    if (ec != std::errc() || p != line.data() + line.size()) fail(where(url), ": malformed chunk size");
    in.remove_prefix(eol + 2);
    if (size == 0) return out;
    if (in.size() < size + 2) fail(where(url), ": truncated chunked response");
    out.append(in.substr(0, size));
    in.remove_prefix(size + 2);
  }
}

HttpResponse parse_response(const HttpUrl& url, const std::string& raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.compare(0, 7, "HTTP/1.") != 0 || raw.size() < 12)
    fail(where(url), ": not an HTTP/1.x response");
  HttpResponse r;
  const auto [p, ec] = std::from_chars(raw.data() + 9, raw.data() + 12, r.status);
  if (ec != std::errc()) fail(where(url), ": malformed status line");
  bool chunked = false;
  long long length = -1;
  std::string_view head(raw.data(), head_end);
  for (size_t pos = head.find("\r\n"); pos != std::string_view::npos;) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string_view line = head.substr(pos + 2, next == std::string_view::npos ? next : next - pos - 2);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      const std::string name = lower(trim(line.substr(0, colon)));
      const std::string_view value = trim(line.substr(colon + 1));
      if (name == "transfer-encoding") chunked = lower(value).find("chunked") != std::string::npos;
      if (name == "content-length") std::from_chars(value.data(), value.data() + value.size(), length);
    }
    pos = next;
  }
  const std::string_view body = std::string_view(raw).substr(head_end + 4);
  if (chunked) {
    r.body = dechunk(url, body);
  } else if (length >= 0) {
    if (body.size() < static_cast<size_t>(length)) fail(where(url), ": truncated response body");
    r.body = std::string(body.substr(0, static_cast<size_t>(length)));
  } else {
    r.body = std::string(body);
  }
  return r;
}

}  // namespace

HttpUrl parse_http_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0) {
    fail("--url ", url, ": only http://HOST:PORT URLs are supported",
         url.compare(0, 8, "https://") == 0 ? " (no TLS; put a proxy in front for https)" : "");
  }
  HttpUrl u;
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    u.path = rest.substr(slash);
    rest.resize(slash);
  }
  size_t colon = rest.rfind(':');
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) fail("--url ", url, ": unterminated IPv6 address");
    u.host = rest.substr(1, close - 1);
    colon = rest.size() > close + 1 && rest[close + 1] == ':' ? close + 1 : std::string::npos;
  } else {
    u.host = rest.substr(0, colon);
  }
  if (colon != std::string::npos) u.port = rest.substr(colon + 1);
  int port = 0;
  const auto [p, ec] = std::from_chars(u.port.data(), u.port.data() + u.port.size(), port);
  if (u.host.empty() || ec != std::errc() || p != u.port.data() + u.port.size() || port < 1 || port > 65535)
    fail("--url ", url, ": expected http://HOST:PORT");
  return u;
}

HttpResponse http_post_json(const HttpUrl& url, const std::string& path, const std::string& body,
                            const std::vector<std::pair<std::string, std::string>>& headers, double timeout_seconds) {
  Socket s;
  connect_to(url, timeout_seconds, &s);
  std::string req = str_cat("POST ", path, " HTTP/1.1\r\nHost: ", url.host, ":", url.port,
                            "\r\nContent-Type: application/json\r\nAccept: application/json\r\nConnection: close\r\n"
                            "Content-Length: ",
                            body.size(), "\r\n");
  for (const auto& [name, value] : headers) req += str_cat(name, ": ", value, "\r\n");
  req += "\r\n";
  req += body;
  send_all(url, s.fd, req);
  return parse_response(url, receive_all(url, s.fd));
}

}  // namespace astrai::eval
