// Fake quantisation for quantisation-aware training (QAT; Axolotl's `qat:` block over torchao 0.17's QAT):
// a tensor is quantised and dequantised in place of itself, so the forward computes with the values a
// quantised model will hold, and the backward passes the gradient straight through (STE). One definition for
// the host (the CPU twin) and the device, with torchao's arithmetic step for step:
//   Int4Weight: Int4WeightFakeQuantizer with bf16 activations (fake_quantizer.py, MSLK's int4 row quantiser):
//     per group of `group` weights in fp32, scale = max(max - min, 1e-6) / 15, zero = min + 8·scale,
//     C = clamp(round((w - min) / scale), 0, 15), w' = (C - 8)·scale + zero. Its scale and minimum are not
//     detached, so the gradient is the straight-through one plus, at the group's max and min,
//     ±Σ g·(C - (w - min)/scale) / 15 (divided among tied extremes, as amax/amin's gradients are).
//   Int8Token: IntxFakeQuantizer(int8, per_token, asymmetric): per row, with choose_qparams_affine's no-grad
//     qparams in the tensor's dtype (bf16 rounds them, its eps 2^-7): lo = min(min, 0), hi = max(max, 0),
//     scale = max((hi - lo) / 255, eps), zero = clamp(-128 - round(lo / scale), -128, 127);
//     q = clamp(round(x · (1 / scale)) + zero, -128, 127), x' = (q - zero)·scale. The gradient passes where
//     the clamp did not bind.
//   Mxfp4: MXFakeQuantizeConfig(float4_e2m1fn_x2, block 32, RCEIL) as MXTensor.to_mx computes it: per block of
//     32, e = clamp(ceil(log2(amax / 6)), -127, 127) + 127, elements x · 2^(127 - e) (1 when e is 0) clamped
//     to ±6 and rounded to E2M1 (nearest, ties to the even code), x' = code · 2^(e - 127).
//   Nvfp4: NVFP4FakeQuantizeConfig with its per-tensor scale (NVFP4Tensor.to_nvfp4): t = amax(|x|) / (448·6)
//     over the whole tensor, per block of 16 s = E4M3(clamp((amax_block / 6) / t, 2^-9, 448)), elements
//     x · ((1 / t) / s) clamped to ±6 and rounded to E2M1, x' = code · (t·s) (t·s rounded to bf16 first for
//     a bf16 tensor, as torchao's get_hp_scales multiplies in the tensor's dtype).
//   Mxfp4 and Nvfp4 are straight-through in backward (torchao's autograd functions multiply the gradients by
//   the dequantised operands).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/quant.h"

namespace soltrain {

enum class FakeQuantKind : uint8_t { Off, Int4Weight, Int8Token, Mxfp4, Nvfp4 };

struct FakeQuant {
  FakeQuantKind kind = FakeQuantKind::Off;
  int group = 0;  // values sharing one scale along the last dimension (a row for Int8Token)
  bool on() const { return kind != FakeQuantKind::Off; }
  // The group length over rows `cols` long.
  SOLTRAIN_HOST_DEVICE int64_t group_of(int64_t cols) const {
    return kind == FakeQuantKind::Int8Token ? cols : int64_t(group);
  }
};

namespace fq {

SOLTRAIN_HOST_DEVICE inline float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
SOLTRAIN_HOST_DEVICE inline float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
// torch.round: half to even.
SOLTRAIN_HOST_DEVICE inline float round_even(float x) {
  return rintf(x);
}
// fp32 → bf16 → fp32, nearest even (torch's rounding of a bf16 tensor op's fp32 result).
SOLTRAIN_HOST_DEVICE inline float to_bf16(float x) {
  uint32_t u = quant::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u += 0x7fffu + ((u >> 16) & 1u);
  return quant::float_of(u & 0xffff0000u);
}
SOLTRAIN_HOST_DEVICE inline float clampf(float x, float lo, float hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// E2M1's value nearest |x| ≤ 6 (ties to the even code: 0, .5, 1, 1.5, 2, 3, 4, 6 are codes 0..7), signed.
SOLTRAIN_HOST_DEVICE inline float e2m1_round(float x) {
  const float a = fabsf(x);
  float v;
  if (a <= 0.25f)
    v = 0.0f;
  else if (a < 0.75f)
    v = 0.5f;
  else if (a <= 1.25f)
    v = 1.0f;
  else if (a < 1.75f)
    v = 1.5f;
  else if (a <= 2.5f)
    v = 2.0f;
  else if (a < 3.5f)
    v = 3.0f;
  else if (a <= 5.0f)
    v = 4.0f;
  else
    v = 6.0f;
  return x < 0 ? -v : v;
}

// ---- Int4Weight: one group's parameters from its min and max ----
struct Int4Params {
  float lo, scale, zero;
  bool span_clamped;  // max - min below 1e-6: the clamp stops the gradient to the extremes
};
SOLTRAIN_HOST_DEVICE inline Int4Params int4_params(float lo, float hi) {
  const float span = sub_rn(hi, lo);
  const bool clamped = span < 1e-6f;
  const float scale = div_rn(clamped ? 1e-6f : span, 15.0f);
  return {lo, scale, quant::add_rn(lo, quant::mul_rn(scale, 8.0f)), clamped};
}
SOLTRAIN_HOST_DEVICE inline float int4_ratio(float w, const Int4Params& p) {
  return div_rn(sub_rn(w, p.lo), p.scale);
}
SOLTRAIN_HOST_DEVICE inline float int4_code(float w, const Int4Params& p) {
  return clampf(round_even(int4_ratio(w, p)), 0.0f, 15.0f);
}
SOLTRAIN_HOST_DEVICE inline float int4_value(float w, const Int4Params& p) {
  return quant::add_rn(quant::mul_rn(int4_code(w, p) - 8.0f, p.scale), p.zero);
}
SOLTRAIN_HOST_DEVICE inline bool int4_passes(float w, const Int4Params& p) {
  const float r = round_even(int4_ratio(w, p));
  return r >= 0.0f && r <= 15.0f;
}

// ---- Int8Token: one row's parameters from its min and max (`bf16`: the tensor is bf16) ----
struct Int8Params {
  float scale, inv, zero;
};
SOLTRAIN_HOST_DEVICE inline Int8Params int8_params(float mn, float mx, bool bf16) {
  const float lo = mn < 0.0f ? mn : 0.0f, hi = mx > 0.0f ? mx : 0.0f;
  float span = sub_rn(hi, lo);
  if (bf16) span = to_bf16(span);
  float scale = div_rn(span, 255.0f);
  if (bf16) scale = to_bf16(scale);
  const float eps = bf16 ? 0.0078125f : 1.1920928955078125e-07f;
  if (scale < eps) scale = eps;
  float t = div_rn(lo, scale);
  if (bf16) t = to_bf16(t);
  const float zero = clampf(-128.0f - round_even(t), -128.0f, 127.0f);
  return {scale, div_rn(1.0f, scale), zero};
}
SOLTRAIN_HOST_DEVICE inline float int8_unclamped(float x, const Int8Params& p) {
  return round_even(quant::mul_rn(x, p.inv)) + p.zero;
}
SOLTRAIN_HOST_DEVICE inline float int8_value(float x, const Int8Params& p) {
  const float q = clampf(int8_unclamped(x, p), -128.0f, 127.0f);
  return quant::mul_rn(q - p.zero, p.scale);
}
SOLTRAIN_HOST_DEVICE inline bool int8_passes(float x, const Int8Params& p) {
  const float q = int8_unclamped(x, p);
  return q >= -128.0f && q <= 127.0f;
}

// ---- Mxfp4: one block's exponent from its amax ----
struct MxParams {
  float mul, scale;  // x · mul is rounded to E2M1; the code times `scale` is the value
};
SOLTRAIN_HOST_DEVICE inline MxParams mx_params(float amax) {
  const float descale = div_rn(amax, 6.0f);
  if (descale != descale) return {NAN, NAN};
  const float e = clampf(ceilf(log2f(descale)), -127.0f, 127.0f) + 127.0f;
  return {e == 0.0f ? 1.0f : exp2f(127.0f - e), exp2f(e - 127.0f)};
}
SOLTRAIN_HOST_DEVICE inline float mx_value(float x, const MxParams& p) {
  return quant::mul_rn(e2m1_round(clampf(quant::mul_rn(x, p.mul), -6.0f, 6.0f)), p.scale);
}

// ---- Nvfp4: the tensor's scale from its amax, then one block's from the block's ----
SOLTRAIN_HOST_DEVICE inline float nv_tensor_scale(float amax) {
  return div_rn(amax, 2688.0f);  // 448 · 6
}
struct NvParams {
  float mul, scale;
};
SOLTRAIN_HOST_DEVICE inline NvParams nv_params(float block_amax, float tensor_scale, bool bf16) {
  if (!(tensor_scale > 0.0f)) return {0.0f, 0.0f};  // an all-zero tensor (torchao divides by zero there)
  const float s = clampf(div_rn(div_rn(block_amax, 6.0f), tensor_scale), 0.001953125f, 448.0f);
  const float s8 = quant::e4m3_to_f32(quant::f32_to_e4m3(s, false));
  float scale = quant::mul_rn(tensor_scale, s8);
  if (bf16) scale = to_bf16(scale);
  return {div_rn(div_rn(1.0f, tensor_scale), s8), scale};
}
SOLTRAIN_HOST_DEVICE inline float nv_value(float x, const NvParams& p) {
  return quant::mul_rn(e2m1_round(clampf(quant::mul_rn(x, p.mul), -6.0f, 6.0f)), p.scale);
}

}  // namespace fq
}  // namespace soltrain
