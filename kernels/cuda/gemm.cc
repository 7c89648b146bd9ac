#include "kernels/cuda/gemm.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cublaslt_library.h"
#include "kernels/cuda/cuda_check.h"

namespace cleave::cuda {
namespace {

absl::Status blasStatus(const CublasLt& lt, cublasStatus_t status, const std::string& op) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", op, ": ", lt.statusString(status)));
}

// `call` is made through lt_ (a CublasLt*) in scope.
#define CLEAVE_BLAS(call, op)                                                       \
  do {                                                                              \
    if (absl::Status s_ = blasStatus(*lt_, (lt_->call), (op)); !s_.ok()) return s_; \
  } while (0)

// The largest power of two up to 256 dividing `pointer`'s address and every byte offset
// in `steps` (a batch's; 0 entries ignored).
uint32_t alignment(const void* pointer, std::initializer_list<int64_t> steps) {
  uint64_t bits = reinterpret_cast<uintptr_t>(pointer) | 256;
  for (int64_t step : steps) {
    if (step != 0) bits |= static_cast<uint64_t>(step);
  }
  return static_cast<uint32_t>(bits & (~bits + 1));  // The lowest set bit.
}

}  // namespace

// In cuBLASLt's column-major terms the product is y^T [out x tokens] = w [in x out]^T ·
// x^T [in x tokens]: A = w transposed, B = x as stored, D = y as stored.
struct Gemm::Plan {
  const CublasLt* lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) lt->layoutDestroy(d);
    if (b) lt->layoutDestroy(b);
    if (a) lt->layoutDestroy(a);
    if (desc) lt->descDestroy(desc);
  }
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::create(size_t workspace_bytes) {
  absl::StatusOr<const CublasLt*> lt = cublasLt();
  if (!lt.ok()) return lt.status();
  std::unique_ptr<Gemm> gemm(new Gemm());
  gemm->lt_ = *lt;
  const CublasLt* lt_ = *lt;
  cublasLtHandle_t handle = nullptr;
  CLEAVE_BLAS(create(&handle), "create");
  gemm->handle_ = handle;
  if (absl::Status s = cudaStatus(cudaMalloc(&gemm->workspace_, workspace_bytes), "gemm workspace");
      !s.ok())
    return s;
  gemm->workspace_bytes_ = workspace_bytes;
  return gemm;
}

Gemm::~Gemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) lt_->destroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::StatusOr<Gemm::Plan*> Gemm::plan(const GemmArgs& g) {
  // cuBLASLt assumes 256-byte aligned operand pointers unless told less: a product on
  // columns inside a row (one head of several) says what its pointers and batches allow.
  const int64_t y_bytes = g.y_float ? 4 : 2;
  const uint32_t align_w = alignment(g.w, {g.w_batch * 2});
  const uint32_t align_x = alignment(g.x, {g.x_batch * 2});
  const uint32_t align_y = alignment(g.y, {g.y_batch * y_bytes});
  const auto key = std::make_tuple(g.tokens, g.out, g.in, g.x_stride, g.y_stride, g.bias != nullptr,
                                   g.y_float, g.batch, g.x_batch, g.w_batch, g.y_batch,
                                   align_w | (align_x << 9) | (align_y << 18));
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  plan->lt = lt_;
  const std::string shape = absl::StrCat(g.tokens, "x", g.out, "x", g.in);
  CLEAVE_BLAS(descCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              "matmul descriptor " + shape);
  const cublasOperation_t transpose = CUBLAS_OP_T;
  CLEAVE_BLAS(
      descSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
      "transpose " + shape);
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CLEAVE_BLAS(
        descSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        "bias epilogue " + shape);
    const cudaDataType_t bias_type = CUDA_R_16BF;
    CLEAVE_BLAS(descSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                 sizeof(bias_type)),
                "bias type " + shape);
  }
  const cudaDataType_t y_type = g.y_float ? CUDA_R_32F : CUDA_R_16BF;
  CLEAVE_BLAS(layoutCreate(&plan->a, CUDA_R_16BF, g.in, g.out, g.in), "layout of w " + shape);
  CLEAVE_BLAS(layoutCreate(&plan->b, CUDA_R_16BF, g.in, g.tokens, g.x_stride),
              "layout of x " + shape);
  CLEAVE_BLAS(layoutCreate(&plan->d, y_type, g.out, g.tokens, g.y_stride), "layout of y " + shape);
  if (g.batch > 1) {
    const int32_t count = g.batch;
    for (auto [layout, stride] : {std::pair{plan->a, g.w_batch}, std::pair{plan->b, g.x_batch},
                                  std::pair{plan->d, g.y_batch}}) {
      CLEAVE_BLAS(
          layoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
          "batch count " + shape);
      CLEAVE_BLAS(layoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                     sizeof(stride)),
                  "batch stride " + shape);
    }
  }
  cublasLtMatmulPreference_t preference = nullptr;
  CLEAVE_BLAS(preferenceCreate(&preference), "preference " + shape);
  CLEAVE_BLAS(preferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                     &workspace_bytes_, sizeof(workspace_bytes_)),
              "workspace preference " + shape);
  for (auto [attribute, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}}) {
    CLEAVE_BLAS(preferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes)),
                "alignment preference " + shape);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t heuristic =
      lt_->heuristic(static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a, plan->b, plan->d,
                     plan->d, preference, 1, &result, &found);
  lt_->preferenceDestroy(preference);
  if (absl::Status s = blasStatus(*lt_, heuristic, "algorithm for " + shape); !s.ok()) return s;
  if (found == 0)
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for ", shape));
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status Gemm::run(const GemmArgs& g, cudaStream_t stream) {
  if (g.tokens == 0) return absl::OkStatus();
  if (g.batch < 1 || (g.batch > 1 && g.bias != nullptr))
    return absl::InvalidArgumentError(
        "gemm: batch must be >= 1, and a batched product has no bias");
  absl::StatusOr<Plan*> plan = this->plan(g);
  if (!plan.ok()) return plan.status();
  if (g.bias != nullptr) {
    CLEAVE_BLAS(
        descSetAttribute((*plan)->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)),
        "bias pointer");
  }
  const float one = 1.0f, zero = 0.0f;
  CLEAVE_BLAS(matmul(static_cast<cublasLtHandle_t>(handle_), (*plan)->desc, &one, g.w, (*plan)->a,
                     g.x, (*plan)->b, &zero, g.y, (*plan)->d, g.y, (*plan)->d, &(*plan)->algo,
                     workspace_, workspace_bytes_, stream),
              absl::StrCat("matmul ", g.tokens, "x", g.out, "x", g.in));
  return absl::OkStatus();
}

}  // namespace cleave::cuda
