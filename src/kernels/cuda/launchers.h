// Launchers shared between CUDA op files (kernels used by more than one op). Plain C++ signatures.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace soltrain::cuda {

// out[c] += Σ_r dy[r,c] · (x ? x[r,c]·rstd[r] : 1), in a fixed order (deterministic): the weight gradient
// of RMSNorm, or a bias gradient when x is null. `partials` needs partial_floats(R, C, sms) floats.
void column_sum(float* out, const __nv_bfloat16* dy, const __nv_bfloat16* x, const float* rstd, int64_t R, int64_t C,
                float* partials, int sms, cudaStream_t s);
void column_sum(float* out, const __nv_bfloat16* dy, const float* x, const float* rstd, int64_t R, int64_t C,
                float* partials, int sms, cudaStream_t s);  // x in fp32 (an fp32 residual stream)
int64_t column_sum_partial_floats(int64_t R, int64_t C, int sms);
// out[c] += Σ_b partials[b·C + c] over b in [0, blocks), in that order: the second pass of kernels that write
// one partial row of a column sum per block.
void add_partial_rows(float* out, const float* partials, int blocks, int64_t C, cudaStream_t s);

}  // namespace soltrain::cuda
