// Element types of tensors and their conversions to fp32 (bf16/f16 are widened on the CPU).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace soltrain {

// F64: device-side scalars (loss, norms); U8: codes of 8-bit quantised optimizer state and NF4 weights;
// F8E4M3 / F8E5M2: FP8 weights (safetensors' F8_E4M3 / F8_E5M2, torch's float8_e4m3fn / float8_e5m2)
enum class DType { F32, BF16, F16, I32, I64, F64, U8, F8E4M3, F8E5M2 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
// Round to nearest even, as torch does; NaN stays NaN, overflow is inf.
uint16_t f32_to_f16(float f);

// fp32 values stored as `to` (F32, BF16 or F16), each rounded to nearest even as torch's .to() does.
void encode_f32(const float* src, size_t n, DType to, void* dst);

// torch's names of the floating types a model is stored in ("bfloat16", ...), as config.json's dtype says them.
std::string_view torch_dtype_name(DType t);
// "float32"/"bfloat16"/"float16" (and torch's aliases "float"/"half"): nothing for any other name.
std::optional<DType> dtype_from_torch_name(std::string_view name);

}  // namespace soltrain
