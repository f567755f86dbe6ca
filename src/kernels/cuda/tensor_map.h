// TMA tensor maps (Hopper's bulk tensor copy engine) over our [tokens, heads, head_dim] bf16 activations:
// one box is `rows` tokens x 64 columns of one head, landing in shared memory as a 128-byte-swizzled
// tile block (the "sw128" layout of attention_sm90.cuh). Tokens past the tensor's end read as zeros.
#pragma once
#include <cuda.h>

#include "core/tensor.h"

namespace soltrain::cuda {

CUtensorMap head_tile_map(const Tensor& x, int rows);
// A bf16 matrix [rows, cols] with contiguous rows (cols a multiple of 8: 16-byte rows), as the same 64-column
// boxes of `box_rows` rows (addressed with head 0): the grouped GEMMs' operands. Columns and rows past the end
// read as zeros, so a box may be wider than the matrix (a LoRA factor's rank).
CUtensorMap matrix_tile_map(const void* data, int64_t rows, int64_t cols, int box_rows);

}  // namespace soltrain::cuda
