// cuBLASLt, loaded when the CUDA backend first asks for it rather than when the process starts.
//
// Why: libcublasLt is a 540 MB library whose load costs every process about 0.33 s and 210 MB of resident
// memory (measured: an empty program linked to it, 25k page faults), before main runs and whether or not a GPU
// is used. `soltrain --help`, every CPU run and every test process paid it. The twelve entry points soltrain
// calls are defined here with cublasLt.h's own signatures, so call sites are unchanged; each resolves its
// symbol from the library on first use (dlopen: the soname of the cuBLAS soltrain was built against, then the
// toolkit's library folder at build time).
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <string>

#ifndef SOLTRAIN_CUDA_LIBRARY_DIR
#define SOLTRAIN_CUDA_LIBRARY_DIR ""
#endif

namespace {

void* cublaslt_library() {
  static void* handle = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle && *SOLTRAIN_CUDA_LIBRARY_DIR)
      handle = dlopen((std::string(SOLTRAIN_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      throw std::runtime_error("cannot load " + soname + " (cuBLASLt, CUDA " + std::to_string(CUBLAS_VER_MAJOR) +
                               "): " + dlerror() +
                               "; install the CUDA runtime or add its lib folder to LD_LIBRARY_PATH");
  });
  return handle;
}

// The library's function `name`, typed as our declaration of it (`decltype(&cublasLtX)`).
template <typename Fn>
Fn symbol(const char* name) {
  void* fn = dlsym(cublaslt_library(), name);
  if (!fn) throw std::runtime_error(std::string("cuBLASLt has no ") + name + ": the library is older than the headers");
  return reinterpret_cast<Fn>(fn);
}

}  // namespace

// Each entry point resolves once (a function-local static) and forwards its arguments unchanged.
#define SOLTRAIN_FORWARD(name, ...)                      \
  static const auto fn = symbol<decltype(&name)>(#name); \
  return fn(__VA_ARGS__)

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  SOLTRAIN_FORWARD(cublasLtCreate, handle);
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  SOLTRAIN_FORWARD(cublasLtDestroy, handle);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  SOLTRAIN_FORWARD(cublasLtMatmul, handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                   workspace_bytes, stream);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  SOLTRAIN_FORWARD(cublasLtMatmulAlgoGetHeuristic, handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requested,
                   results, returned);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  SOLTRAIN_FORWARD(cublasLtMatmulDescCreate, desc, compute, scale);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  SOLTRAIN_FORWARD(cublasLtMatmulDescDestroy, desc);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  SOLTRAIN_FORWARD(cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  SOLTRAIN_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  SOLTRAIN_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  SOLTRAIN_FORWARD(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  SOLTRAIN_FORWARD(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  SOLTRAIN_FORWARD(cublasLtMatrixLayoutDestroy, layout);
}

}  // extern "C"
