#include "services/loadgen/openai_sender.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace cleave::loadgen {
namespace {

using Json = nlohmann::json;

// j[key] when j is an object holding it; null otherwise (what a server sends is not trusted
// to have any shape).
const Json* member(const Json* j, const char* key) {
  if (j == nullptr || !j->is_object()) return nullptr;
  auto it = j->find(key);
  return it == j->end() ? nullptr : &*it;
}

std::string stringOf(const Json* j) {
  return j != nullptr && j->is_string() ? j->get<std::string>() : "";
}

uint32_t countOf(const Json* j) {
  return j != nullptr && j->is_number_unsigned() && j->get<uint64_t>() <= UINT32_MAX
             ? j->get<uint32_t>()
             : 0;
}

absl::Status statusOfHttp(int http, const std::string& body) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  std::string message = stringOf(member(member(&j, "error"), "message"));
  if (message.empty()) message = body.substr(0, 300);
  message = absl::StrCat("HTTP ", http, ": ", message);
  switch (http) {
    case 400: return absl::InvalidArgumentError(message);
    case 401: return absl::UnauthenticatedError(message);
    case 404: return absl::NotFoundError(message);
    case 429: return absl::ResourceExhaustedError(message);
    case 503: return absl::UnavailableError(message);
    case 504: return absl::DeadlineExceededError(message);
    default: return absl::InternalError(message);
  }
}

// A connected TCP socket, closed when it goes.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

absl::StatusOr<std::unique_ptr<Socket>> connectTo(const OpenAiTarget& target) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(target.port);
  if (const int err = getaddrinfo(target.host.c_str(), port.c_str(), &hints, &found); err != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", target.host, ": ", gai_strerror(err)));
  }
  std::string why = "no address";
  std::unique_ptr<Socket> socket;
  for (addrinfo* a = found; a != nullptr && socket == nullptr; a = a->ai_next) {
    auto s = std::make_unique<Socket>(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (s->fd() >= 0 && ::connect(s->fd(), a->ai_addr, a->ai_addrlen) == 0) {
      socket = std::move(s);
    } else {
      why = std::strerror(errno);
    }
  }
  freeaddrinfo(found);
  if (socket == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", target.host, ":", target.port, ": ", why));
  }
  // Reads wait at most the request's timeout; each event is sent as it is written.
  timeval timeout{.tv_sec = static_cast<time_t>(target.timeout_s), .tv_usec = 0};
  setsockopt(socket->fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const int one = 1;
  setsockopt(socket->fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return socket;
}

// One request on a connection of its own (HTTP/1.1, closed after it): `on_body` gets the
// body as it arrives, chunked encoding undone (false stops reading); `http` the status.
absl::Status exchange(const OpenAiTarget& target, const char* method, const std::string& path,
                      const std::string& body, int& http,
                      const std::function<bool(absl::string_view)>& on_body) {
  CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<Socket> socket, connectTo(target));
  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", target.host, ":",
                                     target.port, "\r\nConnection: close\r\n");
  if (!target.api_key.empty()) {
    absl::StrAppend(&request, "Authorization: Bearer ", target.api_key, "\r\n");
  }
  if (!body.empty()) {
    absl::StrAppend(&request, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n =
        ::send(socket->fd(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return absl::UnavailableError(absl::StrCat("cannot send: ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  // What arrives, read as it comes: the head, then the body.
  std::string in;
  bool eof = false;
  auto more = [&]() -> absl::Status {
    char buffer[16384];
    const ssize_t n = ::recv(socket->fd(), buffer, sizeof(buffer), 0);
    if (n < 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("reading the response: ", std::strerror(errno)));
    }
    if (n == 0) eof = true;
    in.append(buffer, static_cast<size_t>(n));
    return absl::OkStatus();
  };
  size_t head_end;
  while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
    if (eof || in.size() > (1 << 16)) return absl::InternalError("no HTTP response head");
    CLEAVE_RETURN_IF_ERROR(more());
  }
  const std::string head = absl::AsciiStrToLower(in.substr(0, head_end));
  in.erase(0, head_end + 4);
  if (!absl::StartsWith(head, "http/1.") || head.size() < 12 ||
      !absl::SimpleAtoi(head.substr(9, 3), &http)) {
    return absl::InternalError(absl::StrCat("not an HTTP response: ", head.substr(0, 40)));
  }
  const bool chunked = absl::StrContains(head, "transfer-encoding: chunked");
  if (!chunked) {  // To the end of the connection.
    for (;;) {
      if (!in.empty() && !on_body(in)) return absl::OkStatus();
      in.clear();
      if (eof) return absl::OkStatus();
      CLEAVE_RETURN_IF_ERROR(more());
    }
  }
  for (;;) {  // Chunks: a hex size line, the data, CRLF; size 0 ends.
    size_t line_end;
    while ((line_end = in.find("\r\n")) == std::string::npos) {
      if (eof) return absl::InternalError("the response ended inside a chunk");
      CLEAVE_RETURN_IF_ERROR(more());
    }
    size_t size = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(in.substr(0, line_end)), &size)) {
      return absl::InternalError("a malformed chunk size in the response");
    }
    if (size == 0) return absl::OkStatus();
    while (in.size() < line_end + 2 + size + 2) {
      if (eof) return absl::InternalError("the response ended inside a chunk");
      CLEAVE_RETURN_IF_ERROR(more());
    }
    if (!on_body(absl::string_view(in).substr(line_end + 2, size))) return absl::OkStatus();
    in.erase(0, line_end + 2 + size + 2);
  }
}

}  // namespace

absl::Status parseOpenAiUrl(const std::string& url, OpenAiTarget& target) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--openai: '", url, "' is not http://HOST:PORT (https is not supported)"));
  }
  absl::ConsumeSuffix(&rest, "/");
  absl::ConsumeSuffix(&rest, "/v1");
  const size_t colon = rest.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(colon + 1), &port) ||
      port <= 0 || port > 65535 || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--openai: '", url, "' has no HOST:PORT"));
  }
  target.host = std::string(rest.substr(0, colon));
  target.port = port;
  return absl::OkStatus();
}

absl::StatusOr<OpenAiModel> openAiModel(const OpenAiTarget& target) {
  int http = 0;
  std::string body;
  absl::Status status = exchange(target, "GET", "/v1/models", "", http, [&](absl::string_view s) {
    body.append(s.data(), s.size());
    return body.size() < (1 << 20);
  });
  if (!status.ok()) return status;
  if (http != 200) return statusOfHttp(http, body);
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  const Json* data = member(&j, "data");
  const Json* first = data != nullptr && data->is_array() && !data->empty() ? &(*data)[0] : nullptr;
  OpenAiModel model{.id = stringOf(member(first, "id")),
                    .vocab_size = countOf(member(first, "vocab_size"))};
  if (model.id.empty()) {
    return absl::UnavailableError("GET /v1/models lists no model (no worker registered yet?)");
  }
  return model;
}

Sender openAiSender(OpenAiTarget target) {
  return [target](const PlannedRequest& planned, const std::function<void(uint32_t)>& on_tokens,
                  PromptUsage& prompt) -> absl::Status {
    const bool chat = target.chat && !planned.prompt_text.empty();
    Json request{{"max_tokens", planned.output_tokens},
                 {"temperature", target.temperature},
                 {"seed", planned.index},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (!target.model.empty()) request["model"] = target.model;
    if (chat) {
      request["messages"] = Json::array({{{"role", "user"}, {"content", planned.prompt_text}}});
    } else if (!planned.prompt_text.empty()) {
      request["prompt"] = planned.prompt_text;
    } else {
      request["prompt"] = planned.prompt_ids;
    }
    int http = 0;
    std::string pending, body;
    uint32_t counted = 0, completion = 0;
    absl::Status failed;
    // Each complete event ("data: ...\n\n") as it arrives.
    auto onEvent = [&](absl::string_view event) {
      if (!absl::ConsumePrefix(&event, "data: ") || event == "[DONE]") return;
      const Json j = Json::parse(event.begin(), event.end(), nullptr, /*allow_exceptions=*/false);
      if (const Json* error = member(&j, "error"); error != nullptr) {
        const uint32_t code = countOf(member(error, "code"));
        failed = statusOfHttp(code != 0 ? static_cast<int>(code) : 500, std::string(event));
        return;
      }
      const Json* choices = member(&j, "choices");
      if (choices != nullptr && choices->is_array() && !choices->empty()) {
        const Json* choice = &(*choices)[0];
        const std::string text =
            stringOf(chat ? member(member(choice, "delta"), "content") : member(choice, "text"));
        if (!text.empty()) {
          ++counted;
          on_tokens(1);
        }
      }
      if (const Json* usage = member(&j, "usage"); usage != nullptr && usage->is_object()) {
        prompt.tokens = countOf(member(usage, "prompt_tokens"));
        prompt.cached = countOf(member(member(usage, "prompt_tokens_details"), "cached_tokens"));
        completion = countOf(member(usage, "completion_tokens"));
      }
    };
    absl::Status status =
        exchange(target, "POST", chat ? "/v1/chat/completions" : "/v1/completions", request.dump(),
                 http, [&](absl::string_view data) {
                   if (http != 200) {
                     body.append(data.data(), data.size());
                     return body.size() < (1 << 16);
                   }
                   pending.append(data.data(), data.size());
                   for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
                     onEvent(absl::string_view(pending).substr(0, end));
                     pending.erase(0, end + 2);
                   }
                   return true;
                 });
    if (!status.ok()) return status;
    if (http != 200) return statusOfHttp(http, body);
    if (!failed.ok()) return failed;
    if (completion > counted) on_tokens(completion - counted);  // tokens that added no text
    return absl::OkStatus();
  };
}

}  // namespace cleave::loadgen
