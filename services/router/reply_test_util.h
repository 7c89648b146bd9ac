// Test helpers for the chat-path APIs and their renderers (reply_renderer.h): a call's chat
// messages, the Generate messages that feed a ResponseBuilder, and the named events
// ("event: T" + "data: {...}") of a stream and their types.
#pragma once

#include <string>
#include <vector>

#include "cleave/v1/generation.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/openai_requests.h"
#include "services/router/openai_responses.h"

namespace cleave::router::openai {

using Json = nlohmann::json;

// The chat messages of a call, with their other fields (tool calls, ids).
inline Json chatMessages(const Call& call) {
  Json messages = Json::array();
  for (const v1::ChatMessage& m : call.request.chat().messages()) {
    Json one{{"role", m.role()}, {"content", m.content()}};
    if (!m.fields_json().empty()) one.update(Json::parse(m.fields_json()));
    messages.push_back(std::move(one));
  }
  return messages;
}

// A message carrying `text`.
inline v1::GenerateResponse piece(const std::string& text) {
  v1::GenerateResponse m;
  m.set_text(text);
  return m;
}

// The final message: `text`, ending for `reason`; 11 prompt tokens (4 cached), 5 generated.
inline v1::GenerateResponse last(const std::string& text, v1::FinishReason reason) {
  v1::GenerateResponse m = piece(text);
  v1::FinalInfo& f = *m.mutable_final();
  f.set_finish_reason(reason);
  f.mutable_usage()->set_prompt_tokens(11);
  f.mutable_usage()->set_cached_prompt_tokens(4);
  f.mutable_usage()->set_completion_tokens(5);
  return m;
}

// The events of a stream: each {"event", "data"}, checked as the API frames them.
inline std::vector<Json> events(const std::string& stream) {
  std::vector<Json> out;
  size_t at = 0;
  while (at < stream.size()) {
    const size_t end = stream.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    const std::string frame = stream.substr(at, end - at);
    at = end + 2;
    const size_t newline = frame.find('\n');
    EXPECT_TRUE(frame.starts_with("event: ")) << frame;
    EXPECT_EQ(frame.substr(newline + 1, 6), "data: ") << frame;
    const Json data = Json::parse(frame.substr(newline + 7));
    EXPECT_EQ(data["type"], frame.substr(7, newline - 7));
    out.push_back(data);
  }
  return out;
}

inline std::vector<std::string> types(const std::vector<Json>& events) {
  std::vector<std::string> out;
  for (const Json& e : events) out.push_back(e["type"]);
  return out;
}

// A reply rendered whole (`body`) and streamed (`events`).
struct Rendered {
  Json body;
  std::vector<Json> events;
};

// `call`'s reply fed as `pieces` (the first carrying 11 prompt token ids, 4 of them cached,
// as last() reports) then `end`,
// through a builder and a renderer from `make()`, whole and streamed.
template <typename Make>
Rendered renderReply(Call call, Make make, const std::vector<std::string>& pieces,
                     const v1::GenerateResponse& end) {
  Rendered out;
  for (const bool stream : {false, true}) {
    call.stream = stream;
    ResponseBuilder reply(call, "id_1", "m", 5);
    auto renderer = make();
    std::string text = stream ? renderer->started() : "";
    for (size_t i = 0; i < pieces.size(); ++i) {
      v1::GenerateResponse message = piece(pieces[i]);
      for (uint32_t t = 1; i == 0 && t <= 11; ++t) message.add_prompt_token_ids(t);
      if (i == 0) message.set_cached_prompt_tokens(4);
      EXPECT_EQ(reply.add(message), "");  // The builder makes no chat events here.
      if (stream) text += renderer->progress(reply);
    }
    reply.add(end);
    if (stream) {
      out.events = events(text + renderer->finished(reply));
    } else {
      out.body = renderer->body(reply);
    }
  }
  return out;
}

}  // namespace cleave::router::openai
