// TMA tensor maps through the driver's cuTensorMapEncodeTiled, fetched from the runtime once, so nothing
// links against libcuda directly.
#include "kernels/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/check.h"

namespace soltrain::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    SOLTRAIN_CHECK(found == cudaDriverEntryPointSuccess && p, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// [outer, middle, inner] bf16 with contiguous inner rows, boxes of 64 inner x 1 x `rows` outer, 128-byte swizzle.
CUtensorMap tile_map(void* data, int64_t outer, int64_t middle, int64_t inner, int rows) {
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(middle), cuuint64_t(outer)};
  const cuuint64_t strides[2] = {cuuint64_t(inner) * 2, cuuint64_t(middle * inner) * 2};  // bytes, dims 1-2
  const cuuint32_t box[3] = {64, 1, cuuint32_t(rows)}, unit[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, data, dims, strides, box, unit,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SOLTRAIN_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(r), ")");
  return map;
}
}  // namespace

CUtensorMap head_tile_map(const Tensor& x, int rows) {
  SOLTRAIN_CHECK(x.dtype == DType::BF16 && x.rank() == 3 && x.dim(2) % 64 == 0, "head_tile_map: bf16 [N, H, 64k]");
  return tile_map(x.data, x.dim(0), x.dim(1), x.dim(2), rows);
}

CUtensorMap matrix_tile_map(const void* data, int64_t rows, int64_t cols, int box_rows) {
  SOLTRAIN_CHECK(cols % 8 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0,
                 "matrix_tile_map: bf16 rows of 16-byte multiples, aligned");
  return tile_map(const_cast<void*>(data), rows, 1, cols, box_rows);
}

}  // namespace soltrain::cuda
