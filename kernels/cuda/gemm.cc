#include "kernels/cuda/gemm.h"

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
  const auto key =
      std::make_tuple(g.tokens, g.out, g.in, g.x_stride, g.y_stride, g.bias != nullptr, g.y_float);
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
  cublasLtMatmulPreference_t preference = nullptr;
  CLEAVE_BLAS(preferenceCreate(&preference), "preference " + shape);
  CLEAVE_BLAS(preferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                     &workspace_bytes_, sizeof(workspace_bytes_)),
              "workspace preference " + shape);
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
