#include "train/mfu.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

namespace soltrain {

double model_flops_per_token(const ModelConfig& c, int seq_len, bool lora) {
  const double D = c.hidden_size, F = c.intermediate_size, L = c.num_layers;
  const double per_layer = D * c.q_dim() + 2 * D * c.kv_dim() + c.q_dim() * D + 3 * D * F;
  const double N = L * per_layer + double(c.vocab_size) * D;
  const double attention = 12.0 * L * c.num_heads * c.head_dim * seq_len;
  return (lora ? 4 : 6) * N + attention;
}

double measure_matmul_tflops(Ops& ops) {
  const int64_t n = ops.device() == Device::CPU ? 1024 : 8192;
  const DType dt = ops.activation_dtype();
  // Random operands: zeros run measurably faster on some GPUs and would flatter the roof.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> host(size_t(n * n));
  for (float& x : host) x = nd(rng);
  Buffer staging = ops.alloc(host.size() * 4), a = ops.alloc(host.size() * dtype_size(dt)),
         b = ops.alloc(host.size() * dtype_size(dt)), c = ops.alloc(host.size() * dtype_size(dt));
  const Tensor s{staging.data(), DType::F32, {n, n}, ops.device()};
  ops.copy(s, Tensor{host.data(), DType::F32, {n, n}, Device::CPU});
  const Tensor ta{a.data(), dt, {n, n}, ops.device()}, tb{b.data(), dt, {n, n}, ops.device()};
  ops.convert(ta, s);
  ops.convert(tb, s);
  const Tensor tc{c.data(), dt, {n, n}, ops.device()};
  std::vector<double> times;
  for (int i = 0; i < 8; ++i) {
    ops.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    ops.linear_forward(tc, ta, tb, nullptr);
    ops.synchronize();
    if (i >= 3) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return 2.0 * double(n) * double(n) * double(n) / times[times.size() / 2] / 1e12;
}

}  // namespace soltrain
