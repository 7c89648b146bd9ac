#include "services/router/response_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace cleave::router {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

Json item(const std::string& id) { return Json{{"id", id}, {"type", "message"}}; }

// A response of `id` continuing `previous`, with one input and one output item.
ResponseStore::Response turn(const std::string& id, const std::string& previous,
                             const std::string& owner = "Bearer k") {
  return {.owner = owner,
          .previous = previous,
          .input = Json::array({item("in-" + id)}),
          .response = Json{{"id", id}, {"output", Json::array({item("out-" + id)})}}};
}

std::vector<std::string> ids(const Json& items) {
  std::vector<std::string> out;
  for (const Json& i : items) out.push_back(i["id"]);
  return out;
}

TEST(ResponseStoreTest, AChainIsItsTurnsOldestFirst) {
  ResponseStore store(1 << 20);
  store.put("a", turn("a", ""));
  store.put("b", turn("b", "a"));
  store.put("c", turn("c", "b"));
  store.put("other", turn("other", "a"));  // A branch from the same turn.
  auto history = store.history("c", "Bearer k");
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(ids(*history),
            (std::vector<std::string>{"in-a", "out-a", "in-b", "out-b", "in-c", "out-c"}));
  EXPECT_EQ(ids(*store.history("other", "Bearer k")),
            (std::vector<std::string>{"in-a", "out-a", "in-other", "out-other"}));
  auto got = store.get("b", "Bearer k");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->response["id"], "b");
  EXPECT_EQ(got->previous, "a");
}

TEST(ResponseStoreTest, AResponseIsOnlyItsOwnersToSeeContinueOrDelete) {
  ResponseStore store(1 << 20);
  store.put("a", turn("a", "", "Bearer one"));
  EXPECT_FALSE(store.get("a", "Bearer two").has_value());
  EXPECT_FALSE(store.get("a", "").has_value());
  EXPECT_EQ(store.history("a", "Bearer two").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store.erase("a", "Bearer two"));
  EXPECT_TRUE(store.get("a", "Bearer one").has_value());
  EXPECT_TRUE(store.erase("a", "Bearer one"));
  EXPECT_FALSE(store.get("a", "Bearer one").has_value());
  EXPECT_FALSE(store.erase("a", "Bearer one"));
  EXPECT_EQ(store.bytes(), 0);
}

TEST(ResponseStoreTest, TheLeastRecentlyUsedGoPastTheLimitAndAChainSaysWhatIsMissing) {
  const int64_t one = [] {  // The largest of the turns below.
    ResponseStore probe(1 << 20);
    probe.put("r1", turn("r1", "r0"));
    return probe.bytes();
  }();
  ResponseStore store(3 * one + 10);  // Three turns fit, not four.
  store.put("r0", turn("r0", ""));
  store.put("r1", turn("r1", "r0"));
  store.put("r2", turn("r2", "r1"));
  ASSERT_TRUE(store.get("r2", "Bearer k").has_value());
  ASSERT_TRUE(store.history("r1", "Bearer k").ok());  // r0 and r1 used: r2 is the oldest.
  store.put("r3", turn("r3", ""));
  EXPECT_FALSE(store.get("r2", "Bearer k").has_value());
  EXPECT_TRUE(store.get("r0", "Bearer k").has_value());  // r1 is the oldest now.
  store.put("r4", turn("r4", ""));
  EXPECT_FALSE(store.get("r1", "Bearer k").has_value());
  EXPECT_TRUE(store.get("r3", "Bearer k").has_value());
  EXPECT_LE(store.bytes(), 3 * one + 10);
  store.put("r6", turn("r6", "r1"));
  auto broken = store.history("r6", "Bearer k");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(broken.status().message(), HasSubstr("'r1', an earlier turn of 'r6'"));
  EXPECT_THAT(store.history("gone", "Bearer k").status().message(),
              HasSubstr("no stored response 'gone'"));

  // One larger than the whole store is not kept, and evicts nothing.
  ResponseStore::Response big = turn("big", "");
  big.response["text"] = std::string(4 * one, 'x');
  const int64_t before = store.bytes();
  store.put("big", big);
  EXPECT_FALSE(store.get("big", "Bearer k").has_value());
  EXPECT_EQ(store.bytes(), before);
}

TEST(ResponseStoreTest, ReplacingAnIdCountsItOnceAndALoopEnds) {
  ResponseStore store(1 << 20);
  store.put("x", turn("x", ""));
  const int64_t one = store.bytes();
  store.put("x", turn("x", ""));
  EXPECT_EQ(store.bytes(), one);
  store.put("y", turn("y", "x"));
  store.put("x", turn("x", "y"));  // Only a replaced id can make a loop.
  EXPECT_EQ(store.history("x", "Bearer k").status().code(), absl::StatusCode::kNotFound);
}

// Random puts, gets, erases and chains: the byte count is what the entries hold, never
// past the limit, and every chain read either whole or NotFound.
TEST(ResponseStoreTest, RandomUseKeepsTheCountAndTheLimit) {
  std::mt19937 rng(7);
  ResponseStore store(20000);
  for (int i = 0; i < 3000; ++i) {
    const std::string id = "r" + std::to_string(rng() % 40);
    const std::string prev = rng() % 3 == 0 ? "" : "r" + std::to_string(rng() % 40);
    switch (rng() % 4) {
      case 0:
      case 1: {
        ResponseStore::Response r = turn(id, prev == id ? "" : prev);
        r.response["pad"] = std::string(rng() % 2000, 'p');
        store.put(id, r);
        break;
      }
      case 2: store.erase(id, "Bearer k"); break;
      default: {
        auto history = store.history(id, "Bearer k");
        if (history.ok()) {
          ASSERT_FALSE(history->empty());
          EXPECT_EQ(history->back()["id"], "out-" + id);
        } else {
          EXPECT_EQ(history.status().code(), absl::StatusCode::kNotFound);
        }
      }
    }
    ASSERT_LE(store.bytes(), 20000);
    ASSERT_GE(store.bytes(), 0);
  }
  for (int i = 0; i < 40; ++i) store.erase("r" + std::to_string(i), "Bearer k");
  EXPECT_EQ(store.bytes(), 0);
}

}  // namespace
}  // namespace cleave::router

namespace cleave::router {
namespace {

// A response of many small values (logprobs) is kept as its text and counted by it: read back
// equal, a stored string's invalid UTF-8 replaced.
TEST(ResponseStoreTest, AResponseIsKeptAsItsTextAndReadBackEqual) {
  nlohmann::json logprobs = nlohmann::json::array();
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    logprobs.push_back({{"token", std::string(1, static_cast<char>('a' + rng() % 26))},
                        {"logprob", -static_cast<double>(rng() % 1000) / 100},
                        {"bytes", nlohmann::json::array({97 + static_cast<int>(rng() % 26)})}});
  }
  ResponseStore::Response r = turn("r", "");
  r.response["output"][0]["logprobs"] = logprobs;
  const std::string text = r.response.dump();
  ResponseStore store(int64_t{1} << 20);
  store.put("r", r);
  EXPECT_GE(store.bytes(), static_cast<int64_t>(text.size()));
  EXPECT_LE(store.bytes(), static_cast<int64_t>(text.size()) + 1024);
  std::optional<ResponseStore::Response> back = store.get("r", "Bearer k");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->response, r.response);
  EXPECT_EQ(back->input, r.input);
  EXPECT_EQ(back->owner, "Bearer k");
  ResponseStore::Response bad = turn("b", "r");
  bad.response["output"][0]["text"] = std::string("ok \xff\xfe");
  store.put("b", bad);
  back = store.get("b", "Bearer k");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->response["output"][0]["text"], "ok \xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(back->previous, "r");
}

}  // namespace
}  // namespace cleave::router
