// 8-bit blockwise quantisation of optimizer state, as bitsandbytes' 8-bit Adam stores it (its CPU backend,
// bitsandbytes/backends/cpu/ops.py `_optimizer_update_8bit_blockwise_cpu`, and default/ops.py
// `quantize_blockwise`): each moment is a byte indexing a 256-entry "dynamic" map of values in [-1, 1]
// (m: signed map, v: unsigned), times one fp32 absmax per block of 256 elements. Quantising takes the
// block's max |x|, scales by its reciprocal, clamps to [-1, 1] and picks the nearest map entry (a value on a
// midpoint goes to the lower one: torch.bucketize). Tensors under 4096 elements keep fp32 moments.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/quant.h"  // SOLTRAIN_HOST_DEVICE, bits_of / float_of

namespace soltrain {

constexpr int64_t kBlockwise8Block = 256;
constexpr int64_t kBlockwise8MinNumel = 4096;  // bitsandbytes' min_8bit_size

namespace blockwise8_detail {
// torch.linspace(start, end, steps) in fp32 (aten's vectorised CPU kernel): the first half counts up from
// start, the second half down from end, with step = (end - start) / (steps - 1), each value one fused
// multiply-add (rounded once; two roundings differ from torch in the last bit of 42 of the 256 map values).
inline std::vector<float> linspace_f32(float start, float end, int steps) {
  std::vector<float> out(static_cast<size_t>(steps));
  const float step = (end - start) / float(steps - 1);
  const int halfway = steps / 2;
  for (int i = 0; i < steps; ++i)
    out[size_t(i)] = i < halfway ? std::fma(step, float(i), start) : std::fma(-step, float(steps - i - 1), end);
  return out;
}
}  // namespace blockwise8_detail

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), sorted ascending: for exponent
// level i = 0..6 the midpoints of linspace(0.1, 1, 2^i + 1) (signed: both signs) or of linspace(0.1, 1,
// 2^(i+1) + 1) (unsigned), times 10^(i-6), plus 0 and 1. Computed in fp32 the way torch does.
inline std::array<float, 256> dynamic_quant_map(bool is_signed) {
  std::vector<float> data;
  constexpr int kExponentBits = 7;
  for (int i = 0; i < kExponentBits; ++i) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const std::vector<float> b = blockwise8_detail::linspace_f32(0.1f, 1.0f, items);
    const float scale = float(std::pow(10.0, double(i - (kExponentBits - 1))));  // a Python float, to fp32
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const float mean = (b[k] + b[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-(scale * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  std::copy_n(data.begin(), 256, out.begin());
  return out;
}

// The nearest map entry's index for x already scaled into [-1, 1] (`midpoints` = (map[i] + map[i+1]) / 2).
SOLTRAIN_HOST_DEVICE inline uint8_t quantize_to_map(float x, const float* midpoints) {
  int lo = 0, hi = 255;  // the answer is the count of midpoints strictly below x
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (midpoints[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return uint8_t(lo);
}

// Quantising without a binary search per value (the GPU's 8-bit AdamW; the binary search above defines the
// result): |x| in [0, 1] falls in one of kQuantBuckets ranges (64 per binade from 2^-27 up; all of [0, 2^-27)
// in bucket 0; 1.0 alone in the last), a table holds per bucket how many midpoints lie below the whole range,
// and a short scan from there counts the rest (a bucket holds at most a few midpoints; the maps' smallest
// midpoint, ~1e-7, is above bucket 0).
constexpr int kQuantBuckets = 27 * 64 + 2;
namespace blockwise8_detail {
using quant::bits_of;
using quant::float_of;
SOLTRAIN_HOST_DEVICE inline int bucket_of(float x) {  // by |x| <= 1 (the sign bit dropped: -0 is 0)
  const uint32_t u = bits_of(x) & 0x7fffffffu;
  const int e = int(u >> 23);
  return e < 127 - 27 ? 0 : (e - (127 - 27)) * 64 + int((u >> 17) & 63) + 1;
}
SOLTRAIN_HOST_DEVICE inline float bucket_low(int b) {
  return b == 0 ? 0.0f : float_of(uint32_t((b - 1) / 64 + 127 - 27) << 23 | uint32_t((b - 1) % 64) << 17);
}
SOLTRAIN_HOST_DEVICE inline float bucket_high(int b) {  // the next bucket's low end
  return b == 0 ? float_of(uint32_t(127 - 27) << 23) : float_of(bits_of(bucket_low(b)) + (1u << 17));
}
}  // namespace blockwise8_detail

// below[0][b]: midpoints below bucket b's lowest |x| (for x >= 0); below[1][b]: midpoints below minus its
// highest (for x < 0).
SOLTRAIN_HOST_DEVICE inline void fill_quant_bucket(uint8_t (*below)[kQuantBuckets], int b, const float* midpoints) {
  below[0][b] = quantize_to_map(blockwise8_detail::bucket_low(b), midpoints);
  below[1][b] = quantize_to_map(-blockwise8_detail::bucket_high(b), midpoints);
}
// quantize_to_map(x, midpoints), from the table filled for those midpoints.
SOLTRAIN_HOST_DEVICE inline uint8_t quantize_bucketed(float x, const float* midpoints,
                                                      const uint8_t (*below)[kQuantBuckets]) {
  int i = below[x < 0.0f][blockwise8_detail::bucket_of(x)];
  while (i < 255 && midpoints[i] < x) ++i;
  return uint8_t(i);
}

}  // namespace soltrain
