// Time to open a model: map the file and parse its metadata and tensor directory (no
// weight bytes are read), and to dequantize one layer's weights to float.
// Run: build/default/bin/bench_model_open [--benchmark_repetitions=5]
// The model defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf; override with CLEAVE_MODEL.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/model/gguf_file.h"
#include "common/model/model_config.h"

namespace {

std::string modelPath() {
  const char* env = std::getenv("CLEAVE_MODEL");
  return env ? env : std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

void BM_OpenGguf(benchmark::State& state) {
  std::string path = modelPath();
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("model file missing; run scripts/install-deps.sh or set CLEAVE_MODEL");
    return;
  }
  for (auto _ : state) {
    auto file = cleave::model::GgufFile::open(path);
    if (!file.ok()) {
      state.SkipWithError(std::string(file.status().message()).c_str());
      return;
    }
    auto config = cleave::model::configFromGguf(**file);
    benchmark::DoNotOptimize(config);
  }
}

void BM_DequantizeLayer0(benchmark::State& state) {
  auto file = cleave::model::GgufFile::open(modelPath());
  if (!file.ok()) {
    state.SkipWithError("model file missing");
    return;
  }
  std::vector<const cleave::model::GgufTensor*> layer;
  uint64_t elements = 0;
  for (const auto& t : (*file)->tensors()) {
    if (t.name.rfind("blk.0.", 0) == 0) {
      layer.push_back(&t);
      elements += t.num_elements;
    }
  }
  std::vector<float> out(elements);
  uint64_t bytes = 0;
  for (auto _ : state) {
    float* dst = out.data();
    for (const auto* t : layer) {
      (void)cleave::model::dequantize(t->type, t->data, t->num_elements, dst);
      dst += t->num_elements;
      bytes += t->num_bytes;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["elements"] = static_cast<double>(elements);
}

BENCHMARK(BM_OpenGguf)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DequantizeLayer0)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
