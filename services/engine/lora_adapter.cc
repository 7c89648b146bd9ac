#include "services/engine/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model/fingerprint.h"
#include "common/model/json_fields.h"
#include "common/model/safetensors_file.h"
#include "common/status_macros.h"

namespace cleave::engine {
namespace {

constexpr const char* kTargetNames[kLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

std::optional<LoraTarget> targetNamed(absl::string_view name) {
  for (int t = 0; t < kLoraTargets; ++t) {
    if (name == kTargetNames[t]) return static_cast<LoraTarget>(t);
  }
  return std::nullopt;
}

bool rowParallel(LoraTarget t) { return t == LoraTarget::kO || t == LoraTarget::kDown; }
bool mlp(LoraTarget t) {
  return t == LoraTarget::kGate || t == LoraTarget::kUp || t == LoraTarget::kDown;
}

// The projection's whole [out, in] and the part of its split dimension (out for
// column-parallel, in for row-parallel) this rank holds.
struct ProjectionShape {
  int64_t out = 0, in = 0;
  Span part;
};

ProjectionShape shapeOf(LoraTarget t, const LlamaWeights& base) {
  const model::ModelConfig& c = base.config;
  const int64_t hd = c.head_dim;
  const Span heads{base.dims.heads.begin * hd, base.dims.heads.size * hd};
  const Span kv{base.dims.kv_heads.begin * hd, base.dims.kv_heads.size * hd};
  switch (t) {
    case LoraTarget::kQ: return {int64_t{c.num_heads} * hd, c.hidden_size, heads};
    case LoraTarget::kK:
    case LoraTarget::kV: return {int64_t{c.num_kv_heads} * hd, c.hidden_size, kv};
    case LoraTarget::kO: return {c.hidden_size, int64_t{c.num_heads} * hd, heads};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {c.intermediate_size, c.hidden_size, base.dims.ffn};
    case LoraTarget::kDown: return {c.hidden_size, c.intermediate_size, base.dims.ffn};
  }
  return {};
}

// The float32 values of a tensor of `rows` x `cols`, or an error naming it.
absl::StatusOr<std::vector<float>> readMatrix(const model::SafetensorsTensor& t, int64_t rows,
                                              int64_t cols, const std::string& file) {
  if (t.shape.size() != 2 || static_cast<int64_t>(t.shape[0]) != rows ||
      static_cast<int64_t>(t.shape[1]) != cols) {
    std::string got;
    for (uint64_t d : t.shape) absl::StrAppend(&got, got.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", t.name, " has shape [", got,
                                                   "], the model needs [", rows, ", ", cols, "]"));
  }
  if (t.dtype != model::TensorType::kF32 && t.dtype != model::TensorType::kF16 &&
      t.dtype != model::TensorType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", t.name, " is ",
                                                   model::tensorTypeName(t.dtype),
                                                   "; adapter weights must be F32, F16 or BF16"));
  }
  std::vector<float> out(rows * cols);
  CLEAVE_RETURN_IF_ERROR(model::dequantize(t.dtype, t.data, out.size(), out.data()));
  for (float v : out) {
    if (!std::isfinite(v))
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", t.name, " holds NaN or Inf"));
  }
  return out;
}

// A [r, in] and B [out, r] (this rank's parts) as a projection's update.
LoraProjection projection(std::vector<float> a, int64_t r, int64_t in,
                          const std::vector<float>& b) {
  const int64_t out = static_cast<int64_t>(b.size()) / r;
  std::vector<float> bt(b.size());
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < r; ++i) bt[i * out + o] = b[o * r + i];
  }
  return LoraProjection{.r = r, .in = in, .out = out, .a = std::move(a), .bt = std::move(bt)};
}

// llama.cpp's converter reorders the Q and K rows of "llama" GGUF files within each head so
// that RoPE pairs adjacent values (row 2j + s holds Hugging Face row s * head_dim / 2 + j);
// an adapter's B rows for them must follow.
std::vector<float> permuteForAdjacentRope(const std::vector<float>& b, int64_t out, int64_t r,
                                          int64_t head_dim) {
  std::vector<float> permuted(b.size());
  const int64_t half = head_dim / 2;
  for (int64_t row = 0; row < out; ++row) {
    const int64_t head = row / head_dim, within = row % head_dim;
    const int64_t from = head * head_dim + (within % 2) * half + within / 2;
    std::copy_n(b.data() + from * r, r, permuted.data() + row * r);
  }
  return permuted;
}

// Config fields this loader refuses unless they are unset, false, or empty.
absl::Status refuseUnsupported(const nlohmann::json& config, const std::string& file) {
  struct Refused {
    const char* field;
    const char* why;
  };
  constexpr Refused kRefused[] = {
      {"use_dora", "DoRA adapters are not supported"},
      {"fan_in_fan_out", "fan_in_fan_out (GPT-2 style Conv1D layers) is not supported"},
      {"rank_pattern", "per-module ranks are not supported"},
      {"alpha_pattern", "per-module alphas are not supported"},
      {"modules_to_save", "fully trained modules (modules_to_save) are not supported"},
      {"layer_replication", "layer replication is not supported"},
      {"lora_bias", "trained biases are not supported"},
      {"trainable_token_indices", "trained token embeddings are not supported"},
      {"target_parameters", "adapters on parameters (experts) are not supported"},
  };
  for (const Refused& r : kRefused) {
    auto it = config.find(r.field);
    if (it == config.end() || it->is_null() || *it == false || (it->is_object() && it->empty()) ||
        (it->is_array() && it->empty())) {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", r.field, " is ", it->dump(), ": ", r.why));
  }
  return absl::OkStatus();
}

}  // namespace

const char* loraTargetName(LoraTarget target) { return kTargetNames[static_cast<int>(target)]; }

int64_t LoraAdapter::bytes() const {
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const auto& p : layer) {
      if (p) total += p->r * (p->in + p->out) * 4;
    }
  }
  return total;
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> loadLoraAdapter(const std::string& name,
                                                                   const std::string& folder,
                                                                   const LlamaWeights& base) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(folder) / "adapter_config.json").string();
  const std::string weights_path = (fs::path(folder) / "adapter_model.safetensors").string();
  std::ifstream in(config_path);
  if (!in.good()) {
    return absl::NotFoundError(
        absl::StrCat("LoRA adapter '", name, "': cannot read ", config_path,
                     " (a folder as PEFT's save_pretrained writes it: adapter_config.json and "
                     "adapter_model.safetensors)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (!config.is_object())
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  const model::JsonFields f(config, config_path);
  CLEAVE_ASSIGN_OR_RETURN(const std::string peft_type, f.stringOr("peft_type", "LORA"));
  if (peft_type != "LORA") {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": peft_type is \"", peft_type, "\"; only LORA adapters run"));
  }
  CLEAVE_RETURN_IF_ERROR(refuseUnsupported(config, config_path));
  CLEAVE_ASSIGN_OR_RETURN(const std::string bias, f.stringOr("bias", "none"));
  if (bias != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": bias is \"", bias, "\"; trained biases are not supported"));
  }
  CLEAVE_ASSIGN_OR_RETURN(const uint32_t r, f.uint("r"));
  if (r == 0) return f.error("r", "must be at least 1");
  CLEAVE_ASSIGN_OR_RETURN(const double alpha, f.numberOr("lora_alpha", 8.0));
  CLEAVE_ASSIGN_OR_RETURN(const bool rslora, f.boolOr("use_rslora", false));
  if (const nlohmann::json* targets = f.get("target_modules"); targets && targets->is_array()) {
    for (const nlohmann::json& t : *targets) {
      if (!t.is_string() || !targetNamed(t.get<std::string>())) {
        return f.error("target_modules", absl::StrCat("names ", t.dump(), "; adapters may target ",
                                                      absl::StrJoin(kTargetNames, ", ")));
      }
    }
  }
  if (base.config.mla) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapter '", name,
                                                   "': the model uses multi-head latent attention, "
                                                   "which adapters do not run on"));
  }
  if (!fs::exists(weights_path)) {
    const bool bin = fs::exists(fs::path(folder) / "adapter_model.bin");
    return absl::NotFoundError(absl::StrCat(
        "LoRA adapter '", name, "': ", weights_path, " is missing",
        bin ? " (adapter_model.bin is there: save it with safe_serialization=True, or convert "
              "it with safetensors' torch.save_file)"
            : ""));
  }
  CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<model::SafetensorsFile> file,
                          model::SafetensorsFile::open(weights_path));

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->folder = folder;
  CLEAVE_ASSIGN_OR_RETURN(adapter->sha256, model::filesSha256({config_path, weights_path}));
  adapter->rank = r;
  adapter->scale = static_cast<float>(
      alpha / (rslora ? std::sqrt(static_cast<double>(r)) : static_cast<double>(r)));
  adapter->layers.resize(base.layers.size());

  // Tensors: base_model.model.model.layers.L.{self_attn,mlp}.X_proj.lora_{A,B}.weight.
  struct Pair {
    const model::SafetensorsTensor* a = nullptr;
    const model::SafetensorsTensor* b = nullptr;
  };
  std::map<std::pair<int64_t, int>, Pair> pairs;
  for (const model::SafetensorsTensor& t : file->tensors()) {
    const std::vector<absl::string_view> parts = absl::StrSplit(t.name, '.');
    int64_t layer = -1;
    std::optional<LoraTarget> target;
    const bool shaped =
        parts.size() == 9 && parts[0] == "base_model" && parts[1] == "model" &&
        parts[2] == "model" && parts[3] == "layers" && absl::SimpleAtoi(parts[4], &layer) &&
        parts[8] == "weight" && (parts[7] == "lora_A" || parts[7] == "lora_B") &&
        (target = targetNamed(parts[6])) && parts[5] == (mlp(*target) ? "mlp" : "self_attn");
    if (!shaped) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor ", t.name,
                       " is not a LoRA update of a layer's q/k/v/o/gate/up/down projection "
                       "(base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight, ...)"));
    }
    if (layer < 0 || layer >= static_cast<int64_t>(base.layers.size())) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": tensor ", t.name,
                                                     " is past the model's ", base.layers.size(),
                                                     " layers"));
    }
    if (mlp(*target) && base.layers[layer].moe) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor ", t.name, " adapts the MLP of layer ", layer,
                       ", a mixture-of-experts layer; adapters may target only its attention"));
    }
    Pair& pair = pairs[{layer, static_cast<int>(*target)}];
    (parts[7] == "lora_A" ? pair.a : pair.b) = &t;
  }
  for (const auto& [key, pair] : pairs) {
    const auto [layer, t] = key;
    const LoraTarget target = static_cast<LoraTarget>(t);
    if (pair.a == nullptr || pair.b == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": layer ", layer, " ", kTargetNames[t], " has lora_",
                       pair.a ? "A" : "B", " without lora_", pair.a ? "B" : "A"));
    }
    const ProjectionShape shape = shapeOf(target, base);
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> a, readMatrix(*pair.a, r, shape.in, weights_path));
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> b, readMatrix(*pair.b, shape.out, r, weights_path));
    for (float& v : b) v *= adapter->scale;
    if (base.gguf && base.rope_pairing == cpu::RopePairing::kAdjacent &&
        (target == LoraTarget::kQ || target == LoraTarget::kK)) {
      b = permuteForAdjacentRope(b, shape.out, r, base.config.head_dim);
    }
    // This rank's part: B's rows of a column-parallel projection, A's columns of a
    // row-parallel one.
    if (rowParallel(target)) {
      std::vector<float> part(int64_t{r} * shape.part.size);
      for (int64_t i = 0; i < r; ++i) {
        std::copy_n(a.data() + i * shape.in + shape.part.begin, shape.part.size,
                    part.data() + i * shape.part.size);
      }
      adapter->layers[layer][t] = projection(std::move(part), r, shape.part.size, b);
    } else {
      std::vector<float> part(b.begin() + shape.part.begin * r,
                              b.begin() + (shape.part.begin + shape.part.size) * r);
      adapter->layers[layer][t] = projection(std::move(a), r, shape.in, part);
    }
  }
  if (pairs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights_path, ": no LoRA tensors (lora_A / lora_B weights)"));
  }
  return std::shared_ptr<const LoraAdapter>(std::move(adapter));
}

absl::StatusOr<std::vector<LoraModuleSpec>> parseLoraModules(const std::string& text) {
  std::vector<LoraModuleSpec> specs;
  std::set<std::string> names;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t eq = entry.find('=');
    const absl::string_view name = eq == absl::string_view::npos ? "" : entry.substr(0, eq);
    const absl::string_view path = eq == absl::string_view::npos ? "" : entry.substr(eq + 1);
    const bool name_ok =
        !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
          return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/' || c == ':';
        });
    if (!name_ok || path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--lora-modules: '", entry,
          "' is not NAME=PATH (a name of letters, digits and ._-/: and an adapter folder)"));
    }
    if (!names.insert(std::string(name)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora-modules: the name '", name, "' appears twice"));
    }
    specs.push_back({std::string(name), std::string(path)});
  }
  return specs;
}

}  // namespace cleave::engine
