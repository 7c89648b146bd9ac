#include "kernels/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace cleave::cuda {
namespace {

absl::StatusOr<CublasLt> open() {
  void* library = nullptr;
  std::string errors;
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
  }
  if (library == nullptr)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open cuBLASLt (", errors,
                     "): install CUDA 13's cuBLAS, or put the folder holding libcublasLt.so.13 on "
                     "LD_LIBRARY_PATH"));
  CublasLt lt{};
  std::string missing;
  auto resolve = [&](auto& slot, const char* symbol) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(library, symbol));
    if (slot == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  };
  resolve(lt.create, "cublasLtCreate");
  resolve(lt.destroy, "cublasLtDestroy");
  resolve(lt.statusString, "cublasLtGetStatusString");
  resolve(lt.matmul, "cublasLtMatmul");
  resolve(lt.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(lt.descCreate, "cublasLtMatmulDescCreate");
  resolve(lt.descDestroy, "cublasLtMatmulDescDestroy");
  resolve(lt.descSetAttribute, "cublasLtMatmulDescSetAttribute");
  resolve(lt.preferenceCreate, "cublasLtMatmulPreferenceCreate");
  resolve(lt.preferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  resolve(lt.preferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(lt.layoutCreate, "cublasLtMatrixLayoutCreate");
  resolve(lt.layoutDestroy, "cublasLtMatrixLayoutDestroy");
  resolve(lt.layoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  if (!missing.empty()) {
    dlclose(library);
    return absl::FailedPreconditionError(
        absl::StrCat("the cuBLASLt that was found lacks ", missing, ": it is not CUDA 13's"));
  }
  return lt;  // The library stays open for the process's life.
}

}  // namespace

absl::StatusOr<const CublasLt*> cublasLt() {
  static const absl::StatusOr<CublasLt>* opened = new absl::StatusOr<CublasLt>(open());
  if (!opened->ok()) return opened->status();
  return &**opened;
}

}  // namespace cleave::cuda
