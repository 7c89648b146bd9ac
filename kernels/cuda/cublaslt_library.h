// cuBLASLt, opened when the first product plan is made instead of linked: its ~94 KB of
// thread-local storage would otherwise join the static TLS of every thread of every binary
// linking the CUDA backend, GPU or not, and libraries that start threads on small stacks
// (civetweb, under the metrics server) then cannot start them. Opened with dlopen, its TLS
// is allocated per thread on first use.
#pragma once

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace cleave::cuda {

// The entry points Gemm uses.
struct CublasLt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusString) statusString;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmulDescCreate) descCreate;
  decltype(&cublasLtMatmulDescDestroy) descDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) descSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) preferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) preferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) layoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) layoutDestroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layoutSetAttribute;
};

// The library (libcublasLt.so.13, found like any shared library: LD_LIBRARY_PATH, the
// loader's paths), opened once and kept; FailedPrecondition saying where it was looked for.
absl::StatusOr<const CublasLt*> cublasLt();

}  // namespace cleave::cuda
