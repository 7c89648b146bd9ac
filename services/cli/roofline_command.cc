// `cleave roofline --model PATH_OR_NAME --hardware HW`: the floor of a decode step and of a
// prefill chunk, term by term, and the tokens/s ceiling they allow (services/roofline).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/model/gguf_file.h"
#include "services/cli/commands.h"
#include "services/roofline/cpu_hardware.h"
#include "services/roofline/roofline.h"

namespace cleave::cli {
namespace {

// A path, or the name of a shape in deploy/models/ (from here or from the source tree).
std::string resolveModel(const std::string& name) {
  if (std::filesystem::exists(name)) return name;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  for (const std::filesystem::path& root :
       {std::filesystem::current_path(),
        exe.parent_path().parent_path().parent_path().parent_path()}) {
    const std::filesystem::path candidate = root / "deploy" / "models" / name;
    if (std::filesystem::exists(candidate)) return candidate.string();
  }
  return name;
}

// Bytes per weight and whether products run on int8 (CPU), by stored format.
absl::StatusOr<std::pair<double, bool>> weightFormat(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return std::pair{2.0, false};
  if (dtype == "fp8") return std::pair{1.0 + 4.0 / (128 * 128), false};  // + block scales
  if (dtype == "fp4" || dtype == "nvfp4") return std::pair{0.5 + 1.0 / 16, false};  // + scales
  if (dtype == "f32") return std::pair{4.0, false};
  if (dtype == "q8_0") return std::pair{34.0 / 32, true};
  if (dtype == "q4_0") return std::pair{18.0 / 32, true};
  if (dtype == "q4_1") return std::pair{20.0 / 32, true};
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype must be one of bf16, fp8, fp4, f32, q8_0, q4_0, q4_1; got '", dtype, "'"));
}

}  // namespace

int runRoofline(int argc, char** argv) {
  std::string model, hardware = "cpu", dtype, kv_dtype = "bf16";
  int64_t tp = 1, concurrency = 16, context = 4096, prefill = 2048, threads = 0;
  FlagSet flags("cleave roofline", "--model PATH_OR_NAME [flags]",
                "Prints the physical floor of a decode step and of a prefill chunk, term by "
                "term (weight and KV bytes, FLOPs, collectives), and the tokens/s ceiling.");
  flags.addString("model", &model,
                  "A GGUF file, a folder with config.json, or a name in deploy/models/");
  flags.addString("hardware", &hardware,
                  "rtx-pro-6000, rtx-5090, h100, h200, b200, or cpu (measured on the spot)");
  flags.addString("dtype", &dtype,
                  "Stored weight format: bf16, fp8, fp4 (GPU); f32, q8_0, q4_0, q4_1 (CPU). "
                  "Default: fp4 on Blackwell (rtx-pro-6000, rtx-5090, b200), fp8 on Hopper (h100, "
                  "h200, which have no FP4 units), q4_1 on the CPU");
  flags.addString("kv-dtype", &kv_dtype, "KV element format: bf16, fp8 or f32");
  flags.addInt("tp", &tp, "Tensor-parallel degree (one GPU per rank)");
  flags.addInt("concurrency", &concurrency, "Sequences in a decode step");
  flags.addInt("context", &context, "Positions each decoding sequence attends over");
  flags.addInt("prefill-tokens", &prefill, "Tokens of the prefill chunk");
  flags.addInt("threads", &threads, "CPU threads for --hardware=cpu (0: all)");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (model.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--model is required"));
  if (!positional.empty() || tp < 1 || concurrency < 1 || context < 0 || prefill < 1) {
    exitWithUsageError(
        flags, absl::InvalidArgumentError("--tp, --concurrency, --prefill-tokens must be >= 1"));
  }
  const bool cpu = hardware == "cpu";
  if (dtype.empty())
    dtype = cpu ? "q4_1" : hardware == "h100" || hardware == "h200" ? "fp8" : "fp4";
  absl::StatusOr<std::pair<double, bool>> format = weightFormat(dtype);
  if (!format.ok()) exitWithUsageError(flags, format.status());
  const double kv_bytes = kv_dtype == "f32" ? 4 : kv_dtype == "fp8" ? 1 : 2;
  absl::StatusOr<model::ModelConfig> config = model::loadModelConfig(resolveModel(model));
  if (!config.ok()) exitWithUsageError(flags, config.status());

  roofline::Hardware hw;
  if (cpu) {
    const int n = threads > 0 ? static_cast<int>(threads)
                              : static_cast<int>(std::thread::hardware_concurrency());
    std::fprintf(stderr, "measuring this CPU with %d threads...\n", n);
    hw = roofline::measureCpuHardware(n, format->second, 3, int64_t{1} << 30, dtype == "bf16");
  } else {
    absl::StatusOr<roofline::Hardware> builtin = roofline::builtinHardware(
        hardware, dtype == "fp8" || dtype == "fp4" || dtype == "nvfp4" ? dtype : "bf16");
    if (!builtin.ok()) exitWithUsageError(flags, builtin.status());
    hw = *builtin;
  }
  std::printf("%s, %s weights, %s KV, on %s x %lld: %.0f GB/s and %.4g TFLOP/s per rank\n",
              model.c_str(), dtype.c_str(), kv_dtype.c_str(), hw.name.c_str(),
              static_cast<long long>(tp), hw.bandwidth / 1e9, hw.peak_flops / 1e12);
  struct Case {
    std::string name;
    roofline::Workload workload;
  };
  for (Case c :
       {Case{absl::StrFormat("decode step: %lld sequences x %lld positions",
                             static_cast<long long>(concurrency), static_cast<long long>(context)),
             roofline::decodeStep(concurrency, context, config->sliding_window)},
        Case{absl::StrFormat("prefill chunk: %lld tokens", static_cast<long long>(prefill)),
             roofline::prefillChunk(prefill, 0, config->sliding_window)}}) {
    c.workload.tp = static_cast<int>(tp);
    c.workload.bytes_per_weight = format->first;
    c.workload.bytes_per_kv = kv_bytes;
    absl::StatusOr<roofline::Terms> terms = roofline::stepFloor(*config, hw, c.workload);
    if (!terms.ok()) exitWithUsageError(flags, terms.status());
    std::printf("\n%s\n%s", c.name.c_str(), roofline::formatTerms(*terms, c.workload).c_str());
  }
  return 0;
}

}  // namespace cleave::cli
