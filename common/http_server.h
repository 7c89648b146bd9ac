// A small HTTP/1.1 server for JSON APIs (civetweb underneath): every request goes to one
// handler, on a pool of threads, one request per thread at a time. Plain HTTP only: the
// TLS of Debian's civetweb loads OpenSSL 3 at run time and crashes on its first handshake,
// so HTTPS belongs to a proxy in front.
//
// A handler answers through HttpResponse, either whole (send) or as a chunked stream
// (startStream, then write per piece, then endStream) — server-sent events are a stream of
// "text/event-stream". write() returns false once the client has gone, so the handler can
// stop the work behind the stream.
//
// Request bodies larger than `max_body_bytes`, or slower than 30 s in all, are refused
// (413, 408) before the handler runs, and their connection closed; a handler that returns
// without answering makes the server answer 500. Streams to HTTP/1.0 clients are not
// chunked: the connection's end ends them.
//
// Threading: start() and the destructor from one owning thread; the handler runs on the
// pool's threads, concurrently. The destructor stops accepting connections and waits for
// running handlers to return.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

struct mg_context;

namespace cleave {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // URL-decoded, without the query string
  std::string query;   // after '?', undecoded; empty when none
  std::string body;
  std::string remote_address;
  // Header names lower-cased, in the order received.
  std::vector<std::pair<std::string, std::string>> headers;

  // The value of header `name` (lower-case), or empty when absent.
  std::string_view header(std::string_view name) const;
  // The first value of query parameter `name` ('+' and %XX decoded), or nullopt when absent.
  std::optional<std::string> param(std::string_view name) const;
};

class HttpResponse {
 public:
  virtual ~HttpResponse() = default;
  // The whole response. At most once, and not after startStream().
  virtual void send(int status, std::string_view content_type, std::string_view body,
                    const std::vector<std::pair<std::string, std::string>>& headers = {}) = 0;
  // Starts a chunked response; false when the client has gone.
  virtual bool startStream(
      int status, std::string_view content_type,
      const std::vector<std::pair<std::string, std::string>>& headers = {}) = 0;
  // One piece of a started stream; false when the client has gone (further writes fail).
  virtual bool write(std::string_view data) = 0;
  // Ends a started stream.
  virtual void endStream() = 0;
  // True once the client has closed its connection: nobody will read the response. May be
  // called from any thread while the request is being served (every few hundred ms: the
  // first call looks for the connection's socket).
  virtual bool clientGone() { return false; }
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

struct HttpServerOptions {
  // host:port; port 0 picks a free one. "[::]:P" for IPv6.
  std::string listen = "127.0.0.1:8000";
  // Requests served at once (a streaming response holds its thread until it ends).
  int threads = 64;
  size_t max_body_bytes = 4u << 20;
  // Headers for the errors the server answers itself (413, 408, and 500 for a handler that
  // did not answer), from the request's headers: e.g. CORS, so that a browser can read them.
  std::function<std::vector<std::pair<std::string, std::string>>(const HttpRequest&)> error_headers;
};

class HttpServer {
 public:
  // Fails naming the address when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer() = default;
  HttpHandler handler_;
  std::function<std::vector<std::pair<std::string, std::string>>(const HttpRequest&)>
      error_headers_;
  size_t max_body_bytes_ = 0;
  mg_context* context_ = nullptr;
  int port_ = 0;

  friend struct HttpServerAccess;
};

// The reason phrase of an HTTP status ("Not Found").
std::string_view httpReason(int status);

}  // namespace cleave
