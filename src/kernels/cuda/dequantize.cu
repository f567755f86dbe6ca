// CUDA: a QLoRA base weight (NF4 double-quantised, FP8 128×128 blocks, LLM.int8 rows or NVFP4) dequantised to bf16
// for one GEMM, with kernels/quant.h's arithmetic (the CPU twin's), rounded once to bf16. Each thread writes 8
// values as one 16-byte store; the weights are read at 0.5 (NF4) or 1 (FP8, int8) byte per value.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant.h"

namespace soltrain {

using cuda::bf16;

namespace {
constexpr int kThreads = 256, kPer = 8;  // values per thread: a 16-byte bf16 store, 4 NF4 bytes

// Groups of 8 consecutive values never straddle a 64-block (NF4), and with `in` a multiple of 8 never a row
// or a 128-column tile (FP8); the scalar path takes the rest (a ragged tail, odd widths).
__global__ void dequantize_nf4_kernel(bf16* out, const uint8_t* data, const uint8_t* scale, int64_t n) {
  __shared__ float code[16];
  if (threadIdx.x < 16) code[threadIdx.x] = quant::nf4_code(int(threadIdx.x));
  __syncthreads();
  const quant::Nf4Layout l(n);
  const int64_t groups = (n + kPer - 1) / kPer;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i0 = g * kPer;
    if (i0 + kPer <= n) {
      const float absmax = quant::nf4_absmax(scale, l, i0 / quant::kNf4Block);
      const uint32_t packed = *reinterpret_cast<const uint32_t*>(data + i0 / 2);  // 4 bytes, little-endian
      cuda::Vec8 v;
      for (int k = 0; k < kPer; ++k) {
        const uint8_t byte = uint8_t(packed >> (8 * (k / 2)));
        v.set(k, quant::mul_rn(code[(k & 1) ? (byte & 15) : (byte >> 4)], absmax));
      }
      cuda::store8(out + i0, v);
    } else {
      for (int64_t i = i0; i < n; ++i)
        out[i] = cuda::to_bf(quant::nf4_value(data, i, quant::nf4_absmax(scale, l, i / quant::kNf4Block)));
    }
  }
}

__global__ void dequantize_fp8_block_kernel(bf16* out, const uint8_t* q, const float* scale_inv, int64_t rows,
                                            int64_t cols, bool vector) {
  const int64_t n = rows * cols, groups = (n + kPer - 1) / kPer;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i0 = g * kPer;
    if (vector) {  // cols % 8 == 0: the 8 values share a row and a tile
      const int64_t r = i0 / cols, c = i0 % cols;
      const uint2 raw = *reinterpret_cast<const uint2*>(q + i0);
      const auto* b = reinterpret_cast<const uint8_t*>(&raw);
      const float s =
          scale_inv[(r / quant::kFp8Tile) * ((cols + quant::kFp8Tile - 1) / quant::kFp8Tile) + c / quant::kFp8Tile];
      cuda::Vec8 v;
      for (int k = 0; k < kPer; ++k) v.set(k, quant::mul_rn(quant::e4m3_to_f32(b[k]), s));
      cuda::store8(out + i0, v);
    } else {
      for (int64_t i = i0; i < n && i < i0 + kPer; ++i)
        out[i] = cuda::to_bf(quant::fp8_block_value(q, scale_inv, cols, i / cols, i % cols));
    }
  }
}
// LLM.int8 rows: with `in` a multiple of 8 the 8 values share a row (its absmax).
__global__ void dequantize_int8_row_kernel(bf16* out, const uint8_t* q, const float* absmax, int64_t rows, int64_t cols,
                                           bool vector) {
  const int64_t n = rows * cols, groups = (n + kPer - 1) / kPer;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i0 = g * kPer;
    if (vector) {
      const uint2 raw = *reinterpret_cast<const uint2*>(q + i0);
      const auto* b = reinterpret_cast<const uint8_t*>(&raw);
      const float m = absmax[i0 / cols];
      cuda::Vec8 v;
      for (int k = 0; k < kPer; ++k) v.set(k, quant::mul_rn(quant::mul_rn(float(int8_t(b[k])), m), quant::kInt8Recip));
      cuda::store8(out + i0, v);
    } else {
      for (int64_t i = i0; i < n && i < i0 + kPer; ++i)
        out[i] = cuda::to_bf(quant::int8_row_value(q, absmax, cols, i / cols, i % cols));
    }
  }
}
// NVFP4: 8 values (4 bytes of codes, one 16-block's half: cols is a multiple of 16) share a block scale.
__global__ void dequantize_nvfp4_kernel(bf16* out, const uint8_t* data, const uint8_t* scale, int64_t rows,
                                        int64_t cols) {
  const int64_t n = rows * cols, groups = n / kPer;
  float tensor_scale;
  memcpy(&tensor_scale, scale, 4);
  const uint8_t* blocks = scale + quant::kNvfp4BlockScalesAt;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i0 = g * kPer;
    const uint32_t packed = *reinterpret_cast<const uint32_t*>(data + i0 / 2);
    // (the row-major block index: row i0 / cols, block (i0 % cols) / 16, as nvfp4_value computes it)
    const float s = quant::mul_rn(tensor_scale, quant::e4m3_to_f32(blocks[i0 / quant::kNvfp4Block]));
    cuda::Vec8 v;
    for (int k = 0; k < kPer; ++k) {
      const uint8_t byte = uint8_t(packed >> (8 * (k / 2)));
      v.set(k, quant::mul_rn(quant::e2m1_to_f32((k & 1) ? (byte >> 4) : (byte & 15)), s));
    }
    cuda::store8(out + i0, v);
  }
}
}  // namespace

void CudaOps::dequantize(Tensor out, const Weight& w) {
  const auto prof = profile("dequantize");
  const int64_t rows = w.out(), cols = w.in(), n = rows * cols;
  SOLTRAIN_CHECK(out.dtype == DType::BF16 && out.numel() == n && cuda::aligned16(out.data), "dequantize output");
  const auto* data = static_cast<const uint8_t*>(w.data.data);
  const unsigned blocks = cuda::blocks_for((n + kPer - 1) / kPer, kThreads);
  if (w.format == WeightFormat::Nf4) {
    SOLTRAIN_CHECK(reinterpret_cast<uintptr_t>(data) % 4 == 0, "NF4 codes must be 4-byte aligned");
    dequantize_nf4_kernel<<<blocks, kThreads, 0, stream_>>>(out.as<bf16>(), data,
                                                            static_cast<const uint8_t*>(w.scale.data), n);
  } else if (w.format == WeightFormat::Int8Row) {
    SOLTRAIN_CHECK(w.scale.dtype == DType::F32 && w.scale.numel() == rows, "dequantize: int8 row scales");
    const bool vector = cols % kPer == 0 && reinterpret_cast<uintptr_t>(data) % 8 == 0;
    dequantize_int8_row_kernel<<<blocks, kThreads, 0, stream_>>>(out.as<bf16>(), data, w.scale.f32(), rows, cols,
                                                                 vector);
  } else if (w.format == WeightFormat::Nvfp4) {
    SOLTRAIN_CHECK(cols % quant::kNvfp4Block == 0 && reinterpret_cast<uintptr_t>(data) % 4 == 0,
                   "dequantize: NVFP4 rows in blocks of 16, codes 4-byte aligned");
    dequantize_nvfp4_kernel<<<blocks, kThreads, 0, stream_>>>(out.as<bf16>(), data,
                                                              static_cast<const uint8_t*>(w.scale.data), rows, cols);
  } else {
    SOLTRAIN_CHECK(w.format == WeightFormat::Fp8Block && w.scale.dtype == DType::F32, "dequantize: format");
    const bool vector = cols % kPer == 0 && reinterpret_cast<uintptr_t>(data) % 8 == 0;
    dequantize_fp8_block_kernel<<<blocks, kThreads, 0, stream_>>>(out.as<bf16>(), data, w.scale.f32(), rows, cols,
                                                                  vector);
  }
  CUDA_CHECK_LAUNCH();
}

// The bf16 copy the GEMMs read: the weight itself when dense, else its dequantised values in the one
// scratch buffer (queued on the current stream before the GEMM that reads it, and overwritten only by the
// next quantised linear on that stream, after that GEMM).
Tensor CudaOps::dense_weight(const Weight& w) {
  if (w.format == WeightFormat::Dense) {
    SOLTRAIN_CHECK(w.data.dtype == DType::BF16, "dense CUDA weights are BF16, got ", dtype_name(w.data.dtype));
    return w.data;
  }
  const size_t bytes = size_t(w.out() * w.in()) * 2;
  if (dequantised_.bytes() < bytes) {
    synchronize();  // the old buffer may still be read by a queued GEMM
    dequantised_ = alloc(bytes);
  }
  const Tensor t{dequantised_.data(), DType::BF16, {w.out(), w.in()}, Device::CUDA};
  dequantize(t, w);
  return t;
}

}  // namespace soltrain
