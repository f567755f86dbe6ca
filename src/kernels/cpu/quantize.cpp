#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <thread>

#include "kernels/blockwise8.h"
#include "kernels/fake_quant.h"
#include "kernels/quant.h"

namespace soltrain {

namespace {
// bitsandbytes scales by the reciprocal of the absmax clamped to 1e-38 (so an all-zero block gives zeros),
// then clamps to [-1, 1]: `A * (1.0 / absmax.clamp(min=1e-38))`, in fp32.
float scaled(float x, float inv) {
  return std::clamp(x * inv, -1.0f, 1.0f);
}
float reciprocal(float absmax) {
  return 1.0f / std::max(absmax, 1e-38f);
}
// fn(begin, end) over n items of `values` values each, in contiguous chunks on the machine's cores:
// quantising runs on load once per weight (a Qwen3-8B projection holds 50M values); chunks write disjoint
// outputs, and a chunk is at least ~256K values so small weights stay on one thread.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t values, Fn fn) {
  const int64_t threads =
      std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n * values / (int64_t(1) << 18) + 1);
  if (threads <= 1) return fn(int64_t(0), n);
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&fn, t, chunk, n] { fn(std::min(n, t * chunk), std::min(n, (t + 1) * chunk)); });
  for (std::thread& th : pool) th.join();
}
// The NF4 code of a scaled value: torch.bucketize(right=False), how many midpoints lie strictly below it.
uint8_t code_of(float s, const std::array<float, 15>& mid) {
  int lo = 0, hi = 15;
  while (lo < hi) {
    const int m = (lo + hi) / 2;
    if (mid[size_t(m)] < s)
      lo = m + 1;
    else
      hi = m;
  }
  return uint8_t(lo);
}
// The 15 midpoints between neighbouring NF4 codes, computed in fp32 as torch does ((code[:-1] + code[1:]) / 2).
std::array<float, 15> nf4_midpoints() {
  std::array<float, 15> mid{};
  for (int i = 0; i < 15; ++i) mid[size_t(i)] = (quant::nf4_code(i) + quant::nf4_code(i + 1)) / 2.0f;
  return mid;
}
// A 64-value block's absmax (its scale) and each value's NF4 code, given to emit(i, code).
template <typename Emit>
float nf4_block(const float* x, int64_t begin, int64_t end, const std::array<float, 15>& mid, Emit emit) {
  float m = 0;
  for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(x[i]));
  const float inv = reciprocal(m);
  for (int64_t i = begin; i < end; ++i) emit(i, code_of(scaled(x[i], inv), mid));
  return m;
}
}  // namespace

void nf4_round_trip(const float* x, int64_t n, float* out) {
  const std::array<float, 15> mid = nf4_midpoints();
  const int64_t blocks = (n + quant::kNf4Block - 1) / quant::kNf4Block;
  parallel_chunks(blocks, quant::kNf4Block, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * quant::kNf4Block, end = std::min(n, begin + quant::kNf4Block);
      // (codes first, then code · absmax once the block's absmax is known)
      const float m = nf4_block(x, begin, end, mid, [&](int64_t i, uint8_t q) { out[i] = quant::nf4_code(q); });
      for (int64_t i = begin; i < end; ++i) out[i] *= m;
    }
  });
}

void nf4_quantize(const float* x, int64_t n, uint8_t* data, uint8_t* scale) {
  const quant::Nf4Layout l(n);
  const std::array<float, 15> mid = nf4_midpoints();
  std::vector<float> absmax(size_t(l.blocks));
  std::fill(data, data + l.data_bytes(), uint8_t(0));
  // An odd count leaves the last byte's low nibble over: bitsandbytes (quantize_4bit) pads the codes with index
  // 0 there (torch.cat with a zero code, not the code of 0.0); the zero fill above does the same.
  // Blocks are 64 values, 32 whole bytes: chunks of blocks write disjoint bytes.
  parallel_chunks(l.blocks, quant::kNf4Block, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * quant::kNf4Block, end = std::min(n, begin + quant::kNf4Block);
      absmax[size_t(b)] =
          nf4_block(x, begin, end, mid, [&](int64_t i, uint8_t q) { data[i / 2] |= (i & 1) ? q : uint8_t(q << 4); });
    }
  });
  // Double quantisation: the absmaxes less their mean, blockwise 8-bit over 256 blocks with the signed map.
  double sum = 0;
  for (float a : absmax) sum += a;
  const float offset = float(sum / double(l.blocks));
  const std::array<float, 256> map = dynamic_quant_map(true);
  std::array<float, 255> map_mid{};
  for (int i = 0; i < 255; ++i) map_mid[size_t(i)] = (map[size_t(i)] + map[size_t(i) + 1]) / 2.0f;
  float* f = reinterpret_cast<float*>(scale);
  f[0] = offset;
  std::copy(map.begin(), map.end(), f + 1);
  float* nested = reinterpret_cast<float*>(scale + l.nested_offset());
  uint8_t* codes = scale + l.codes_offset();
  for (int64_t j = 0; j < l.nested; ++j) {
    const int64_t begin = j * quant::kNf4NestedBlock, end = std::min(l.blocks, begin + quant::kNf4NestedBlock);
    float m = 0;
    for (int64_t b = begin; b < end; ++b) m = std::max(m, std::fabs(absmax[size_t(b)] - offset));
    nested[j] = m;
    const float inv = reciprocal(m);
    for (int64_t b = begin; b < end; ++b)
      codes[b] = quantize_to_map(scaled(absmax[size_t(b)] - offset, inv), map_mid.data());
  }
}

void nf4_dequantize(const uint8_t* data, const uint8_t* scale, int64_t n, float* out) {
  const quant::Nf4Layout l(n);
  for (int64_t b = 0; b < l.blocks; ++b) {
    const float absmax = quant::nf4_absmax(scale, l, b);
    const int64_t begin = b * quant::kNf4Block, end = std::min(n, begin + quant::kNf4Block);
    for (int64_t i = begin; i < end; ++i) out[i] = quant::nf4_value(data, i, absmax);
  }
}

void fp8_block_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale_inv) {
  const int64_t T = quant::kFp8Tile, tr = (rows + T - 1) / T, tc = (cols + T - 1) / T;
  parallel_chunks(tr * tc, T * T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bi = t / tc, bj = t % tc;
      const int64_t r1 = std::min(rows, (bi + 1) * T), c1 = std::min(cols, (bj + 1) * T);
      float amax = 0;
      for (int64_t r = bi * T; r < r1; ++r)
        for (int64_t c = bj * T; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      // transformers writes fp8_max / amax with a Python float over a tensor: torch's rdiv is reciprocal then
      // multiply (two roundings), and the scale_inv stored is that scale's reciprocal.
      const float s = amax > 0 ? (1.0f / amax) * quant::kE4m3Max : 1.0f;
      for (int64_t r = bi * T; r < r1; ++r)
        for (int64_t c = bj * T; c < c1; ++c) q[r * cols + c] = quant::f32_to_e4m3(x[r * cols + c] * s, true);
      scale_inv[bi * tc + bj] = 1.0f / s;
    }
  });
}

void fp8_block_dequantize(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = quant::fp8_block_value(q, scale_inv, cols, r, c);
}

void int8_row_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* absmax) {
  parallel_chunks(rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = x + r * cols;
      float m = 0;
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, std::fabs(row[c]));
      absmax[r] = m;
      // torch's 127.0 / row_stats (a Python float over a tensor) is rdiv: reciprocal, then times 127 (two roundings)
      const float s = m > 0 ? (1.0f / m) * 127.0f : 0.0f;
      for (int64_t c = 0; c < cols; ++c)  // torch.round: to nearest, ties to even (the default mode)
        q[r * cols + c] = uint8_t(int8_t(std::nearbyint(row[c] * s)));
    }
  });
}

void int8_row_dequantize(const uint8_t* q, const float* absmax, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = quant::int8_row_value(q, absmax, cols, r, c);
}

void nvfp4_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* data, uint8_t* scale) {
  float amax = 0;
  for (int64_t i = 0, n = rows * cols; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float tensor_scale = fq::nv_tensor_scale(amax);
  std::memcpy(scale, &tensor_scale, 4);
  std::fill(scale + 4, scale + quant::kNvfp4BlockScalesAt, uint8_t(0));
  const int64_t per_row = cols / quant::kNvfp4Block;
  parallel_chunks(rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < per_row; ++b) {
        const float* v = x + r * cols + b * quant::kNvfp4Block;
        float m = 0;
        for (int64_t k = 0; k < quant::kNvfp4Block; ++k) m = std::max(m, std::fabs(v[k]));
        const fq::NvParams p = fq::nv_params(m, tensor_scale, false);
        // the block's E4M3 scale as nv_params rounded it (its value is tensor_scale · block; 0 for an all-zero tensor)
        const float s =
            tensor_scale > 0 ? fq::clampf(fq::div_rn(fq::div_rn(m, 6.0f), tensor_scale), 0.001953125f, 448.0f) : 0.0f;
        scale[quant::kNvfp4BlockScalesAt + r * per_row + b] = quant::f32_to_e4m3(s, false);
        for (int64_t k = 0; k < quant::kNvfp4Block; ++k) {
          const int64_t i = r * cols + b * quant::kNvfp4Block + k;
          const uint8_t code = quant::e2m1_code(fq::e2m1_round(fq::clampf(quant::mul_rn(v[k], p.mul), -6.0f, 6.0f)));
          data[i / 2] = (i & 1) ? uint8_t((data[i / 2] & 15) | (code << 4)) : uint8_t((data[i / 2] & 0xf0) | code);
        }
      }
  });
}

void nvfp4_dequantize(const uint8_t* data, const uint8_t* scale, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = quant::nvfp4_value(data, scale, cols, r, c);
}

}  // namespace soltrain
