// The quantised weight formats of a frozen QLoRA base, one definition for the host (the CPU twin, quantising
// on load) and the device (the CUDA dequantise kernel): the same arithmetic, so the GPU's weights are
// bitwise the CPU's.
//   FP8: E4M3 / E5M2 bytes, rounded to nearest even as torch's .to(float8_e4m3fn / float8_e5m2) does
//     (c10/util/Float8_e4m3fn.h, Float8_e5m2.h). torch does NOT saturate: |x| >= 480 (inf too) becomes
//     E4M3's NaN, |x| >= 61440 becomes E5M2's inf. `saturate` clamps finite overflow to the max finite
//     (448 / 57344) instead, as cuda_fp8's __NV_SATFINITE does; the quantisers scale into range anyway.
//   Fp8Block: E4M3 [out, in] with an fp32 scale_inv per 128×128 tile ([ceil(out/128), ceil(in/128)]): the
//     layout of the official Qwen3 FP8 checkpoints; w = e4m3 · scale_inv.
//   NF4: bitsandbytes' quantize_4bit (backends/default/ops.py) with compress_statistics: the flat tensor in
//     blocks of 64, each with its absmax; x / absmax is clamped to [-1, 1] and given the index of the nearest
//     of 16 normal-quantile codes (a value on a midpoint goes to the lower: torch.bucketize); two codes a
//     byte, the even element in the high nibble. The absmaxes minus their mean are quantised again
//     (quantize_blockwise, 256 per block, the signed dynamic map): absmax = map[q]·nested + mean.
//   Int8Row: LLM.int8's weights as `load_in_8bit` stores them (bitsandbytes' Int8Params: int8_vectorwise_quant
//     with no outlier threshold, backends/default/ops.py): per row its absmax (SCB, fp32), codes
//     round(x · (127 / absmax)) in fp32, ties to even, 127 / absmax as torch's rdiv computes it ((1 / absmax) · 127); w
//     = (code · absmax) · (1/127 as fp32), as int8_vectorwise_dequant computes it. (An all-zero row, where bitsandbytes
//     would divide by zero, keeps codes 0.) LLM.int8's matmul also rounds the activations to int8 around outlier
//     columns; soltrain's GEMMs read the dequantised weight in bf16 (fp32 on the CPU), as they read every quantised
//     base.
//   Nvfp4: NVIDIA's FP4 as ModelOpt exports it and torchao's NVFP4Tensor quantises it (with its per-tensor scale):
//     E2M1 codes (0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives; sign in bit 3), two a byte with the even element in
//     the LOW nibble, an E4M3 scale per 16 values along a row, and one fp32 scale for the tensor (ModelOpt's
//     weight_scale_2); w = code · (tensor_scale · block_scale). Quantising (kernels/fake_quant.h's arithmetic):
//     tensor_scale = amax / (448·6), block_scale = E4M3(clamp(block_amax / 6 / tensor_scale, 2^-9, 448)), code =
//     E2M1(clamp(x · ((1 / tensor_scale) / block_scale), ±6)), ties to the even code.
#pragma once
#include <cstdint>
#include <cstring>

#ifndef SOLTRAIN_HOST_DEVICE
#ifdef __CUDACC__
#define SOLTRAIN_HOST_DEVICE __host__ __device__
#else
#define SOLTRAIN_HOST_DEVICE
#endif
#endif

namespace soltrain::quant {

SOLTRAIN_HOST_DEVICE inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
SOLTRAIN_HOST_DEVICE inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// One rounding each, never fused into an FMA by nvcc's contraction: the device must round as the host does.
SOLTRAIN_HOST_DEVICE inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SOLTRAIN_HOST_DEVICE inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

constexpr float kE4m3Max = 448.0f, kE5m2Max = 57344.0f;

// fp32 → E4M3 (fn: no inf, NaN = S.1111.111).
SOLTRAIN_HOST_DEVICE inline uint8_t f32_to_e4m3(float f, bool saturate) {
  uint32_t u = bits_of(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7f;  // NaN stays NaN
  if (saturate && u >= bits_of(kE4m3Max)) return sign | 0x7e;
  if (u >= (1087u << 20)) return sign | 0x7f;  // from 480 (the tie above 448) up: NaN, as torch
  if (u < (121u << 23)) {
    // Below 2^-6 (the smallest normal): adding 2^14 lines the subnormal step 2^-9 up with fp32's last
    // mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
    const uint32_t denorm = 141u << 23;
    return sign | uint8_t(bits_of(add_rn(float_of(u), float_of(denorm))) - denorm);
  }
  // Normal: rebias the exponent and round the 20 dropped mantissa bits to nearest even.
  const uint32_t odd = (u >> 20) & 1u;
  u += (uint32_t(7 - 127) << 23) + 0x7ffffu + odd;
  return sign | uint8_t(u >> 20);
}

SOLTRAIN_HOST_DEVICE inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24, exp = (b >> 3) & 0xf, man = b & 7;
  if (exp == 0xf && man == 7) return float_of(sign | 0x7fc00000u);
  if (exp == 0) return float_of(sign | bits_of(float(man) * 0.001953125f));  // man · 2^-9, exact
  return float_of(sign | ((exp + 120) << 23) | (man << 20));
}

// fp32 → E5M2 (IEEE-like: inf = S.11111.00, NaN above it).
SOLTRAIN_HOST_DEVICE inline uint8_t f32_to_e5m2(float f, bool saturate) {
  uint32_t u = bits_of(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7f;
  if (saturate && u >= bits_of(kE5m2Max)) return sign | 0x7b;
  if (u >= (143u << 23)) return sign | 0x7c;  // 2^16 and up (inf too): inf; [61440, 65536) rounds there below
  if (u < (113u << 23)) {                     // below 2^-14: subnormal steps of 2^-16
    const uint32_t denorm = 134u << 23;
    return sign | uint8_t(bits_of(add_rn(float_of(u), float_of(denorm))) - denorm);
  }
  const uint32_t odd = (u >> 21) & 1u;
  u += (uint32_t(15 - 127) << 23) + 0xfffffu + odd;
  return sign | uint8_t(u >> 21);
}

SOLTRAIN_HOST_DEVICE inline float e5m2_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24, exp = (b >> 2) & 0x1f, man = b & 3;
  if (exp == 0x1f) return float_of(sign | (man ? 0x7fc00000u : 0x7f800000u));
  if (exp == 0) return float_of(sign | bits_of(float(man) * 1.52587890625e-05f));  // man · 2^-16, exact
  return float_of(sign | ((exp + 112) << 23) | (man << 21));
}

// ---- Per-tensor FP8 (the fp8-hybrid recipe) ----
// TransformerEngine's compute_scale_from_amax: scale = fp8_max / amax, 1 when amax is 0, inf or NaN (nothing
// usable seen), FLT_MAX when the quotient overflows. scale_inv = 1 / scale is what a GEMM multiplies by.
SOLTRAIN_HOST_DEVICE inline float fp8_scale_from_amax(float amax, float fp8_max) {
  if (!(amax > 0.0f) || !(amax <= 3.4028234663852886e38f)) return 1.0f;
#ifdef __CUDA_ARCH__
  const float s = __fdiv_rn(fp8_max, amax);
#else
  const float s = fp8_max / amax;
#endif
  return s <= 3.4028234663852886e38f ? s : 3.4028234663852886e38f;
}
SOLTRAIN_HOST_DEVICE inline float reciprocal_rn(float s) {
#ifdef __CUDA_ARCH__
  return __frcp_rn(s);
#else
  return 1.0f / s;
#endif
}
// One value's code: x · scale rounded once to fp32, then to the format, saturating (never NaN from range).
SOLTRAIN_HOST_DEVICE inline uint8_t fp8_encode(float x, float scale, bool e5m2) {
  const float v = mul_rn(x, scale);
  return e5m2 ? f32_to_e5m2(v, true) : f32_to_e4m3(v, true);
}
SOLTRAIN_HOST_DEVICE inline float fp8_decode(uint8_t b, bool e5m2) {
  return e5m2 ? e5m2_to_f32(b) : e4m3_to_f32(b);
}

// ---- Fp8Block ----
constexpr int64_t kFp8Tile = 128;

SOLTRAIN_HOST_DEVICE inline float fp8_block_value(const uint8_t* q, const float* scale_inv, int64_t cols, int64_t r,
                                                  int64_t c) {
  const int64_t tiles_per_row = (cols + kFp8Tile - 1) / kFp8Tile;
  return mul_rn(e4m3_to_f32(q[r * cols + c]), scale_inv[(r / kFp8Tile) * tiles_per_row + c / kFp8Tile]);
}

// ---- NF4 ----
constexpr int64_t kNf4Block = 64, kNf4NestedBlock = 256;

// bitsandbytes' NF4 code book (get_4bit_type("nf4"), csrc/kernels.cu nf4_dequantization_lut), as fp32.
SOLTRAIN_HOST_DEVICE inline float nf4_code(int i) {
  const float code[16] = {-1.0f,
                          -0.6961928009986877f,
                          -0.5250730514526367f,
                          -0.39491748809814453f,
                          -0.28444138169288635f,
                          -0.18477343022823334f,
                          -0.09105003625154495f,
                          0.0f,
                          0.07958029955625534f,
                          0.16093020141124725f,
                          0.24611230194568634f,
                          0.33791524171829224f,
                          0.44070982933044434f,
                          0.5626170039176941f,
                          0.7229568362236023f,
                          1.0f};
  return code[i & 15];
}

// Where a weight of n elements keeps its NF4 scales: one byte blob (one allocation and one pointer per
// weight, what the kernel takes): [mean of the absmaxes f32][the signed dynamic map, 256 f32][nested absmax,
// f32 per 256 blocks][absmax codes, u8 per 64-element block]. The floats come first, so they stay aligned.
struct Nf4Layout {
  int64_t n, blocks, nested;
  SOLTRAIN_HOST_DEVICE explicit Nf4Layout(int64_t numel)
      : n(numel),
        blocks((numel + kNf4Block - 1) / kNf4Block),
        nested((blocks + kNf4NestedBlock - 1) / kNf4NestedBlock) {}
  SOLTRAIN_HOST_DEVICE int64_t data_bytes() const { return (n + 1) / 2; }
  SOLTRAIN_HOST_DEVICE int64_t nested_offset() const { return 4 * (1 + 256); }  // in bytes
  SOLTRAIN_HOST_DEVICE int64_t codes_offset() const { return nested_offset() + 4 * nested; }
  SOLTRAIN_HOST_DEVICE int64_t scale_bytes() const { return codes_offset() + blocks; }
};

// Block b's absmax as bitsandbytes' dequantize_4bit rebuilds it: dequantize_blockwise (map[q]·nested, fp32)
// then `absmax += offset` (a second rounding).
SOLTRAIN_HOST_DEVICE inline float nf4_absmax(const uint8_t* scale, const Nf4Layout& l, int64_t b) {
  const float* f = reinterpret_cast<const float*>(scale);
  const float* nested = reinterpret_cast<const float*>(scale + l.nested_offset());
  const uint8_t q = scale[l.codes_offset() + b];
  return add_rn(mul_rn(f[1 + q], nested[b / kNf4NestedBlock]), f[0]);
}

// Element i given its block's absmax: code · absmax in fp32 (then the caller's dtype).
SOLTRAIN_HOST_DEVICE inline float nf4_value(const uint8_t* data, int64_t i, float absmax) {
  const uint8_t byte = data[i / 2];
  return mul_rn(nf4_code((i & 1) ? (byte & 15) : (byte >> 4)), absmax);
}

// ---- Int8Row ----
constexpr float kInt8Recip = 7.874015718698502e-3f;  // bitsandbytes' 1/127 (a Python float, applied in fp32)

SOLTRAIN_HOST_DEVICE inline float int8_row_value(const uint8_t* q, const float* absmax, int64_t cols, int64_t r,
                                                 int64_t c) {
  return mul_rn(mul_rn(float(int8_t(q[r * cols + c])), absmax[r]), kInt8Recip);
}

// ---- Nvfp4 ----
// The scale blob of an [rows, cols] weight: the fp32 tensor scale at byte 0, the E4M3 block scales [rows, cols/16]
// from byte kNvfp4BlockScalesAt.
constexpr int64_t kNvfp4Block = 16, kNvfp4BlockScalesAt = 16;
SOLTRAIN_HOST_DEVICE inline int64_t nvfp4_scale_bytes(int64_t rows, int64_t cols) {
  return kNvfp4BlockScalesAt + rows * (cols / kNvfp4Block);
}
SOLTRAIN_HOST_DEVICE inline float e2m1_to_f32(uint8_t code) {
  const uint8_t m = code & 7;
  const float v = m < 4 ? 0.5f * float(m) : (m == 4 ? 2.0f : m == 5 ? 3.0f : m == 6 ? 4.0f : 6.0f);
  return (code & 8) ? -v : v;
}
// The code of an E2M1 value (e2m1_round's output).
SOLTRAIN_HOST_DEVICE inline uint8_t e2m1_code(float v) {
  const float a = v < 0 ? -v : v;
  const uint8_t m = a < 2.0f ? uint8_t(a * 2.0f) : (a == 2.0f ? 4 : a == 3.0f ? 5 : a == 4.0f ? 6 : 7);
  return uint8_t((bits_of(v) >> 28) & 8) | m;
}
SOLTRAIN_HOST_DEVICE inline float nvfp4_value(const uint8_t* data, const uint8_t* scale, int64_t cols, int64_t r,
                                              int64_t c) {
  const int64_t i = r * cols + c;
  const uint8_t byte = data[i / 2];
  float tensor_scale;
  memcpy(&tensor_scale, scale, 4);
  const uint8_t block = scale[kNvfp4BlockScalesAt + r * (cols / kNvfp4Block) + c / kNvfp4Block];
  return mul_rn(e2m1_to_f32((i & 1) ? (byte >> 4) : (byte & 15)), mul_rn(tensor_scale, e4m3_to_f32(block)));
}

}  // namespace soltrain::quant
