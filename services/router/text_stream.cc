#include "services/router/text_stream.h"

namespace cleave::router {

TextStream::TextStream(const tokenizer::Tokenizer* tokenizer, const v1::StoppingCriteria& stopping,
                       bool skip_special_tokens)
    : stopper_({.stop_strings = {stopping.stop().begin(), stopping.stop().end()},
                .min_new_tokens = stopping.min_new_tokens()}),
      include_stop_(stopping.include_stop_str_in_output()) {
  if (tokenizer != nullptr) detokenizer_.emplace(*tokenizer, skip_special_tokens);
}

std::string TextStream::push(uint32_t token, std::optional<v1::FinishReason> finish) {
  if (!detokenizer_ || stopped_) return "";
  if (finish == v1::FINISH_REASON_STOP_TOKEN) {  // Its text is not returned.
    stopped_ = true;
    return stopper_.flush() + detokenizer_->finish();
  }
  std::string text = stopper_.push(token, detokenizer_->push(token));
  if (stopper_.stopped()) {
    stopped_ = true;
    return include_stop_ ? text + stopper_.matched() : text;
  }
  if (finish) {
    stopped_ = true;
    return text + stopper_.flush() + detokenizer_->finish();
  }
  return text;
}

std::string TextStream::end() {
  if (!detokenizer_ || stopped_) return "";
  stopped_ = true;
  return stopper_.flush() + detokenizer_->finish();
}

}  // namespace cleave::router
