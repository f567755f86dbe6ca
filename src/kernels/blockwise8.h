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
#ifdef __CUDACC__
__host__ __device__
#endif
    inline uint8_t
    quantize_to_map(float x, const float* midpoints) {
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

}  // namespace soltrain
