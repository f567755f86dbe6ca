// Host quantisers of the frozen-base formats (kernels/quant.h): what loading runs to turn a bf16/fp32
// checkpoint into NF4 or FP8 blocks, and the dequantisers the CPU matmuls and the tests read them back with.
#pragma once
#include <cstdint>
#include <vector>

namespace soltrain {

// NF4 with double quantisation (bitsandbytes' quantize_4bit, blocksize 64, compress_statistics=True):
// data receives Nf4Layout(n).data_bytes() bytes, scale Nf4Layout(n).scale_bytes().
void nf4_quantize(const float* x, int64_t n, uint8_t* data, uint8_t* scale);
void nf4_dequantize(const uint8_t* data, const uint8_t* scale, int64_t n, float* out);
// The NF4 round trip without double quantisation (compress_statistics=False: each 64-block's absmax kept in
// fp32): quantize_4bit then dequantize_4bit, code · absmax in fp32.
void nf4_round_trip(const float* x, int64_t n, float* out);

// FP8 128×128 blocks of a row-major [rows, cols] matrix: q [rows·cols] E4M3, scale_inv
// [ceil(rows/128), ceil(cols/128)] fp32. Per tile, as transformers' FP8 quantizer: scale = 448 / amax as torch
// computes it, (1 / amax) · 448 (1 for an all-zero tile), q = e4m3(x · scale) saturated, scale_inv = 1 / scale.
void fp8_block_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale_inv);
void fp8_block_dequantize(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t cols, float* out);

// LLM.int8 weights (kernels/quant.h, Int8Row): q [rows·cols] int8 codes (as bytes), absmax [rows] fp32.
void int8_row_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* absmax);
void int8_row_dequantize(const uint8_t* q, const float* absmax, int64_t rows, int64_t cols, float* out);

// NVFP4 (kernels/quant.h, Nvfp4) of a row-major [rows, cols] matrix, cols a multiple of 16: data [rows·cols / 2]
// packed codes, scale [nvfp4_scale_bytes(rows, cols)] (the tensor scale, then the E4M3 block scales).
void nvfp4_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* data, uint8_t* scale);
void nvfp4_dequantize(const uint8_t* data, const uint8_t* scale, int64_t rows, int64_t cols, float* out);

}  // namespace soltrain
