// Checking every CUDA runtime / cuBLASLt call: a failure throws with the call, file and line.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace soltrain::cuda {

[[noreturn]] inline void fail(const char* what, const std::string& why, const char* file, int line) {
  throw std::runtime_error(std::string(what) + " failed: " + why + " at " + file + ":" + std::to_string(line));
}

}  // namespace soltrain::cuda

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess) ::soltrain::cuda::fail(#call, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                         \
  do {                                                                                                             \
    cublasStatus_t st_ = (call);                                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                              \
      ::soltrain::cuda::fail(#call, std::string("cuBLAS status ") + std::to_string(int(st_)), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at a later sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
