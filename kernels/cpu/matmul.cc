#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/dequant_kernels.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/machine_peaks.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_layout.h"

namespace cleave::cpu {
namespace {

using model::TensorType;

bool isQuantized(TensorType type) {
  return type == TensorType::kQ4_0 || type == TensorType::kQ4_1 || type == TensorType::kQ8_0 ||
         type == TensorType::kMXFP4;
}

// Rows are split into a few tasks per thread, each a multiple of 16 rows (a packed group):
// enough tasks to balance threads, few enough that claiming them (an atomic shared by all
// threads) and short runs through memory do not cost more than the work.
constexpr int64_t kTasksPerThread = 4;
constexpr int64_t kRowAlign = 16;

bool takesScales(TensorType type) {
  return type == TensorType::kF8E4M3 || type == TensorType::kE2M1;
}

int64_t rowsPerTask(int64_t rows, int threads) {
  const int64_t groups = (rows + kRowAlign - 1) / kRowAlign;
  const int64_t tasks = std::min<int64_t>(groups, threads * kTasksPerThread);
  return (groups + tasks - 1) / tasks * kRowAlign;
}

// A block format without an int8 kernel of its own, rewritten once into one with: many
// times the speed of dequantizing every row in every product.
bool requantizedToQ8_0(TensorType type) {
  return type == TensorType::kQ5_0 || type == TensorType::kQ5_1 || type == TensorType::kQ5_K ||
         type == TensorType::kQ6_K;
}

struct Rewrite {
  TensorType type;
  std::shared_ptr<std::vector<uint8_t>> bytes;
};
absl::StatusOr<std::optional<Rewrite>> rewriteForInt8Kernels(const WeightMatrix& w, Isa isa) {
  // The AVX-512 kernels read Q6_K as it is (packed_layout.h).
  if (w.type == TensorType::kQ6_K && isa == Isa::kAvx512) return std::nullopt;
  const int64_t blocks = w.rows * w.cols / 32;
  if (w.type == TensorType::kQ4_K) {
    // Q4_K's 32-element sub-blocks as Q4_1 blocks (5 bits a weight instead of 4.5); a scale
    // past half's range keeps the row-by-row path.
    auto bytes = std::make_shared<std::vector<uint8_t>>(blocks * 20);
    if (!model::dequant::q4_KAsQ4_1(w.data, bytes->data(), blocks / 8)) return std::nullopt;
    return Rewrite{TensorType::kQ4_1, std::move(bytes)};
  }
  if (requantizedToQ8_0(w.type)) {
    // Requantized to Q8_0 a row at a time: within half a Q8_0 step (1/254 of a block's
    // largest weight) of the stored values, a quarter of Q6_K's own step.
    auto bytes = std::make_shared<std::vector<uint8_t>>(blocks * 34);
    std::vector<float> row(w.cols);
    const int64_t row_blocks = w.cols / 32;
    for (int64_t r = 0; r < w.rows; ++r) {
      CLEAVE_RETURN_IF_ERROR(dequantizeRows(w, r, r + 1, row.data()));
      model::dequant::quantizeQ8_0(row.data(), bytes->data() + r * row_blocks * 34, row_blocks);
    }
    return Rewrite{TensorType::kQ8_0, std::move(bytes)};
  }
  return std::nullopt;
}

}  // namespace

// The int8 kernels read it packed as GGUF's NVFP4 is: halves of 32-element blocks. (Other
// E2M1 slices, and FP8, are dequantized a row at a time.)
bool isNvfp4Rows(const WeightMatrix& w) {
  const BlockScales& s = w.scales;
  return w.type == TensorType::kE2M1 && s.block_rows == 1 && s.block_cols == 16 &&
         s.col_offset % 16 == 0 && w.cols % 32 == 0;
}

int64_t WeightMatrix::rowBytes() const { return *model::tensorBytes(type, cols); }

// Formats the kernels read as floats a row at a time: FP8 and E2M1 with their scales, and
// Q4_K whose rewrite would overflow half (every other block format is rewritten for the int8
// kernels, rewriteForInt8Kernels).
bool isDequantizedPerRow(TensorType type) { return type == TensorType::kQ4_K || takesScales(type); }

bool matmulSupports(TensorType type) {
  return isQuantized(type) || isDequantizedPerRow(type) || requantizedToQ8_0(type) ||
         type == TensorType::kNVFP4 || type == TensorType::kF32 || type == TensorType::kF16 ||
         type == TensorType::kBF16;
}

namespace {

absl::Status checkSource(const WeightMatrix& source) {
  if (!matmulSupports(source.type)) {
    return absl::UnimplementedError(absl::StrCat(
        "matmul: weight format ", model::tensorTypeName(source.type), " is not supported"));
  }
  if (source.cols <= 0 || !model::tensorBytes(source.type, source.cols)) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: ", source.cols,
                                                   " columns is not a whole number of ",
                                                   model::tensorTypeName(source.type), " blocks"));
  }
  if (takesScales(source.type) != (source.scales.data != nullptr)) {
    return absl::InvalidArgumentError(
        "matmul: FP8 and E2M1 weights need block scales, and only they take them");
  }
  if (source.scales.data &&
      (source.scales.block_rows <= 0 || source.scales.block_cols <= 0 ||
       (source.scales.col_offset + source.cols - 1) / source.scales.block_cols >=
           source.scales.cols)) {
    return absl::InvalidArgumentError("matmul: the block scales do not cover the matrix");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CpuMatrix> CpuMatrix::asStored(const WeightMatrix& source,
                                              std::shared_ptr<const void> owner) {
  CLEAVE_RETURN_IF_ERROR(checkSource(source));
  CpuMatrix matrix;
  matrix.source_ = matrix.kernel_ = source;
  matrix.isa_ = Isa::kPortable;
  matrix.owner_ = std::move(owner);
  return matrix;
}

absl::StatusOr<CpuMatrix> CpuMatrix::create(const WeightMatrix& source, Isa isa) {
  CLEAVE_RETURN_IF_ERROR(checkSource(source));
  if (!isaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("matmul: this CPU cannot run ", isaName(isa)));
  }
  CpuMatrix matrix;
  matrix.source_ = source;
  matrix.kernel_ = source;
  matrix.isa_ = isa;
  CLEAVE_ASSIGN_OR_RETURN(std::optional<Rewrite> rewrite, rewriteForInt8Kernels(source, isa));
  if (rewrite) {
    matrix.rewritten_ = std::move(rewrite->bytes);
    matrix.kernel_.type = rewrite->type;
    matrix.kernel_.data = matrix.rewritten_->data();
  }
  // Float weights stream through the SIMD kernels as stored: from a copy on huge pages, as
  // packed formats do, rather than from the file's 4 KiB pages (huge_pages.h).
  const TensorType type = matrix.kernel_.type;
  if (isa != Isa::kPortable && !rewrite &&
      (type == TensorType::kF32 || type == TensorType::kF16 || type == TensorType::kBF16)) {
    const int64_t bytes = source.rows * source.rowBytes();
    matrix.resident_ = allocateOnHugePages(std::max<int64_t>(bytes, 64));
    if (matrix.resident_ == nullptr)
      return absl::ResourceExhaustedError(
          absl::StrCat("matmul: cannot allocate ", bytes, " bytes"));
    std::memcpy(matrix.resident_.get(), source.data, bytes);
    matrix.kernel_.data = matrix.resident_.get();
    return matrix;
  }
  const WeightMatrix& kernel = matrix.kernel_;
  // The AVX-512 kernels read every packed format, the AVX2 kernel all but Q6_K (which
  // rewriteForInt8Kernels turned into Q8_0 for it).
  // NVFP4 is packed for every path (the portable one too: it has no other int8 kernel).
  const bool nvfp4 = isNvfp4Rows(source);
  const bool packs =
      kernel.type == TensorType::kNVFP4 ||
      (packed::packs(kernel.type) &&
       (isa == Isa::kAvx512 || (isa == Isa::kAvx2 && kernel.type != TensorType::kQ6_K)));
  if (!packs && !nvfp4) return matrix;
  const TensorType packed_type = nvfp4 ? TensorType::kNVFP4 : kernel.type;
  const int64_t bytes =
      packed::groups(kernel.rows) * packed::groupBytes(packed_type, kernel.cols / 32);
  // 64-byte aligned so each 512-bit load stays within one cache line.
  matrix.packed_ = allocateOnHugePages(std::max<int64_t>((bytes + 63) / 64 * 64, 64));
  if (matrix.packed_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("matmul: cannot allocate ", bytes, " bytes"));
  }
  if (nvfp4) {
    const BlockScales& s = source.scales;
    packed::packE2M1(
        source.rows, source.cols, source.data,
        [&](int64_t row, int64_t group) { return s.rowGroup(row, group) * s.global; },
        matrix.packed_.get());
    matrix.kernel_ = {.type = TensorType::kNVFP4, .rows = source.rows, .cols = source.cols};
  } else {
    packed::pack(kernel.type, kernel.rows, kernel.cols, kernel.data, matrix.packed_.get());
  }
  matrix.packed_bytes_ = bytes;
  if (matrix.rewritten_) {  // The packed copy replaces the rewrite.
    matrix.rewritten_.reset();
    matrix.kernel_.data = nullptr;
  }
  // The kernel reads the packed copy; source_ stays what another backend uploads from.
  return matrix;
}

absl::StatusOr<CpuMatrix> CpuMatrix::create(const WeightMatrix& source,
                                            std::shared_ptr<const void> owner, Isa isa) {
  auto matrix = create(source, isa);
  if (matrix.ok()) matrix->owner_ = std::move(owner);
  return matrix;
}

void CpuMatrix::dropSource() {
  if (!packed()) return;
  source_.data = nullptr;
  source_.scales.data = nullptr;
  kernel_.data = nullptr;
  owner_.reset();
}

int64_t CpuMatrix::bytes() const {
  if (packed()) return packed_bytes_;
  if (rewritten_) return static_cast<int64_t>(rewritten_->size());
  const BlockScales& s = source_.scales;
  // The scales a product reads: one float per block row of the slice's blocks.
  const int64_t scale_bytes = s.data == nullptr
                                  ? 0
                                  : (rows() + s.block_rows - 1) / s.block_rows *
                                        ((cols() + s.block_cols - 1) / s.block_cols) * 4;
  return rows() * source_.rowBytes() + scale_bytes;
}

bool CpuMatrix::multipliesInt8() const { return isQuantized(kernelType()) || packed(); }

bool bf16DotsChosen() {
  static const bool chosen = [] {
    if (bestIsa() != Isa::kAvx512 || !cpuFeatures().avx512bf16) return false;
    if (const char* forced = std::getenv("CLEAVE_CPU_BF16")) {
      if (std::strcmp(forced, "1") == 0) return true;
      if (std::strcmp(forced, "0") == 0) return false;
    }
    ThreadPool one(1);
    return bf16PeakFlops(one) >= 1.25 * f32PeakFlops(one);
  }();
  return chosen;
}

bool CpuMatrix::multipliesBf16() const {
  return kernelType() == TensorType::kBF16 && !packed() && isa_ == Isa::kAvx512 && bf16DotsChosen();
}

namespace {

// Rows [begin, end) of one product; `xq` holds its activations quantized, `xb` rounded to
// bf16 ([tokens][cols]), where it reads them.
void productRows(const MatmulArgs& args, const QuantizedActivations* xq, const uint16_t* xb,
                 int64_t begin, int64_t end) {
  const CpuMatrix& w = *args.weight;
  if (w.packed()) {
    static_assert(kRowAlign % packed::kGroupRows == 0);
    (w.isa() == Isa::kAvx512 ? kernels::packedGroupsAvx512
     : w.isa() == Isa::kAvx2
         ? kernels::packedGroupsAvx2
         : kernels::packedNvfp4Portable)({.weight = &w,
                                          .x = xq,
                                          .y = args.y,
                                          .ldy = args.ldy,
                                          .group_begin = begin / packed::kGroupRows,
                                          .group_end = packed::groups(end)});
    return;
  }
  if (isQuantized(w.kernelType())) {
    kernels::quantRowsPortable({.weight = &w.kernelSource(),
                                .x = xq,
                                .y = args.y,
                                .ldy = args.ldy,
                                .row_begin = begin,
                                .row_end = end});
    return;
  }
  // Float weights, and formats dequantized a row at a time (every block format a matrix kept
  // as stored holds), take float activations; BF16 weights on the bf16 dots, bf16 ones.
  const TensorType type = w.kernelType();
  const bool is_float =
      type == TensorType::kF32 || type == TensorType::kF16 || type == TensorType::kBF16;
  const bool bf16 = w.multipliesBf16();
  auto kernel = bf16                      ? kernels::bf16RowsAvx512
                : !is_float               ? kernels::dequantizedRows
                : w.isa() == Isa::kAvx512 ? kernels::floatRowsAvx512
                : w.isa() == Isa::kAvx2   ? kernels::floatRowsAvx2
                                          : kernels::floatRowsPortable;
  kernel({.weight = &w.kernelSource(),
          .x = args.x,
          .ldx = args.ldx,
          .tokens = args.tokens,
          .y = args.y,
          .ldy = args.ldy,
          .row_begin = begin,
          .row_end = end,
          .xb = bf16 ? xb : nullptr,
          .ldxb = w.cols()});
}

}  // namespace

absl::Status matmul(const MatmulArgs& args, ThreadPool& pool) {
  return matmulsOfOneInput({&args, 1}, pool);
}

absl::Status matmulsOfOneInput(std::span<const MatmulArgs> products, ThreadPool& pool) {
  constexpr size_t kMaxProducts = 8;
  if (products.size() > kMaxProducts)
    return absl::InvalidArgumentError("matmulsOfOneInput: at most 8 products at once");
  if (products.empty()) return absl::OkStatus();
  const MatmulArgs& first = products.front();
  for (const MatmulArgs& p : products) {
    if (p.x != first.x || p.ldx != first.ldx || p.tokens != first.tokens ||
        p.weight->cols() != first.weight->cols())
      return absl::InvalidArgumentError(
          "matmulsOfOneInput: every product must read the same activations (x, ldx, tokens, "
          "cols)");
  }
  if (first.tokens == 0) return absl::OkStatus();
  thread_local QuantizedActivations x;
  const bool quantized = std::any_of(products.begin(), products.end(), [](const MatmulArgs& p) {
    return p.weight->multipliesInt8();
  });
  if (quantized)
    quantizeActivations(first.x, first.tokens, first.weight->cols(), first.ldx, x, bestIsa(),
                        &pool);
  // This thread's buffer, which the pool's threads reach through `xb` (thread_local names
  // each thread's own).
  thread_local std::vector<uint16_t> bf16_x;
  uint16_t* xb = nullptr;
  if (std::any_of(products.begin(), products.end(),
                  [](const MatmulArgs& p) { return p.weight->multipliesBf16(); })) {
    const int64_t cols = first.weight->cols();
    bf16_x.resize(first.tokens * cols);
    xb = bf16_x.data();
    pool.parallelFor(first.tokens, 4, [&](int64_t begin, int64_t end) {
      kernels::toBf16Avx512(first.x + begin * first.ldx, end - begin, cols, first.ldx,
                            xb + begin * cols, cols);
    });
  }
  // One job: each product's rows in tasks of rowsPerTask, the products one after another.
  std::array<int64_t, kMaxProducts> rows_per_task{}, first_task{};
  int64_t tasks = 0;
  for (size_t i = 0; i < products.size(); ++i) {
    const int64_t rows = products[i].weight->rows();
    rows_per_task[i] = rowsPerTask(std::max<int64_t>(rows, 1), pool.size());
    first_task[i] = tasks;
    tasks += rows == 0 ? 0 : (rows + rows_per_task[i] - 1) / rows_per_task[i];
  }
  const QuantizedActivations* xq = quantized ? &x : nullptr;
  pool.run(tasks, [&](int64_t task) {
    size_t i = products.size() - 1;
    while (first_task[i] > task) --i;
    const int64_t begin = (task - first_task[i]) * rows_per_task[i];
    productRows(products[i], xq, xb, begin,
                std::min(products[i].weight->rows(), begin + rows_per_task[i]));
  });
  return absl::OkStatus();
}

}  // namespace cleave::cpu
