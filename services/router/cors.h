// Cross-origin requests to the HTTP API (CORS), answered as vLLM's server answers them by
// default, so that a web page (a chat UI served from elsewhere) may call it: any origin
// (`--http-allowed-origins`, "*" by default, or a list; empty turns CORS off), any method
// the route takes, any header the page asks for, no credentials (cookies); the API's own
// Authorization header is one a page sets itself.
//
// Threading: immutable after construction; any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/http_server.h"

namespace cleave::router {

class CorsPolicy {
 public:
  // `origins`: comma-separated origins ("https://chat.example.com"), or "*" for any; empty
  // for none (no CORS header is ever sent).
  explicit CorsPolicy(std::string_view origins);

  // The Access-Control-Allow-Origin to answer a request from `origin` with ("*" or the
  // origin itself), or empty when it is not allowed or there is none.
  std::string allow(std::string_view origin) const;
  // The headers a response to a request from `origin` carries (none when not allowed).
  std::vector<std::pair<std::string, std::string>> responseHeaders(std::string_view origin) const;
  // Answers `request` when it is a preflight (OPTIONS with Origin and
  // Access-Control-Request-Method) for a route taking `methods` (comma-separated): 200 with
  // what may follow, or 400 for an origin not allowed. Its HTTP status, or 0 when it was
  // not a preflight.
  int answerPreflight(const HttpRequest& request, const char* methods,
                      HttpResponse& response) const;

 private:
  bool any_ = false;
  std::vector<std::string> origins_;
};

// A response carrying `headers` too (CorsPolicy::responseHeaders).
class CorsResponse final : public HttpResponse {
 public:
  CorsResponse(HttpResponse& inner, std::vector<std::pair<std::string, std::string>> headers);
  void send(int status, std::string_view content_type, std::string_view body,
            const std::vector<std::pair<std::string, std::string>>& headers) override;
  bool startStream(int status, std::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) override;
  bool write(std::string_view data) override { return inner_.write(data); }
  void endStream() override { inner_.endStream(); }
  bool clientGone() override { return inner_.clientGone(); }

 private:
  std::vector<std::pair<std::string, std::string>> with(
      const std::vector<std::pair<std::string, std::string>>& headers) const;
  HttpResponse& inner_;
  std::vector<std::pair<std::string, std::string>> headers_;
};

}  // namespace cleave::router
