#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace soltrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F64: return 8;
    case DType::U8: return 1;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    case DType::U8: return "U8";
    case DType::F8E4M3: return "F8_E4M3";
    case DType::F8E5M2: return "F8_E5M2";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) {
  if (n == "F32") return DType::F32;
  if (n == "BF16") return DType::BF16;
  if (n == "F16") return DType::F16;
  if (n == "I32") return DType::I32;
  if (n == "I64") return DType::I64;
  if (n == "F64") return DType::F64;
  if (n == "U8") return DType::U8;
  if (n == "F8_E4M3") return DType::F8E4M3;
  if (n == "F8_E5M2") return DType::F8E5M2;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(float(mant), -24);  // subnormal
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(float(mant | 0x400), int(exp) - 25);
  return sign ? -v : v;
}

void encode_f32(const float* src, size_t n, DType to, void* dst) {
  if (to == DType::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  auto* o = static_cast<uint16_t*>(dst);
  if (to == DType::BF16) {
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(src[i]);
    return;
  }
  SOLTRAIN_CHECK(to == DType::F16, "encode_f32 into ", dtype_name(to));
  for (size_t i = 0; i < n; ++i) o[i] = f32_to_f16(src[i]);
}

uint16_t f32_to_f16(float value) {
  // Round to nearest even, as torch's .half() (F. Giesen's float_to_half_rtne; no _Float16, which older
  // compilers lack on x86). Subnormal results come from one float addition, rounded by the FPU itself.
  auto bits = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  };
  auto from_bits = [](uint32_t u) {
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  uint32_t f = bits(value);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t out;
  if (f >= (127u + 16u) << 23) {  // 65536 and above, inf, NaN
    out = f > 255u << 23 ? 0x7e00 : 0x7c00;
  } else if (f < 113u << 23) {  // below 2^-14: a subnormal half (or zero)
    const float magic = from_bits(((127u - 15u) + (23u - 10u) + 1u) << 23);
    out = uint16_t(bits(from_bits(f) + magic) - bits(magic));
  } else {
    const uint32_t odd = (f >> 13) & 1u;
    f += ((15u - 127u) << 23) + 0xfffu + odd;
    out = uint16_t(f >> 13);
  }
  return uint16_t(out | (sign >> 16));
}

std::string_view torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: return "float32";
  }
}

std::optional<DType> dtype_from_torch_name(std::string_view n) {
  if (n == "float32" || n == "float") return DType::F32;
  if (n == "bfloat16") return DType::BF16;
  if (n == "float16" || n == "half") return DType::F16;
  return std::nullopt;
}

}  // namespace soltrain
