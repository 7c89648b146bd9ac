#include "services/router/cors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cleave::router {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

// What a handler sent.
class Recorded final : public HttpResponse {
 public:
  void send(int s, std::string_view, std::string_view, const Headers& h) override {
    status = s, headers = h;
  }
  bool startStream(int s, std::string_view, const Headers& h) override {
    status = s, headers = h;
    return true;
  }
  bool write(std::string_view) override { return true; }
  void endStream() override {}
  std::string header(const std::string& name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return v;
    }
    return "<none>";
  }
  int status = 0;
  Headers headers;
};

HttpRequest preflight(const std::string& origin) {
  HttpRequest r;
  r.method = "OPTIONS";
  r.path = "/v1/chat/completions";
  r.headers = {{"origin", origin},
               {"access-control-request-method", "POST"},
               {"access-control-request-headers", "authorization, content-type"}};
  return r;
}

TEST(CorsTest, AnyOriginIsAnsweredAsVllmDoes) {
  const CorsPolicy any("*");
  Recorded answer;
  EXPECT_EQ(any.answerPreflight(preflight("https://ui.example"), "POST", answer), 200);
  EXPECT_EQ(answer.header("Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(answer.header("Access-Control-Allow-Methods"), "POST, OPTIONS");
  EXPECT_EQ(answer.header("Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(answer.header("Vary"), "<none>");
  // Responses to it carry the origin; a request without one gets no CORS header.
  Recorded sent;
  CorsResponse(sent, any.responseHeaders("https://ui.example"))
      .startStream(200, "text/event-stream", {});
  EXPECT_EQ(sent.header("Access-Control-Allow-Origin"), "*");
  EXPECT_THAT(sent.header("Access-Control-Expose-Headers"), ::testing::HasSubstr("X-Request-Id"));
  Recorded plain;
  CorsResponse(plain, any.responseHeaders(""))
      .send(200, "application/json", "{}", {{"X-Request-Id", "a"}});
  EXPECT_EQ(plain.headers, (Headers{{"X-Request-Id", "a"}}));
  // Not a preflight: left to the route.
  HttpRequest options = preflight("https://ui.example");
  options.headers.pop_back();
  options.headers.pop_back();
  EXPECT_EQ(any.answerPreflight(options, "POST", answer), 0);
}

TEST(CorsTest, AListAllowsItsOriginsOnlyAndNoneAllowsNothing) {
  const CorsPolicy listed("https://a.example, https://b.example");
  EXPECT_EQ(listed.allow("https://b.example"), "https://b.example");
  EXPECT_EQ(listed.allow("https://c.example"), "");
  Recorded answer;
  EXPECT_EQ(listed.answerPreflight(preflight("https://a.example"), "GET, DELETE", answer), 200);
  EXPECT_EQ(answer.header("Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(answer.header("Vary"), "Origin");
  EXPECT_EQ(listed.answerPreflight(preflight("https://c.example"), "POST", answer), 400);
  EXPECT_EQ(answer.header("Access-Control-Allow-Origin"), "<none>");
  const CorsPolicy none("");
  EXPECT_EQ(none.allow("https://a.example"), "");
  EXPECT_EQ(none.answerPreflight(preflight("https://a.example"), "POST", answer), 400);
}

}  // namespace
}  // namespace cleave::router
