// TMA tensor maps (Hopper's bulk tensor copy engine) over our [tokens, heads, head_dim] bf16 activations:
// one box is `rows` tokens x 64 columns of one head, landing in shared memory as a 128-byte-swizzled
// tile block (the "sw128" layout of attention_sm90.cuh). Tokens past the tensor's end read as zeros.
#pragma once
#include <cuda.h>

#include "core/tensor.h"

namespace soltrain::cuda {

CUtensorMap head_tile_map(const Tensor& x, int rows);

}  // namespace soltrain::cuda
