// CUDA: Mixture-of-Experts routing, token permutation and its inverse, the router's backward and the
// load-balancing loss (model/moe.h; the experts' GEMMs are in grouped_gemm.cu). Everything stays on the device:
// the permutation is a per-warp histogram, a scan and a stable scatter in one block, so no count reaches the
// host. Sums run in a fixed order (no float atomics): results repeat bit for bit.
#include "core/format.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;
using cuda::to_bf;
using cuda::to_f;

namespace {
constexpr int kMaxExperts = 256;            // the routing kernels hold a row's logits in registers
constexpr int kPerLane = kMaxExperts / 32;  // experts per lane of a row's warp
constexpr unsigned kFull = 0xffffffffu;
constexpr float kTaken = -1.0f;  // below every probability: a chosen expert's mark

// One warp per token: softmax over its E logits, then k rounds of a warp argmax (ties to the lower expert).
__global__ void route_kernel(float* probs, int32_t* expert, float* weight, const bf16* logits, int N, int E, int k,
                             bool norm_topk) {
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  float v[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? to_f(logits[n * E + e]) : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  mx = cuda::warp_max(mx);
  float s = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    v[i] = lane + 32 * i < E ? expf(v[i] - mx) : 0.f;
    s += v[i];
  }
  s = cuda::warp_sum(s);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < E)
      probs[n * E + e] = v[i] = v[i] / s;
    else
      v[i] = kTaken;
  }
  float top = 0, mine = 0;  // lane j keeps choice j
  int mine_e = 0;
  for (int j = 0; j < k; ++j) {
    float best = kTaken;
    int idx = E;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (v[i] > best) best = v[i], idx = lane + 32 * i;  // lanes scan their experts in increasing order
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFull, best, o);
      const int oi = __shfl_xor_sync(kFull, idx, o);
      if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == idx) v[i] = kTaken;
    if (lane == j) mine = best, mine_e = idx;  // (every lane holds the same best and idx after the butterfly)
    top += best;
  }
  if (lane < k) expert[n * k + lane] = mine_e, weight[n * k + lane] = norm_topk ? mine / top : mine;
}

// prob_sum[e] += Σ_n probs[n, e]: 32 columns per block, 32 row lanes, added in a fixed order.
__global__ void column_add_kernel(float* prob_sum, const float* probs, int N, int E) {
  __shared__ float part[32][33];
  const int e = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (e < E)
    for (int n = threadIdx.y; n < N; n += 32) s += probs[int64_t(n) * E + e];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && e < E) {
    float t = 0;
    for (int r = 0; r < 32; ++r) t += part[r][threadIdx.x];
    prob_sum[e] += t;
  }
}

// One block of 32 warps: warp w takes the pairs [w·chunk, (w+1)·chunk). Pass 1 counts each warp's pairs per
// expert (lanes with the same expert found by __match_any_sync); the counts become each warp's starting slot
// within each expert and the experts' offsets; pass 2 walks the pairs again in order, giving each its slot:
// stable (pair order within an expert) by construction.
__global__ void __launch_bounds__(1024) permute_kernel(int32_t* rows, int32_t* slot, int32_t* offsets, float* counts,
                                                       const int32_t* expert, int M, int k, int E) {
  __shared__ int cnt[32][kMaxExperts];
  __shared__ int start[kMaxExperts + 1];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < 32 * kMaxExperts; i += blockDim.x) cnt[i / kMaxExperts][i % kMaxExperts] = 0;
  __syncthreads();
  const int chunk = (M + 31) / 32, first = w * chunk, last = min(M, first + chunk);
  const unsigned lower = (1u << lane) - 1;
  for (int base = first; base < last; base += 32) {
    const int i = base + lane;
    const int e = i < last ? expert[i] : -1;
    const unsigned same = __match_any_sync(kFull, e);
    if (e >= 0 && e < E && (same & lower) == 0) cnt[w][e] += __popc(same);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
    for (int v = 0; v < 32; ++v) {
      const int c = cnt[v][e];
      cnt[v][e] = run;
      run += c;
    }
    start[e] = run;  // the expert's total, until the scan below
    counts[e] += float(run);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < E; ++e) {
      const int c = start[e];
      start[e] = run;
      run += c;
    }
    start[E] = run;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = start[e];
  for (int base = first; base < last; base += 32) {
    const int i = base + lane;
    const int e = i < last ? expert[i] : -1;
    const unsigned same = __match_any_sync(kFull, e);
    if (e >= 0 && e < E) {
      const int s = start[e] + cnt[w][e] + __popc(same & lower);
      slot[i] = s;
      rows[s] = i / k;
    }
    __syncwarp();
    if (e >= 0 && e < E && (same & lower) == 0) cnt[w][e] += __popc(same);
    __syncwarp();
  }
}

// out[i] = x[rows[i]], 8 values per thread.
__global__ void gather_kernel(bf16* out, const bf16* x, const int32_t* rows, int64_t M, int64_t D8) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < M * D8; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / D8, c = t % D8 * 8;
    cuda::store8(out + i * D8 * 8 + c, cuda::load8(x + int64_t(rows[i]) * D8 * 8 + c));
  }
}

// out[n] (= or +=) Σ_j weight[n, j] · y[slot[n·k + j]] (weight null: 1), j in order, in fp32.
__global__ void combine_kernel(bf16* out, const bf16* y, const int32_t* slot, const float* weight, int64_t N, int k,
                               int64_t D8, bool accumulate) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < N * D8; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = t / D8, c = t % D8 * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (accumulate) {
      const cuda::Vec8 o = cuda::load8(out + n * D8 * 8 + c);
      for (int d = 0; d < 8; ++d) acc[d] = o[d];
    }
    for (int j = 0; j < k; ++j) {
      const float wj = weight ? weight[n * k + j] : 1.f;
      const cuda::Vec8 r = cuda::load8(y + int64_t(slot[n * k + j]) * D8 * 8 + c);
      for (int d = 0; d < 8; ++d) acc[d] += wj * r[d];
    }
    cuda::Vec8 o;
    for (int d = 0; d < 8; ++d) o.set(d, acc[d]);
    cuda::store8(out + n * D8 * 8 + c, o);
  }
}

// A warp's row of D8·8 values: out = scale · g, and the returned g · r (every lane gets it), both backwards'
// shape (the combine's and the shared gate's).
__device__ float scale_row_and_dot(bf16* out, const bf16* g, const bf16* r, float scale, int64_t D8) {
  const int lane = threadIdx.x % 32;
  float dot = 0;
  for (int64_t c = lane * 8; c < D8 * 8; c += 32 * 8) {
    const cuda::Vec8 gv = cuda::load8(g + c), rv = cuda::load8(r + c);
    cuda::Vec8 o;
    for (int i = 0; i < 8; ++i) {
      o.set(i, scale * gv[i]);
      dot += gv[i] * rv[i];
    }
    cuda::store8(out + c, o);
  }
  return cuda::warp_sum(dot);
}

// One warp per pair (n, j): dy[slot] = weight · dout[n]; dweight = dout[n] · y[slot].
__global__ void combine_backward_kernel(bf16* dy, float* dweight, const bf16* dout, const bf16* y, const int32_t* slot,
                                        const float* weight, int64_t pairs, int k, int64_t D8) {
  const int lane = threadIdx.x % 32;
  const int64_t p = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (p >= pairs) return;
  const int64_t n = p / k, s = slot[p];
  const float dot = scale_row_and_dot(dy + s * D8 * 8, dout + n * D8 * 8, y + s * D8 * 8, weight[p], D8);
  if (lane == 0) dweight[p] = dot;
}

// One warp per token: d loss / d probs (the aux gradient, plus the chosen experts' weights through the top-k
// renormalisation), then through the softmax.
__global__ void router_backward_kernel(bf16* dlogits, const float* dweight, const float* probs, const int32_t* expert,
                                       const float* weight, const float* aux_grad, int N, int E, int k,
                                       bool norm_topk) {
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const float* p = probs + n * E;
  const int32_t* ex = expert + n * k;
  const float* dw = dweight + n * k;
  float dp[kPerLane], pv[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    pv[i] = e < E ? p[e] : 0.f;
    dp[i] = e < E && aux_grad ? aux_grad[e] : 0.f;
  }
  float s = 0, dot = 0;
  if (norm_topk)  // w_j = p_j / S: d p_j = (dw_j − Σ_i dw_i · w_i) / S (in the CPU's order)
    for (int j = 0; j < k; ++j) {
      s += p[ex[j]];
      dot += dw[j] * weight[n * k + j];
    }
  for (int j = 0; j < k; ++j) {
    const float g = norm_topk ? (dw[j] - dot) / s : dw[j];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == ex[j]) dp[i] += g;
  }
  float pd = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) pd += pv[i] * dp[i];
  pd = cuda::warp_sum(pd);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < E) dlogits[n * E + e] = to_bf(pv[i] * (dp[i] - pd));
  }
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.f / (1.f + expf(-x));
}

__global__ void sigmoid_gate_add_kernel(bf16* out, const bf16* x, const bf16* gate, int64_t N, int64_t D8) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < N * D8; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = t / D8, c = t % D8 * 8;
    const float g = sigmoid(to_f(gate[n]));
    const cuda::Vec8 a = cuda::load8(out + n * D8 * 8 + c), b = cuda::load8(x + n * D8 * 8 + c);
    cuda::Vec8 o;
    for (int d = 0; d < 8; ++d) o.set(d, a[d] + g * b[d]);
    cuda::store8(out + n * D8 * 8 + c, o);
  }
}

// One warp per token: dx = σ(gate) · dout; dgate = σ'(gate) · (dout · x).
__global__ void sigmoid_gate_backward_kernel(bf16* dx, bf16* dgate, const bf16* dout, const bf16* x, const bf16* gate,
                                             int64_t N, int64_t D8) {
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const float g = sigmoid(to_f(gate[n]));
  const float dot = scale_row_and_dot(dx + n * D8 * 8, dout + n * D8 * 8, x + n * D8 * 8, g, D8);
  if (lane == 0) dgate[n] = to_bf(dot * g * (1.f - g));
}

// One thread: E is at most kMaxExperts, and this runs once per micro-batch.
__global__ void aux_loss_kernel(float* aux_grad, double* loss, const float* counts, const float* prob_sum, int E,
                                double c) {
  double s = 0;
  for (int e = 0; e < E; ++e) {
    s += double(counts[e]) * double(prob_sum[e]);
    aux_grad[e] = float(c * counts[e]);
  }
  *loss += c * s;
}

// Rows of D values move 8 at a time (16 bytes): D a multiple of 8, bf16, aligned.
int64_t vec8_width(const char* op, std::initializer_list<const Tensor*> ts, int64_t D) {
  SOLTRAIN_CHECK(D % 8 == 0, op, ": the hidden size must be a multiple of 8, not ", D);
  for (const Tensor* t : ts)
    SOLTRAIN_CHECK(t->dtype == DType::BF16 && cuda::aligned16(t->data), op, ": bf16 tensors, 16-byte aligned");
  return D / 8;
}
constexpr int kThreads = 256, kWarps = kThreads / 32;
unsigned warp_blocks(int64_t n) {
  return unsigned((n + kWarps - 1) / kWarps);
}
}  // namespace

std::string CudaOps::moe_unsupported(int experts, int top_k) const {
  if (experts <= kMaxExperts && top_k <= 32) return "";
  return cat(experts, " experts, ", top_k, " per token: the CUDA routing kernels take at most ", kMaxExperts,
             " experts and 32 per token");
}

void CudaOps::moe_route(Tensor probs, Tensor expert, Tensor weight, Tensor prob_sum, const Tensor& logits,
                        bool norm_topk) {
  const auto prof = profile("moe_route");
  const int64_t N = logits.dim(0), E = logits.dim(1), k = expert.dim(1);
  SOLTRAIN_CHECK(probs.numel() == N * E && expert.dim(0) == N && weight.numel() == N * k && k <= E &&
                     prob_sum.numel() == E && logits.dtype == DType::BF16 && probs.dtype == DType::F32,
                 "moe_route shapes");
  SOLTRAIN_CHECK(E <= kMaxExperts && k <= 32, "moe_route: at most ", kMaxExperts, " experts and 32 per token");
  if (N == 0) return;
  route_kernel<<<warp_blocks(N), kThreads, 0, stream_>>>(probs.as<float>(), expert.as<int32_t>(), weight.as<float>(),
                                                         logits.as<bf16>(), int(N), int(E), int(k), norm_topk);
  CUDA_CHECK_LAUNCH();
  column_add_kernel<<<unsigned((E + 31) / 32), dim3(32, 32), 0, stream_>>>(prob_sum.as<float>(), probs.as<float>(),
                                                                           int(N), int(E));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::moe_permute(Tensor rows, Tensor slot, Tensor offsets, Tensor counts, const Tensor& expert) {
  const auto prof = profile("moe_permute");
  const int64_t N = expert.dim(0), k = expert.dim(1), E = offsets.numel() - 1, M = N * k;
  SOLTRAIN_CHECK(rows.numel() == M && slot.numel() == M && counts.numel() == E && E <= kMaxExperts,
                 "moe_permute shapes");
  permute_kernel<<<1, 1024, 0, stream_>>>(rows.as<int32_t>(), slot.as<int32_t>(), offsets.as<int32_t>(),
                                          counts.as<float>(), expert.as<int32_t>(), int(M), int(k), int(E));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  const auto prof = profile("gather_rows");
  const int64_t M = rows.numel(), D = x.dim(1);
  SOLTRAIN_CHECK(out.dim(0) == M && out.dim(1) == D, "gather_rows shapes");
  const int64_t D8 = vec8_width("gather_rows", {&out, &x}, D);
  if (M == 0) return;
  gather_kernel<<<cuda::blocks_for(M * D8, kThreads), kThreads, 0, stream_>>>(out.as<bf16>(), x.as<bf16>(),
                                                                              rows.as<int32_t>(), M, D8);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::moe_combine(Tensor out, const Tensor& y, const Tensor& slot, const Tensor& weight) {
  const auto prof = profile("moe_combine");
  const int64_t N = out.dim(0), D = out.dim(1), k = weight.dim(1);
  SOLTRAIN_CHECK(weight.dim(0) == N && slot.numel() == N * k && y.dim(1) == D, "moe_combine shapes");
  const int64_t D8 = vec8_width("moe_combine", {&out, &y}, D);
  if (N == 0) return;
  combine_kernel<<<cuda::blocks_for(N * D8, kThreads), kThreads, 0, stream_>>>(
      out.as<bf16>(), y.as<bf16>(), slot.as<int32_t>(), weight.as<float>(), N, int(k), D8, false);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::moe_combine_backward(Tensor dy, Tensor dweight, const Tensor& dout, const Tensor& y, const Tensor& slot,
                                   const Tensor& weight) {
  const auto prof = profile("moe_combine_backward");
  const int64_t N = dout.dim(0), D = dout.dim(1), k = weight.dim(1);
  SOLTRAIN_CHECK(dy.numel() == N * k * D && dweight.numel() == N * k, "moe_combine_backward shapes");
  const int64_t D8 = vec8_width("moe_combine_backward", {&dy, &dout, &y}, D);
  if (N == 0) return;
  combine_backward_kernel<<<warp_blocks(N * k), kThreads, 0, stream_>>>(
      dy.as<bf16>(), dweight.as<float>(), dout.as<bf16>(), y.as<bf16>(), slot.as<int32_t>(), weight.as<float>(), N * k,
      int(k), D8);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::moe_unpermute_sum(Tensor dx, bool accumulate, const Tensor& dxs, const Tensor& slot) {
  const auto prof = profile("moe_unpermute_sum");
  const int64_t N = dx.dim(0), D = dx.dim(1), k = N ? slot.numel() / N : 0;
  SOLTRAIN_CHECK(slot.numel() == N * k && dxs.numel() == N * k * D, "moe_unpermute_sum shapes");
  const int64_t D8 = vec8_width("moe_unpermute_sum", {&dx, &dxs}, D);
  if (N == 0) return;
  combine_kernel<<<cuda::blocks_for(N * D8, kThreads), kThreads, 0, stream_>>>(
      dx.as<bf16>(), dxs.as<bf16>(), slot.as<int32_t>(), nullptr, N, int(k), D8, accumulate);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::moe_router_backward(Tensor dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& expert,
                                  const Tensor& weight, bool norm_topk, const Tensor& aux_grad) {
  const auto prof = profile("moe_router_backward");
  const int64_t N = probs.dim(0), E = probs.dim(1), k = expert.dim(1);
  SOLTRAIN_CHECK(dlogits.numel() == N * E && dweight.numel() == N * k && (!aux_grad.data || aux_grad.numel() == E) &&
                     dlogits.dtype == DType::BF16 && E <= kMaxExperts,
                 "moe_router_backward shapes");
  if (N == 0) return;
  router_backward_kernel<<<warp_blocks(N), kThreads, 0, stream_>>>(
      dlogits.as<bf16>(), dweight.as<float>(), probs.as<float>(), expert.as<int32_t>(), weight.as<float>(),
      aux_grad.data ? aux_grad.as<float>() : nullptr, int(N), int(E), int(k), norm_topk);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::sigmoid_gate_add(Tensor out, const Tensor& x, const Tensor& gate) {
  const auto prof = profile("sigmoid_gate_add");
  const int64_t N = out.dim(0), D = out.dim(1);
  SOLTRAIN_CHECK(x.numel() == N * D && gate.numel() == N && gate.dtype == DType::BF16, "sigmoid_gate_add shapes");
  const int64_t D8 = vec8_width("sigmoid_gate_add", {&out, &x}, D);
  if (N == 0) return;
  sigmoid_gate_add_kernel<<<cuda::blocks_for(N * D8, kThreads), kThreads, 0, stream_>>>(out.as<bf16>(), x.as<bf16>(),
                                                                                        gate.as<bf16>(), N, D8);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::sigmoid_gate_backward(Tensor dx, Tensor dgate, const Tensor& dout, const Tensor& x, const Tensor& gate) {
  const auto prof = profile("sigmoid_gate_backward");
  const int64_t N = dout.dim(0), D = dout.dim(1);
  SOLTRAIN_CHECK(dx.numel() == N * D && x.numel() == N * D && gate.numel() == N && dgate.numel() == N &&
                     gate.dtype == DType::BF16 && dgate.dtype == DType::BF16,
                 "sigmoid_gate_backward shapes");
  const int64_t D8 = vec8_width("sigmoid_gate_backward", {&dx, &dout, &x}, D);
  if (N == 0) return;
  sigmoid_gate_backward_kernel<<<warp_blocks(N), kThreads, 0, stream_>>>(
      dx.as<bf16>(), dgate.as<bf16>(), dout.as<bf16>(), x.as<bf16>(), gate.as<bf16>(), N, D8);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::moe_aux_loss(Tensor aux_grad, Tensor loss, const Tensor& counts, const Tensor& prob_sum, float coef,
                           double rows) {
  const auto prof = profile("moe_aux_loss");
  const int64_t E = counts.numel();
  SOLTRAIN_CHECK(aux_grad.numel() == E && prob_sum.numel() == E && loss.dtype == DType::F64, "moe_aux_loss shapes");
  aux_loss_kernel<<<1, 1, 0, stream_>>>(aux_grad.as<float>(), loss.as<double>(), counts.as<float>(),
                                        prob_sum.as<float>(), int(E), double(coef) * double(E) / (rows * rows));
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
