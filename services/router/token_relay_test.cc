#include "services/router/token_relay.h"

#include <gtest/gtest.h>

namespace cleave::router {
namespace {

v1::SequenceEvent event(std::vector<uint32_t> tokens, uint64_t batch_wait_us = 0) {
  v1::SequenceEvent e;
  e.set_request_id("r");
  for (uint32_t t : tokens) {
    e.add_token_ids(t);
    e.add_logprobs()->set_logprob(-0.5f * static_cast<float>(t));
  }
  e.set_batch_wait_us(batch_wait_us);
  return e;
}

// Events that queue up while the request's thread writes come out as one, in order, up to the
// one that finishes the sequence.
TEST(MailboxTest, QueuedEventsComeAsOneUpToTheFinish) {
  Mailbox mailbox;
  EXPECT_FALSE(mailbox.next(std::chrono::milliseconds(1)).has_value());
  mailbox.push(event({7}, 250));
  mailbox.push(event({8, 9}));
  v1::SequenceEvent last = event({10});
  last.set_finish_reason(v1::FINISH_REASON_STOP_STRING);
  last.set_matched_stop("</s>");
  mailbox.push(last);
  mailbox.push(event({11}));  // Past the finish: not merged into it.

  auto first = mailbox.next(std::chrono::milliseconds(1));
  ASSERT_TRUE(first.has_value() && first->ok());
  const v1::SequenceEvent& merged = **first;
  EXPECT_EQ(std::vector<uint32_t>(merged.token_ids().begin(), merged.token_ids().end()),
            (std::vector<uint32_t>{7, 8, 9, 10}));
  ASSERT_EQ(merged.logprobs_size(), 4);
  EXPECT_FLOAT_EQ(merged.logprobs(1).logprob(), -4.0f);
  EXPECT_FLOAT_EQ(merged.logprobs(3).logprob(), -5.0f);
  EXPECT_EQ(merged.batch_wait_us(), 250u);
  EXPECT_EQ(merged.finish_reason(), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(merged.matched_stop(), "</s>");

  auto rest = mailbox.next(std::chrono::milliseconds(1));
  ASSERT_TRUE(rest.has_value() && rest->ok());
  EXPECT_EQ((*rest)->token_ids_size(), 1);
  EXPECT_EQ((*rest)->token_ids(0), 11u);
  EXPECT_FALSE((*rest)->has_finish_reason());

  // A failure comes after the events queued before it.
  mailbox.push(event({12}));
  mailbox.fail(absl::UnavailableError("worker left"));
  auto before = mailbox.next(std::chrono::milliseconds(1));
  ASSERT_TRUE(before.has_value() && before->ok());
  EXPECT_EQ((*before)->token_ids(0), 12u);
  auto failed = mailbox.next(std::chrono::milliseconds(1));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace cleave::router
