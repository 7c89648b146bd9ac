#include "services/engine/cuda_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "absl/base/casts.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/model/mxfp4_as_nvfp4.h"
#include "common/model/tensor_type.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"

namespace cleave::engine {
namespace {

using bf16 = __nv_bfloat16;
using cuda::ExpertWeightFormat;
constexpr int64_t kFp8Block = 128;

int64_t codeBytes(ExpertWeightFormat f, int64_t rows, int64_t cols) {
  switch (f) {
    case ExpertWeightFormat::kBf16: return rows * cols * 2;
    case ExpertWeightFormat::kFp8Block128: return rows * cols;
    case ExpertWeightFormat::kNvfp4: return rows * cols / 2;
  }
  return 0;
}

// What the kernels need of K (the columns) in each format.
int64_t columnAlignment(ExpertWeightFormat f) {
  return f == ExpertWeightFormat::kFp8Block128 ? kFp8Block
         : f == ExpertWeightFormat::kNvfp4     ? 32
                                               : 1;
}

// The e4m3 byte of a value that is one (NVFP4 group scales are kept as exact floats): the
// 256 codes' values keyed by their float bits, looked up once per group.
absl::StatusOr<uint8_t> exactE4m3(float v) {
  static const absl::flat_hash_map<uint32_t, uint8_t> codes = [] {
    absl::flat_hash_map<uint32_t, uint8_t> map;
    for (int b = 0; b < 256; ++b) {
      const uint8_t byte = static_cast<uint8_t>(b);
      float value = 0.0f;
      CLEAVE_CHECK_OK(model::dequantize(model::TensorType::kF8E4M3, &byte, 1, &value));
      if (value == value) map[absl::bit_cast<uint32_t>(value)] = byte;  // NaN has no key.
    }
    return map;
  }();
  if (auto it = codes.find(absl::bit_cast<uint32_t>(v)); it != codes.end()) return it->second;
  return absl::InvalidArgumentError(
      absl::StrCat("an NVFP4 group scale ", v, " is not an e4m3 value"));
}

// Whether v is an e4m3 value: 0, or |v| <= 448 with at most 3 mantissa bits at an exponent
// of -6 or more, or k x 2^-9 for k in 1..7 (subnormals). Bit tests, for every group scale
// of a model at load.
bool isE4m3Value(float v) {
  const uint32_t bits = absl::bit_cast<uint32_t>(v) & 0x7fffffffu;
  if (bits == 0) return true;
  const float a = absl::bit_cast<float>(bits);
  if (!(a <= 448.0f)) return false;  // NaN too
  const int exponent = static_cast<int>(bits >> 23) - 127;
  if (exponent >= -6) return (bits & 0xfffffu) == 0;
  const float k = a * 512.0f;
  return k >= 1.0f && k <= 7.0f && k == static_cast<float>(static_cast<int>(k));
}

// Whether every group scale of a rows x cols slice is an e4m3 value, as the kernels keep
// them (checkpoints that store them as wider floats may hold others: those load as bf16).
bool groupScalesAreE4m3(const cpu::BlockScales& s, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 16; ++g) {
      if (!isE4m3Value(s.rowGroup(r, g))) return false;
    }
  }
  return true;
}

// A GGUF NVFP4 block's scale byte (unsigned e4m3, bit 7 ignored, 0x7F read as 0) as the
// e4m3 byte the kernels read; nullopt for 0xFF, whose 480 e4m3 cannot hold (no quantizer
// writes it).
std::optional<uint8_t> e4m3OfUe4m3(uint8_t byte) {
  if (byte == 0x7F) return 0;
  if ((byte & 0x7F) == 0x7F) return std::nullopt;
  return static_cast<uint8_t>(byte & 0x7F);
}

// Every scale byte of GGUF NVFP4 blocks as e4m3.
bool ggufScalesAreE4m3(const cpu::WeightMatrix& w) {
  const int64_t row_bytes = w.cols / 64 * 36;
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t b = 0; b < w.cols / 64; ++b) {
      const uint8_t* block = w.data + r * row_bytes + b * 36;
      for (int s = 0; s < 4; ++s) {
        if (!e4m3OfUe4m3(block[s])) return false;
      }
    }
  }
  return true;
}

// Says once per process that MXFP4 blocks were rounded (model::mxfp4AsNvfp4): the first
// matrix that had any.
void noteRoundedMxfp4(int64_t rounded, int64_t blocks, const char* what) {
  static std::atomic<bool> said{false};
  if (rounded == 0 || said.exchange(true)) return;
  CLEAVE_LOG(INFO) << what << ": " << rounded << " of " << blocks
                   << " MXFP4 blocks lie more than 17 exponents below their row's largest; "
                      "on the GPU their values are rounded to E2M1 at the smallest e4m3 scale "
                      "(each moves by at most 2^-10 of the row scale). Said once.";
}

}  // namespace

ExpertWeightFormat nativeFormat(const cpu::CpuMatrix& m) {
  const cpu::WeightMatrix& w = m.source();
  const cpu::BlockScales& s = w.scales;
  if (cpu::isNvfp4Rows(w) && groupScalesAreE4m3(s, m.rows(), m.cols()))
    return ExpertWeightFormat::kNvfp4;
  // llama.cpp's NVFP4 blocks: the same codes and scales, rearranged at upload.
  if (w.type == model::TensorType::kNVFP4 && w.data != nullptr && ggufScalesAreE4m3(w))
    return ExpertWeightFormat::kNvfp4;
  // MXFP4 (gpt-oss's experts): the same codes under e4m3 group and f32 row scales
  // (model::mxfp4AsNvfp4).
  if (w.type == model::TensorType::kMXFP4 && w.data != nullptr) return ExpertWeightFormat::kNvfp4;
  if (w.type == model::TensorType::kF8E4M3 && s.block_rows == kFp8Block &&
      s.block_cols == kFp8Block && s.global == 1.0f && s.row_offset % kFp8Block == 0 &&
      s.col_offset % kFp8Block == 0 && m.cols() % kFp8Block == 0)
    return ExpertWeightFormat::kFp8Block128;
  return ExpertWeightFormat::kBf16;
}

ExpertWeightFormat stackFormat(const std::vector<const cpu::CpuMatrix*>& parts) {
  const ExpertWeightFormat f = nativeFormat(*parts.front());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (nativeFormat(*parts[i]) != f) return ExpertWeightFormat::kBf16;
    const bool last = i + 1 == parts.size();
    if (f == ExpertWeightFormat::kFp8Block128 && !last && parts[i]->rows() % kFp8Block != 0)
      return ExpertWeightFormat::kBf16;
  }
  return f;
}

int64_t matrixBytes(ExpertWeightFormat f, int64_t rows, int64_t cols) {
  int64_t bytes = codeBytes(f, rows, cols);
  if (f == ExpertWeightFormat::kFp8Block128)
    bytes += (rows + kFp8Block - 1) / kFp8Block * (cols / kFp8Block) * 4;
  if (f == ExpertWeightFormat::kNvfp4) bytes += rows * (cols / 16 + 4);
  return bytes;
}

cuda::ExpertWeights placeWeights(Arena& arena, ExpertWeightFormat f, int64_t count, int64_t rows,
                                 int64_t cols) {
  cuda::ExpertWeights w{
      .format = f, .experts = static_cast<int>(count), .rows = rows, .cols = cols};
  w.data = arena.take<uint8_t>(count * codeBytes(f, rows, cols));
  if (f == ExpertWeightFormat::kFp8Block128)
    w.block_scales =
        arena.take<float>(count * ((rows + kFp8Block - 1) / kFp8Block) * (cols / kFp8Block));
  if (f == ExpertWeightFormat::kNvfp4) {
    w.group_scales = arena.take<uint8_t>(count * rows * cols / 16);
    w.row_scales = arena.take<float>(count * rows);
  }
  return w;
}

absl::Status uploadBytes(void* dst, const void* src, size_t bytes, const char* what) {
  return cuda::cudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                          absl::StrCat("uploading ", what));
}

absl::Status uploadBf16(const std::vector<float>& v, bf16* dst, const char* what) {
  std::vector<bf16> staged(v.size());
  for (size_t i = 0; i < v.size(); ++i) staged[i] = __float2bfloat16(v[i]);
  return uploadBytes(dst, staged.data(), staged.size() * sizeof(bf16), what);
}

absl::Status uploadF32(const std::vector<float>& v, float* dst, int64_t count, const char* what) {
  if (static_cast<int64_t>(v.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", v.size(), " values where the model takes ", count));
  }
  return uploadBytes(dst, v.data(), v.size() * sizeof(float), what);
}

absl::Status uploadDequantized(const cpu::CpuMatrix& m, bf16* dst, const char* what) {
  // A run of rows at a time (about 16 M values: 96 MB staged), so a large embedding table
  // (Gemma 3's 262k x 5376) is never whole on the host as floats.
  const int64_t cols = m.cols();
  const int64_t step = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(cols, 1));
  std::vector<float> values;
  for (int64_t row = 0; row < m.rows(); row += step) {
    const int64_t end = std::min(m.rows(), row + step);
    values.resize(static_cast<size_t>((end - row) * cols));
    CLEAVE_RETURN_IF_ERROR(cpu::dequantizeRows(m.source(), row, end, values.data()));
    CLEAVE_RETURN_IF_ERROR(uploadBf16(values, dst + row * cols, what));
  }
  return absl::OkStatus();
}

absl::Status uploadRows(const cpu::CpuMatrix& m, const cuda::ExpertWeights& dst, int64_t index,
                        int64_t first, const char* what) {
  const cpu::WeightMatrix& src = m.source();
  if (src.data == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(what, ": kept only in the CPU's layout"));
  const cpu::BlockScales& s = src.scales;
  const int64_t rows = m.rows(), cols = m.cols();
  if (cols != dst.cols || first + rows > dst.rows || index < 0 || index >= dst.experts ||
      (dst.format == ExpertWeightFormat::kFp8Block128 && first % kFp8Block != 0))
    return absl::InvalidArgumentError(absl::StrCat(what, ": does not fit its GPU matrix"));
  if (dst.format != ExpertWeightFormat::kBf16 &&
      (nativeFormat(m) != dst.format || cols % columnAlignment(dst.format) != 0))
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not stored as ", cuda::expertWeightFormatName(dst.format)));
  auto* base = static_cast<uint8_t*>(const_cast<void*>(dst.data)) +
               index * codeBytes(dst.format, dst.rows, dst.cols);
  switch (dst.format) {
    case ExpertWeightFormat::kBf16:
      return uploadDequantized(m, reinterpret_cast<bf16*>(base) + first * cols, what);
    case ExpertWeightFormat::kFp8Block128: {
      CLEAVE_RETURN_IF_ERROR(uploadBytes(base + first * cols, src.data, rows * cols, what));
      // The slice's blocks of its whole matrix's grid (offsets are whole blocks).
      const int64_t grid_cols = cols / kFp8Block, grid_rows = (rows + kFp8Block - 1) / kFp8Block;
      std::vector<float> scales(grid_rows * grid_cols);
      for (int64_t r = 0; r < grid_rows; ++r)
        for (int64_t c = 0; c < grid_cols; ++c)
          scales[r * grid_cols + c] =
              s.data[(s.row_offset / kFp8Block + r) * s.cols + s.col_offset / kFp8Block + c];
      float* grid =
          const_cast<float*>(dst.block_scales) +
          (index * ((dst.rows + kFp8Block - 1) / kFp8Block) + first / kFp8Block) * grid_cols;
      return uploadBytes(grid, scales.data(), scales.size() * 4, what);
    }
    case ExpertWeightFormat::kNvfp4: {
      model::Nvfp4Rows n;  // codes (empty: src.data as they are), group and row scales
      if (src.type == model::TensorType::kMXFP4) {
        n = model::mxfp4AsNvfp4(src.data, rows, cols);
        noteRoundedMxfp4(n.rounded_blocks, rows * cols / 32, what);
      } else if (src.type == model::TensorType::kNVFP4) {
        // value = e2m1 x ue4m3: the codes paired, the scale bytes as e4m3, no row scale.
        n.codes.resize(rows * cols / 2);
        n.scales.resize(rows * cols / 16);
        model::nvfp4AsE2M1(src.data, rows * cols, n.codes.data(), n.scales.data());
        for (uint8_t& g : n.scales) g = *e4m3OfUe4m3(g);  // nativeFormat checked each.
        n.row_scales.assign(rows, 1.0f);
      } else {
        n.scales.resize(rows * cols / 16);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t g = 0; g < cols / 16; ++g) {
            CLEAVE_ASSIGN_OR_RETURN(n.scales[r * (cols / 16) + g], exactE4m3(s.rowGroup(r, g)));
          }
        }
        n.row_scales.assign(rows, s.global);
      }
      CLEAVE_RETURN_IF_ERROR(uploadBytes(base + first * cols / 2,
                                         n.codes.empty() ? src.data : n.codes.data(),
                                         rows * cols / 2, what));
      CLEAVE_RETURN_IF_ERROR(uploadBytes(
          const_cast<uint8_t*>(dst.group_scales) + (index * dst.rows + first) * (cols / 16),
          n.scales.data(), n.scales.size(), what));
      return uploadBytes(const_cast<float*>(dst.row_scales) + index * dst.rows + first,
                         n.row_scales.data(), rows * 4, what);
    }
  }
  return absl::InternalError("unknown weight format");
}

}  // namespace cleave::engine
