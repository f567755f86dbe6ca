// Host entry points of the Hopper (sm_90a) flash attention kernels: warpgroup MMA, the FA2 algorithm and
// memory layouts otherwise (same inputs, outputs and determinism as the portable kernels). They serve
// head dims 64 and 128 exactly; CudaOps picks them on compute capability 9.0 (see use_sm90_attention).
#pragma once
#include <cuda_runtime.h>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace soltrain::cuda {

inline bool sm90_attention_head_dim(int64_t hd) {
  return hd == 64 || hd == 128;
}

void flash_forward_sm90(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const SeqLayout& seq, float scale, cudaStream_t s);
// How the backward forms dQ (kernels/ops.h; attention_backward_sm90.cu says how each works). Head dim 64 runs
// Split whatever is asked.
using soltrain::AttentionBackward;
// The order the dK/dV blocks launch in (attention_backward_sm90.cu, key_block): by default longest first at
// head dim 128 (split and atomic) and shortest first at 64; ordered is always shortest first.
// SOLTRAIN_ATTENTION_ORDER sets it, to measure both.
enum class LaunchOrder { Default, ShortestFirst, LongestFirst };
// The device scratch `form` needs (fp32 dQ sums and per-tile counters), 0 for Split.
size_t flash_backward_sm90_scratch(AttentionBackward form, const Tensor& q, const SeqLayout& seq);
// delta[h, n] = Σ_d dO·O, computed by the caller; `scratch` holds flash_backward_sm90_scratch's bytes.
void flash_backward_sm90(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                         const Tensor& k, const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq,
                         float scale, AttentionBackward form, LaunchOrder order, void* scratch, cudaStream_t s);

}  // namespace soltrain::cuda
