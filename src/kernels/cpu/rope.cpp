// CPU: rotary position embedding, half-rotation layout (rotate_half), angles in fp32 as transformers.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::rope(Tensor x, const SeqLayout& seq, const Tensor& inv_freq, bool inverse) {
  const int64_t N = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = hd / 2;
  const int32_t* pos = seq.positions.i32();
  const float* inv = inv_freq.f32();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(pos[n]) * inv[i];  // one fp32 product, as torch's fp32 matmul gives
      const float c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.f32() + (n * heads + h) * hd;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace soltrain
