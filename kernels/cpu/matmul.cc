#include "kernels/cpu/matmul.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/matmul_kernels.h"

namespace cleave::cpu {
namespace {

using model::TensorType;

bool isQuantized(TensorType type) {
  return type == TensorType::kQ4_0 || type == TensorType::kQ4_1 || type == TensorType::kQ8_0;
}

// Rows per task: enough work to amortize a task, enough tasks to balance threads.
constexpr int64_t kRowsPerTask = 16;

}  // namespace

int64_t WeightMatrix::rowBytes() const { return *model::tensorBytes(type, cols); }

bool matmulSupports(TensorType type) {
  return isQuantized(type) || type == TensorType::kF32 || type == TensorType::kF16 ||
         type == TensorType::kBF16;
}

absl::Status matmul(const MatmulArgs& args, ThreadPool& pool) {
  const WeightMatrix& w = *args.weight;
  if (!matmulSupports(w.type)) {
    return absl::UnimplementedError(
        absl::StrCat("matmul: weight format ", model::tensorTypeName(w.type), " is not supported"));
  }
  if (!model::tensorBytes(w.type, w.cols)) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: ", w.cols, " columns is not a whole number of ",
                                                   model::tensorTypeName(w.type), " blocks"));
  }
  if (!isaSupported(args.isa)) {
    return absl::FailedPreconditionError(absl::StrCat("matmul: this CPU cannot run ", isaName(args.isa)));
  }
  if (args.tokens == 0 || w.rows == 0) return absl::OkStatus();
  const int64_t tasks = (w.rows + kRowsPerTask - 1) / kRowsPerTask;
  auto rowsOf = [&](int64_t task) {
    return std::pair<int64_t, int64_t>(task * kRowsPerTask, std::min(w.rows, (task + 1) * kRowsPerTask));
  };
  if (isQuantized(w.type)) {
    thread_local QuantizedActivations x;
    quantizeActivations(args.x, args.tokens, w.cols, args.ldx, x);
    auto kernel = args.isa == Isa::kAvx512 ? kernels::quantRowsAvx512
                  : args.isa == Isa::kAvx2 ? kernels::quantRowsAvx2
                                           : kernels::quantRowsPortable;
    const QuantizedActivations* xq = &x;
    pool.run(tasks, [&](int64_t task) {
      auto [begin, end] = rowsOf(task);
      kernel({.weight = &w, .x = xq, .y = args.y, .ldy = args.ldy, .row_begin = begin, .row_end = end});
    });
    return absl::OkStatus();
  }
  auto kernel = args.isa == Isa::kAvx512 ? kernels::floatRowsAvx512 : kernels::floatRowsPortable;
  pool.run(tasks, [&](int64_t task) {
    auto [begin, end] = rowsOf(task);
    kernel({.weight = &w, .x = args.x, .ldx = args.ldx, .tokens = args.tokens, .y = args.y,
            .ldy = args.ldy, .row_begin = begin, .row_end = end});
  });
  return absl::OkStatus();
}

}  // namespace cleave::cpu
