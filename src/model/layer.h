// One decoder layer (Llama / Qwen2 / Qwen3 / their MoE variants): its parameters and its computation, shared by
// training (Transformer, which saves what backward needs) and decoding (KvDecoder, which keeps a KV cache). The
// attention half and the MLP block are separate so each caller runs the attention core its own way
// (flash attention over packed documents, or cached decoding) around the same projections and norms.
#pragma once
#include <cstdint>
#include <optional>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/dense_mlp.h"
#include "model/linear.h"
#include "model/lora.h"
#include "model/moe.h"
#include "model/parameters.h"

namespace soltrain {

// The tensors of the attention half's input side for one layer: projections, Qwen3's normed q/k and their
// statistics, the rotated q/k, and each adapter's u (scale·x·Aᵀ; empty without an adapter).
struct QkvTensors {
  Tensor q_raw, k_raw, v, q, k, q_rstd, k_rstd;
  Tensor u_q, u_k, u_v;
};
// Backward's scratch for it.
struct QkvGrads {
  Tensor dq, dk, dv, dq_raw, dk_raw;
};

class Attention {
 public:
  Parameter *q_norm = nullptr, *k_norm = nullptr;  // Qwen3's per-head norms (null elsewhere)
  Linear q, k, v, o;

  // q, k, v of the normed input h, then q/k norm (Qwen3) and RoPE at seq's positions.
  void forward_qkv(Ops& ops, const Tensor& h, const QkvTensors& t, const SeqLayout& seq, const Tensor& inv_freq,
                   float eps, const LoraPass& lora, int64_t layer) const;
  // From d loss / d(q, k, v) after attention (g.dq, g.dk are rotated back in place) to dh (= or +=).
  void backward_qkv(Ops& ops, Tensor dh, bool accumulate_dh, const QkvGrads& g, const Tensor& h, const QkvTensors& t,
                    const SeqLayout& seq, const Tensor& inv_freq, const LoraPass& lora, int64_t layer) const;
};

// A layer's MLP block is dense SwiGLU (model/dense_mlp.h) or Mixture-of-Experts (model/moe.h), as
// ModelConfig::is_moe_layer says: a block class each, not flags in one.
struct DecoderLayer {
  Parameter *ln1 = nullptr, *ln2 = nullptr;  // input_layernorm, post_attention_layernorm
  Attention attn;
  DenseSwiGLU mlp;               // a dense layer's MLP (its projections unset in an MoE layer)
  std::optional<MoeSwiGLU> moe;  // an MoE layer's block
};

// [out, in] of a projection's weight.
std::pair<int64_t, int64_t> projection_shape(const ModelConfig& c, LoraTarget t);

// Adds layer l's parameters (HF names, in model order) to `ps` in parameter group l; with `lora`, the base is
// frozen and every targeted projection gains an adapter.
void add_layer_parameters(ParameterStore& ps, const ModelConfig& c, int l, const std::optional<LoraConfig>& lora);
// Adds the adapters of layer l's targeted projections (trainable, in group l).
void add_lora_parameters(ParameterStore& ps, const ModelConfig& c, int l, const LoraConfig& lora);
// Looks layer l's parameters up (after ps.allocate()).
DecoderLayer bind_layer(ParameterStore& ps, const ModelConfig& c, int l, const std::optional<LoraConfig>& lora);
// Whether LoRA target t is a projection of layer l's attention or dense MLP. In an MoE layer gate/up/down name the
// experts or the shared expert (model/moe.h), and where they name the experts (MoeConfig::lora_on_experts) the
// dense-MLP layers are not adapted either: what PEFT 0.21 does on transformers 5.
bool layer_has_target(const ModelConfig& c, int l, LoraTarget t);

}  // namespace soltrain
