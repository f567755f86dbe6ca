// The KV decoder's fused projections. At a few tokens a row a decode step's GEMMs are latency, not bandwidth
// (Qwen3-0.6B at 64 rows: a k or v projection reads 2 MB in ~4 us, 16% of the HBM rate), so projections that read
// the same input run as one GEMM: q, k and v, and gate and up. No copy of the base is made: the parameter store
// lays a layer's matrices out in the order added (model/parameters.h), so q/k/v and gate/up usually sit side by
// side and one [Σ out, in] view covers them. Where they do not (a quantised or fp8-recipe base, biases between
// the frozen matrices, a streamed or sharded base), the decoder keeps one GEMM a projection.
//
// Biases and adapters are copies in the decoder's memory, taken again at each generation's start (refresh()), since
// training moves them between generations: the parts' biases side by side (a frozen base aligns each vector, so
// they are apart there), and for the adapted parts their A matrices stacked, [n·r, in], which give every part's u
// in one GEMM (one scale: one LoRA config), and their B matrices as one block-diagonal [Σ out, n·r], which adds
// every part's term in a second GEMM: two launches instead of 2n.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/linear.h"

namespace soltrain {

struct FusedProjection {
  std::vector<const Linear*> parts;
  Tensor weight;             // [Σ out, in]: a view of the parts' adjacent weights; undefined: not fused
  std::vector<int> adapted;  // the parts with an adapter (all of one rank)
  int64_t rank = 0;
  float scale = 0;
  // The copies (the decoder's buffers, planned from copy_shapes()): biases [Σ out], A [n·r, in], B [Σ out, n·r].
  std::array<Tensor, 3> copies;

  bool fused() const { return weight.defined(); }
  bool biased() const;
  int64_t out() const { return weight.dim(0); }
  // The copies' shapes (an empty shape where there is none: no bias, no adapter).
  std::array<Shape, 3> copy_shapes() const;
  // y [N, Σ out] = x·Wᵀ (+ b) + scale·(x·Aᵀ)·Bᵀ over every part; u [N, n·r] receives the adapters' inputs.
  void forward(Ops& o, Tensor y, const Tensor& x, const Tensor& u) const;
  // The parts' current biases, A and B into the copies.
  void refresh(Ops& o) const;
};

// The parts as one projection when their dense weights (in the ops' activation dtype and memory, none on the fp8
// recipe) are adjacent in this order and all or none has a bias; else one with fused() false.
// SOLTRAIN_DECODE_FUSED=0 fuses nothing (to compare).
FusedProjection fuse_projections(std::vector<const Linear*> parts, const Ops& ops);

}  // namespace soltrain
