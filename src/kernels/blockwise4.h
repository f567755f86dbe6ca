// 4-bit blockwise quantisation of optimizer state, as torchao's AdamW4bit stores it (torchao/optim/subclass_4bit.py,
// quant_utils.py; "Memory Efficient Optimizers with 4-bit States", arXiv:2309.01507): each moment is a 4-bit code
// indexing a 16-entry map, two codes per byte (the even element in the high nibble), times one fp32 scale per block
// of 128 elements (the block's max |x|, at least 1e-12). m's map is the signed dynamic map with 3 exponent bits, v's
// the linear map 1/16 .. 1 without zero. Quantising picks the nearest map entry of x / scale (a value on a midpoint
// goes up), by torchao's own search. Only tensors of 4096 elements or more made of whole blocks are quantised.
#pragma once
#include <cstdint>

#include "kernels/quant.h"  // SOLTRAIN_HOST_DEVICE

namespace soltrain {

constexpr int64_t kBlockwise4Block = 128;

// create_dynamic_map(signed=True, max_exponent_bits=3, total_bits=4) and linspace(0, 1, 17)[1:] as torchao builds
// them in fp32 (the values torchao's tables hold; python/tests/test_torchao_adamw4bit.py compares them).
inline constexpr float kTorchao4SignedMap[16] = {-0.887499988079071f,
                                                 -0.6625000238418579f,
                                                 -0.4375f,
                                                 -0.21249999105930328f,
                                                 -0.07750000059604645f,
                                                 -0.0325000025331974f,
                                                 -0.005499999970197678f,
                                                 0.0f,
                                                 0.005499999970197678f,
                                                 0.0325000025331974f,
                                                 0.07750000059604645f,
                                                 0.21249999105930328f,
                                                 0.4375f,
                                                 0.6625000238418579f,
                                                 0.887499988079071f,
                                                 1.0f};
inline constexpr float kTorchao4UnsignedMap[16] = {0.0625f, 0.125f, 0.1875f, 0.25f, 0.3125f, 0.375f, 0.4375f, 0.5f,
                                                   0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f, 1.0f};

// torchao's quantize_4bit_with_qmap for one value x (already divided by its block's scale): the last entry not above
// x by a four-step binary search, then the next one up when x is at least halfway to it.
SOLTRAIN_HOST_DEVICE inline uint8_t quantize4(float x, const float* map) {
  int code = x >= map[8] ? 8 : 0;
  code += x >= map[code + 4] ? 4 : 0;
  code += x >= map[code + 2] ? 2 : 0;
  code += x >= map[code + 1] ? 1 : 0;
  const int up = code + 1 > 15 ? 15 : code + 1;
  const float down_v = map[code], up_v = map[up];
  return uint8_t(x - down_v >= (up_v - down_v) * 0.5f ? up : code);
}

}  // namespace soltrain
