// The Mixture-of-Experts block (transformers' Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock): a router picks
// top_k of E SwiGLU experts per token; the token's pairs are sorted by expert so each expert's rows are one GEMM
// (grouped), and the experts' outputs are summed back per token, weighted by the router. Qwen2-MoE adds a
// shared dense expert every token takes, scaled by sigmoid(shared_expert_gate(h)). The layer holds this block
// or DenseSwiGLU (model/layer.h).
#pragma once
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/dense_mlp.h"
#include "model/parameters.h"

namespace soltrain {

// One MoE layer's tensors for a pass of N tokens (M = N·top_k pairs). The routing (logits .. offsets) is kept
// for backward; the pair-wise rest may be recomputed from it.
struct MoeTensors {
  Tensor logits;                            // [N,E] activation dtype: the router's
  Tensor probs, expert, weight;             // F32 [N,E], I32 [N,k], F32 [N,k] (Ops::moe_route)
  Tensor rows, slot, offsets;               // I32 [M], [M], [E+1] (Ops::moe_permute)
  Tensor xs, gate, up, act, ys;             // [M,D], [M,F], [M,F], [M,F], [M,D]: per pair, in expert order
  // the shared expert (Qwen2-MoE; empty otherwise): its MLP's tensors [N,Fs], output [N,D], gate logit [N,1]
  MlpTensors shared;
  Tensor shared_out, shared_logit;
};
// Backward's scratch, shared by the layers.
struct MoeGrads {
  Tensor dys, dxs;           // [M,D]
  Tensor dact, dgate, dup;   // [M,F]
  Tensor dweight, dlogits;   // F32 [N,k]; [N,E] activation dtype
  Tensor aux_grad;           // F32 [E]: d (coef · load-balancing loss) / d probs, or empty
  MlpGrads shared;           // the shared expert's: [N,Fs] each
  Tensor dshared_out, dshared_logit;  // [N,D], [N,1]
};
// The statistics transformers' load-balancing loss sums over the MoE layers of a pass (F32 [E] each).
struct MoeStats {
  Tensor counts, prob_sum;
};

class MoeSwiGLU {
 public:
  Parameter* router = nullptr;                     // mlp.gate.weight [E,D]
  std::vector<Parameter*> gate, up, down;          // mlp.experts.{e}.{gate,up,down}_proj.weight, e = 0..E-1
  int top_k = 0;
  bool norm_topk = false;
  // Qwen2-MoE's shared expert (mlp.shared_expert.*) and its gate (mlp.shared_expert_gate.weight [1,D]);
  // shared_gate is null without one
  DenseSwiGLU shared;
  Parameter* shared_gate = nullptr;

  // out = Σ_j weight_j · expert_j(h). With `route` the router runs and the pairs are sorted (stats gain this
  // layer's counts and probabilities); without it (a recompute for backward) the saved routing is reused.
  // Without `out` the combine is skipped (backward reads ys, not the sum).
  void forward(Ops& ops, Tensor* out, const Tensor& h, const MoeTensors& t, const MoeStats* stats, bool route) const;
  // dh (=) d loss / dh; parameter gradients are added (+=).
  void backward(Ops& ops, Tensor dh, const Tensor& dout, const Tensor& h, const MoeTensors& t,
                const MoeGrads& g) const;

 private:
  // The experts' weights (or gradients) of one projection as one [E, out, in] tensor: the per-expert
  // parameters are added one after another, so they are contiguous in the store (checked).
  static Tensor stacked(const std::vector<Parameter*>& ps, Tensor Parameter::*field);
};

// Adds layer l's MoE block parameters (router, then each projection's experts in expert order, HF names).
void add_moe_parameters(ParameterStore& ps, const ModelConfig& c, int l, bool trains);
MoeSwiGLU bind_moe(ParameterStore& ps, const ModelConfig& c, int l);

}  // namespace soltrain
