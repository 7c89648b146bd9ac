#include "common/http_server.h"

#include <civetweb.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/peer_socket.h"

namespace cleave {

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return {};
}

std::optional<std::string> HttpRequest::param(std::string_view name) const {
  auto decode = [](absl::string_view in) {
    std::string out;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] == '+') {
        out += ' ';
      } else if (in[i] == '%' && i + 2 < in.size() &&
                 std::isxdigit(static_cast<unsigned char>(in[i + 1])) &&
                 std::isxdigit(static_cast<unsigned char>(in[i + 2]))) {
        out += static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16));
        i += 2;
      } else {
        out += in[i];
      }
    }
    return out;
  };
  for (absl::string_view pair : absl::StrSplit(query, '&')) {
    const size_t eq = pair.find('=');
    if (decode(pair.substr(0, eq)) != name) continue;
    return eq == absl::string_view::npos ? std::string() : decode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

std::string_view httpReason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

namespace {

class CivetResponse final : public HttpResponse {
 public:
  // HTTP/1.0 has no chunked encoding: a stream there ends by closing the connection.
  CivetResponse(mg_connection* conn, bool chunked, const mg_request_info& info)
      : conn_(conn),
        chunked_(chunked),
        peer_address_(info.remote_addr),
        peer_port_(info.remote_port),
        local_port_(info.server_port) {}

  bool clientGone() override {
    std::call_once(found_,
                   [&] { fd_ = findConnectedSocket(peer_address_, peer_port_, local_port_); });
    return fd_ >= 0 && peerClosed(fd_);
  }

  void send(int status, std::string_view content_type, std::string_view body,
            const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (answered_) return;
    answered_ = true;
    if (!head(status, content_type, headers, std::to_string(body.size()))) return;
    if (!body.empty()) mg_write(conn_, body.data(), body.size());
  }

  bool startStream(int status, std::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (answered_) return false;
    answered_ = true;
    streaming_ = true;
    if (!chunked_) mg_disable_connection_keep_alive(conn_);
    alive_ = head(status, content_type, headers, "");
    return alive_;
  }

  bool write(std::string_view data) override {
    if (!streaming_ || !alive_) return false;
    if (data.empty()) return true;
    // One write per chunk (size line, data, CRLF), so a token is one packet.
    std::string framed = chunked_
                             ? absl::StrCat(absl::Hex(data.size()), "\r\n",
                                            absl::string_view(data.data(), data.size()), "\r\n")
                             : std::string(data);
    alive_ = mg_write(conn_, framed.data(), framed.size()) == static_cast<int>(framed.size());
    // A connection left inside a chunk cannot carry another request.
    if (!alive_) mg_disable_connection_keep_alive(conn_);
    return alive_;
  }

  void endStream() override {
    if (!streaming_ || !alive_) return;
    if (chunked_) mg_write(conn_, "0\r\n\r\n", 5);
    alive_ = false;
  }

  bool answered() const { return answered_; }

 private:
  // The status line and headers; an empty `length` means chunked.
  bool head(int status, std::string_view content_type,
            const std::vector<std::pair<std::string, std::string>>& headers,
            const std::string& length) {
    std::string type(content_type);
    if (mg_response_header_start(conn_, status) != 0) return false;
    mg_response_header_add(conn_, "Content-Type", type.c_str(), -1);
    if (length.empty()) {
      if (chunked_) mg_response_header_add(conn_, "Transfer-Encoding", "chunked", -1);
      mg_response_header_add(conn_, "Cache-Control", "no-cache", -1);
    } else {
      mg_response_header_add(conn_, "Content-Length", length.c_str(), -1);
    }
    for (const auto& [name, value] : headers) {
      mg_response_header_add(conn_, name.c_str(), value.c_str(), static_cast<int>(value.size()));
    }
    return mg_response_header_send(conn_) == 0;
  }

  mg_connection* conn_;
  const bool chunked_;
  // The connection's addresses, and its socket once looked for (-1: not found).
  const std::string peer_address_;
  const int peer_port_, local_port_;
  std::once_flag found_;
  int fd_ = -1;
  bool answered_ = false;
  bool streaming_ = false;
  bool alive_ = false;
};

// An error the server answers itself, before the handler runs; `close` ends the connection
// after it (the rest of the request is not read).
void sendPlain(mg_connection* conn, int status, const std::string& message, bool close,
               const std::vector<std::pair<std::string, std::string>>& headers) {
  if (close) mg_disable_connection_keep_alive(conn);
  CivetResponse response(conn, true, *mg_get_request_info(conn));
  response.send(
      status, "application/json",
      absl::StrCat(R"({"error":{"message":")", message,
                   R"(","type":"invalid_request_error","param":null,"code":)", status, "}}"),
      headers);
}

// How long a request body may take to arrive, in all.
constexpr auto kBodyDeadline = std::chrono::seconds(30);

}  // namespace

struct HttpServerAccess {
  static int handle(mg_connection* conn, void* data) {
    auto* server = static_cast<HttpServer*>(data);
    const mg_request_info* info = mg_get_request_info(conn);
    HttpRequest request;
    request.method = info->request_method != nullptr ? info->request_method : "";
    request.path = info->local_uri != nullptr ? info->local_uri : "";
    request.query = info->query_string != nullptr ? info->query_string : "";
    request.remote_address = info->remote_addr;
    for (int i = 0; i < info->num_headers; ++i) {
      request.headers.emplace_back(absl::AsciiStrToLower(info->http_headers[i].name),
                                   info->http_headers[i].value);
    }
    const std::vector<std::pair<std::string, std::string>> error_headers =
        server->error_headers_ ? server->error_headers_(request)
                               : std::vector<std::pair<std::string, std::string>>();
    const size_t limit = server->max_body_bytes_;
    const std::string too_large = absl::StrCat("the request body is larger than ", limit, " bytes");
    if (info->content_length > 0 && static_cast<uint64_t>(info->content_length) > limit) {
      sendPlain(conn, 413, too_large, true, error_headers);
      return 413;
    }
    const auto deadline = std::chrono::steady_clock::now() + kBodyDeadline;
    char buffer[16384];
    for (;;) {
      const int n = mg_read(conn, buffer, sizeof(buffer));
      if (n <= 0) break;
      request.body.append(buffer, static_cast<size_t>(n));
      if (request.body.size() > limit) {
        sendPlain(conn, 413, too_large, true, error_headers);
        return 413;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        sendPlain(conn, 408, "the request body did not arrive within 30 s", true, error_headers);
        return 408;
      }
    }
    const bool chunked =
        info->http_version != nullptr && std::string_view(info->http_version) != "1.0";
    CivetResponse response(conn, chunked, *info);
    server->handler_(request, response);
    if (!response.answered() && response.clientGone()) {
      // Cancelled for a client that closed its side: nothing more goes to it.
      mg_disable_connection_keep_alive(conn);
      return 499;
    }
    if (!response.answered()) {
      sendPlain(conn, 500, "the server did not answer this request", false, error_headers);
      return 500;
    }
    return 200;
  }

  static int logMessage(const mg_connection*, const char* message) {
    CLEAVE_LOG(DEBUG) << "http: " << message;
    return 1;
  }
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  if (options.threads < 1 || options.threads > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP threads must be in 1..4096, got ", options.threads));
  }
  // Reference-counted; once per process is enough.
  static const bool initialized = (mg_init_library(MG_FEATURES_DEFAULT), true);
  (void)initialized;
  const std::string& ports = options.listen;
  const std::string threads = std::to_string(options.threads);
  std::vector<const char*> config = {
      "listening_ports",   ports.c_str(), "num_threads", threads.c_str(),
      "enable_keep_alive", "yes",         "tcp_nodelay", "1"};
  config.push_back(nullptr);

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->handler_ = std::move(handler);
  server->max_body_bytes_ = options.max_body_bytes;
  server->error_headers_ = options.error_headers;
  mg_callbacks callbacks{};
  callbacks.log_message = &HttpServerAccess::logMessage;
  char error[256] = {};
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = server.get();
  init.configuration_options = config.data();
  mg_error_data error_data{};
  error_data.text = error;
  error_data.text_buffer_size = sizeof(error);
  server->context_ = mg_start2(&init, &error_data);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", options.listen, " (", error,
                                               "); the port may be in use or the address "
                                               "malformed: pass another host:port (port 0 picks "
                                               "a free one)"));
  }
  mg_set_request_handler(server->context_, "/", &HttpServerAccess::handle, server.get());
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(server->context_, 4, bound);
  if (n <= 0) return absl::UnavailableError(absl::StrCat("HTTP on ", options.listen, ": no port"));
  server->port_ = bound[0].port;
  return server;
}

HttpServer::~HttpServer() {
  if (context_ != nullptr) mg_stop(context_);
}

}  // namespace cleave
