#include "services/router/cors.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace cleave::router {

using Headers = std::vector<std::pair<std::string, std::string>>;

CorsPolicy::CorsPolicy(std::string_view origins) {
  for (absl::string_view origin : absl::StrSplit(absl::string_view(origins.data(), origins.size()),
                                                 ',', absl::SkipWhitespace())) {
    origin = absl::StripAsciiWhitespace(origin);
    if (origin == "*") any_ = true;
    origins_.emplace_back(origin);
  }
}

std::string CorsPolicy::allow(std::string_view origin) const {
  if (origin.empty()) return "";
  if (any_) return "*";
  for (const std::string& allowed : origins_) {
    if (allowed == origin) return allowed;
  }
  return "";
}

int CorsPolicy::answerPreflight(const HttpRequest& request, const char* methods,
                                HttpResponse& response) const {
  const std::string_view origin = request.header("origin");
  if (request.method != "OPTIONS" || origin.empty() ||
      request.header("access-control-request-method").empty()) {
    return 0;
  }
  const std::string allowed = allow(origin);
  if (allowed.empty()) {
    response.send(400, "text/plain", "origin not allowed (see --http-allowed-origins)\n");
    return 400;
  }
  Headers headers = {{"Access-Control-Allow-Origin", allowed},
                     {"Access-Control-Allow-Methods", std::string(methods) + ", OPTIONS"},
                     {"Access-Control-Max-Age", "600"}};
  if (std::string_view asked = request.header("access-control-request-headers"); !asked.empty())
    headers.emplace_back("Access-Control-Allow-Headers", std::string(asked));
  if (allowed != "*") headers.emplace_back("Vary", "Origin");
  response.send(200, "text/plain", "", headers);
  return 200;
}

Headers CorsPolicy::responseHeaders(std::string_view origin) const {
  const std::string allowed = allow(origin);
  if (allowed.empty()) return {};
  // A page may read the headers it would want to: the request's id and retry hints.
  Headers out = {{"Access-Control-Allow-Origin", allowed},
                 {"Access-Control-Expose-Headers", "X-Request-Id, Retry-After, retry-after-ms"}};
  if (allowed != "*") out.emplace_back("Vary", "Origin");
  return out;
}

CorsResponse::CorsResponse(HttpResponse& inner, Headers headers)
    : inner_(inner), headers_(std::move(headers)) {}

Headers CorsResponse::with(const Headers& headers) const {
  if (headers_.empty()) return headers;
  Headers out = headers;
  out.insert(out.end(), headers_.begin(), headers_.end());
  return out;
}

void CorsResponse::send(int status, std::string_view content_type, std::string_view body,
                        const Headers& headers) {
  inner_.send(status, content_type, body, with(headers));
}

bool CorsResponse::startStream(int status, std::string_view content_type, const Headers& headers) {
  return inner_.startStream(status, content_type, with(headers));
}

}  // namespace cleave::router
