// The Mixture-of-Experts block (transformers' Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock): a router picks
// top_k of E SwiGLU experts per token; the token's pairs are sorted by expert so each expert's rows are one GEMM
// (grouped), and the experts' outputs are summed back per token, weighted by the router. Qwen2-MoE adds a
// shared dense expert every token takes, scaled by sigmoid(shared_expert_gate(h)). The layer holds this block
// or DenseSwiGLU (model/layer.h).
#pragma once
#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/dense_mlp.h"
#include "model/expert_parallel.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace soltrain {

// One MoE layer's tensors for a pass of N tokens (M = N·top_k pairs). The routing (logits .. offsets) is kept
// for backward; the pair-wise rest may be recomputed from it.
struct MoeTensors {
  Tensor logits;                 // [N,E] activation dtype: the router's
  Tensor probs, expert, weight;  // F32 [N,E], I32 [N,k], F32 [N,k] (Ops::moe_route)
  Tensor rows, slot, offsets;    // I32 [M], [M], [E+1] (Ops::moe_permute)
  Tensor xs, gate, up, act, ys;  // [M,D], [M,F], [M,F], [M,F], [M,D]: per pair, in expert order
  // With expert parallelism (model/expert_parallel.h) xs and ys stay this rank's pairs', and the experts' side
  // (gate, up, act, the adapters' u; xl, yl: its inputs and outputs) holds the rows this rank's experts received
  // from the group: room for ep_size × M, the first ExpertParallel::received of them used.
  Tensor xl, yl;
  // expert LoRA's u = x·A_eᵀ per pair: [M, 2r] over gate_up, [M, r] over down (empty without the adapter)
  Tensor u_gate_up, u_down;
  // a quantised base (QLoRA): one projection's experts dequantised for its grouped GEMM, [E·max(F·D)] in the
  // activation dtype (scratch shared by the layers and projections, refilled before each use)
  Tensor dequant;
  Tensor u_router;       // the router's adapter's u [N, r] (empty without one)
  Tensor u_shared_gate;  // the shared expert gate's adapter's u [N, r] (empty without one)
  // the shared expert (Qwen2-MoE; empty otherwise): its MLP's tensors [N,Fs], output [N,D], gate logit [N,1]
  MlpTensors shared;
  Tensor shared_out, shared_logit;
};
// Backward's scratch, shared by the layers.
struct MoeGrads {
  Tensor dys, dxs;          // [M,D]
  Tensor dyl, dxl;          // with expert parallelism: the experts' side of dys and dxs (as MoeTensors::xl)
  Tensor dact, dgate, dup;  // [M,F]
  Tensor dweight, dlogits;  // F32 [N,k]; [N,E] activation dtype
  Tensor aux_grad;          // F32 [E]: d (coef · load-balancing loss) / d probs, or empty
  // expert LoRA's scratch: d loss / du [M, 2r]
  Tensor lora_g;
  MlpGrads shared;                    // the shared expert's: [N,Fs] each
  Tensor dshared_out, dshared_logit;  // [N,D], [N,1]
};
// LoRA on one expert projection as PEFT 0.21 holds it for transformers 5's stacked expert parameters
// (ParamWrapper): A [E·R, in] (expert e's rows e·R ..), B [out, R·E] (expert e's column i at i·E + e). The store
// keeps B as one [out, R] matrix per expert (StoredOrder, model/parameters.h): the grouped GEMMs read it and add
// its gradient in place, and only loading and saving see PEFT's order.
struct ExpertLora {
  Parameter *a = nullptr, *b = nullptr;
  float scale = 0;
  int rank = 0;  // R
  bool on() const { return a != nullptr; }
};
// The fused gate_up adapter has rank 2r and alpha 2·alpha (PEFT's rank_pattern / alpha_pattern for the pair it
// fuses from gate_proj and up_proj); down keeps r and alpha.
inline int expert_lora_rank(int r, bool gate_up) {
  return gate_up ? 2 * r : r;
}
// PEFT's scale of an expert adapter: LoraConfig's rule (alpha / R, rsLoRA alpha / √R) at its rank and alpha.
float expert_lora_scale(const LoraConfig& lora, bool gate_up);
// Names of the adapters' tensors (PEFT nests the two wrappers: gate_up's is the inner one, "base_layer").
std::string expert_lora_name(int layer, bool gate_up, bool both, bool b);
// The base weights' names as transformers saves them: expert e's projection, the shared expert's (Qwen2-MoE).
std::string expert_weight_name(int layer, int expert, const char* proj);
std::string shared_expert_weight_name(int layer, const char* proj);
std::string router_lora_name(int layer, bool b);
std::string shared_gate_lora_name(int layer, bool b);

// The statistics transformers' load-balancing loss sums over the MoE layers of a pass (F32 [E] each).
struct MoeStats {
  Tensor counts, prob_sum;
};

class MoeSwiGLU {
 public:
  Parameter* router = nullptr;  // mlp.gate.weight [E,D]
  Linear router_linear;         // the router's projection, with its adapter (LoraConfig::router)
  // mlp.experts.{e}.{gate,up,down}_proj.weight, e = 0..E-1; with expert parallelism over a frozen base only
  // the experts held here, from held_first on (MoeConfig::held_first)
  std::vector<Parameter*> gate, up, down;
  int64_t held_first = 0;
  int top_k = 0;
  bool norm_topk = false;
  // Qwen2-MoE's shared expert (mlp.shared_expert.*) and its gate (mlp.shared_expert_gate.weight [1,D]);
  // shared_gate is null without one
  DenseSwiGLU shared;
  Parameter* shared_gate = nullptr;
  Linear shared_gate_linear;  // its projection, with its adapter (LoraConfig::shared_expert_gate)
  // LoRA on the experts (lora_target_modules gate_proj + up_proj, down_proj) where PEFT puts it there
  // (MoeConfig::lora_on_experts); else those targets adapt the shared expert's projections (`shared`)
  ExpertLora gate_up_lora, down_lora;
  // Expert parallelism (null: this rank runs every expert of its own pairs).
  ExpertParallel* ep = nullptr;

  // out = Σ_j weight_j · expert_j(h). With `route` the router runs and the pairs are sorted (stats gain this
  // layer's counts and probabilities); without it (a recompute for backward) the saved routing is reused.
  // Without `out` the combine is skipped (backward reads ys, not the sum).
  // `lora` and `layer` place the shared expert's adapters (Qwen2-MoE) in LoRA's dropout masks.
  void forward(Ops& ops, Tensor* out, const Tensor& h, const MoeTensors& t, const MoeStats* stats, bool route,
               const LoraPass& lora, int64_t layer) const;
  // dh (=) d loss / dh; parameter gradients are added (+=).
  void backward(Ops& ops, Tensor dh, const Tensor& dout, const Tensor& h, const MoeTensors& t, const MoeGrads& g,
                const LoraPass& lora, int64_t layer) const;

 private:
  // An expert adapter's factors for the grouped GEMMs: A as [E, R, in] (its own storage) and B's `parts` row
  // blocks (gate_up: gate's then up's) as [E, out, R] each, as stored; both cut to the experts `x` runs.
  struct LoraFactors {
    Tensor a;
    std::array<Tensor, 2> b;
  };
  // The experts this rank runs and the rows they run on: this rank's pairs, or with expert parallelism what
  // its experts received (their forward tensors, backward's scratch, offsets by expert).
  struct ExpertRows {
    int64_t first = 0, count = 0;  // experts [first, first + count)
    Tensor xs, gate, up, act, ys, u_gate_up, u_down;
    Tensor dys, dxs, dact, dgate, dup;
    Tensor offsets;
  };
  ExpertRows expert_rows(const MoeTensors& t, const MoeGrads* g, int64_t layer) const;
  // One projection's matrices of the experts `x` runs, [count, out, in]: the held parameters themselves, or over
  // a quantised base each dequantised into `scratch`.
  Tensor expert_weights(Ops& ops, const std::vector<Parameter*>& ps, const ExpertRows& x, const Tensor& scratch) const;
  static LoraFactors lora_factors(const ExpertLora& l, int parts, const ExpertRows& x);
  // An adapter's backward: A's and B's gradients added; returns its input gradient's term (du, A) for the caller's
  // dx product (MoeGrads::lora_g holds du until then). dys: the adapted outputs' gradients (gate's and up's for
  // gate_up); u: forward's scale·x·Aᵀ.
  Ops::GroupedTerm lora_backward(Ops& ops, const ExpertLora& l, std::initializer_list<Tensor> dys, const Tensor& x,
                                 const Tensor& u, const ExpertRows& rows, const MoeGrads& g) const;
  // The experts' weights (or gradients) of one projection as one [E, out, in] tensor: the per-expert
  // parameters are added one after another, so they are contiguous in the store (checked).
  static Tensor stacked(const std::vector<Parameter*>& ps, Tensor Parameter::*field);
};

// Adds layer l's MoE block parameters (router, then each projection's experts in expert order, HF names).
// `base`: the experts' and the shared expert's projections' storage (a QLoRA base quantises them; the router
// and the shared expert's gate stay dense).
void add_moe_parameters(ParameterStore& ps, const ModelConfig& c, int l, bool trains,
                        WeightFormat base = WeightFormat::Dense);
// The shared expert's adapters (Qwen2-MoE, where PEFT puts the gate/up/down targets): PEFT's names, r as given.
std::string shared_lora_name(int layer, const char* proj, bool b);
void add_shared_lora_parameters(ParameterStore& ps, const ModelConfig& c, int l, const LoraConfig& lora);
// Adds layer l's expert adapters for LoRA targets gate+up (one fused adapter) and down (trainable, group l).
void add_expert_lora_parameters(ParameterStore& ps, const ModelConfig& c, int l, int r, bool gate_up, bool down,
                                bool router);
MoeSwiGLU bind_moe(ParameterStore& ps, const ModelConfig& c, int l, const std::optional<LoraConfig>& lora);

}  // namespace soltrain
