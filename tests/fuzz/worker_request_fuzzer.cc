// libFuzzer target: a PrefillRequest as a worker receives it (any bytes parsed as the
// message) turned into an engine request; when the worker accepts it, the engine's sampler
// and stop checker run it for a few steps over logits taken from the input.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "services/engine/sampler.h"
#include "services/engine/stop_checker.h"
#include "services/worker/request_conversion.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cleave::v1::PrefillRequest request;
  if (size == 0 || !request.ParseFromArray(data, static_cast<int>(size))) return 0;
  constexpr uint32_t kVocab = 64;
  for (uint32_t id : request.prompt_token_ids()) {
    if (id >= kVocab) return 0;  // The worker checks ids against the vocabulary first.
  }
  auto engine_request = cleave::worker::toEngineRequest(1, cleave::worker::partsOf(request), {2},
                                                        /*context_length=*/256);
  if (!engine_request.ok()) return 0;
  cleave::engine::Sampler sampler(engine_request->sampling, engine_request->prompt);
  cleave::engine::StopChecker stopper(engine_request->stop);
  std::vector<float> logits(kVocab);
  for (int step = 0; step < 4; ++step) {
    for (uint32_t i = 0; i < kVocab; ++i) {
      logits[i] = static_cast<float>(data[(i + step) % size]) / 16.0f - 8.0f;
    }
    const cleave::engine::SampledToken token = sampler.sample(logits);
    if (token.token >= kVocab || std::isnan(token.logprob)) __builtin_trap();
    (void)stopper.push(token.token, std::string(1, static_cast<char>('a' + token.token % 26)));
    if (stopper.stopped()) break;
  }
  return 0;
}
