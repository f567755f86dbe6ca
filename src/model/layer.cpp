#include "model/layer.h"

#include <initializer_list>

namespace soltrain {

namespace {
Tensor grad_or_empty(Parameter* p) {  // for ops whose weight gradient is skipped when undefined (RMSNorm)
  return p->trainable ? p->grad : Tensor{};
}
}  // namespace

void Attention::forward_qkv(Ops& o, const Tensor& h, const QkvTensors& t, const SeqLayout& seq, const Tensor& inv_freq,
                            float eps, const LoraPass& lora, int64_t l) const {
  const int64_t N = h.dim(0);
  q.forward(o, t.q_raw.view({N, t.q_raw.numel() / N}), h, t.u_q, lora.at(l, LoraTarget::q), lora.scratch);
  k.forward(o, t.k_raw.view({N, t.k_raw.numel() / N}), h, t.u_k, lora.at(l, LoraTarget::k), lora.scratch);
  v.forward(o, t.v.view({N, t.v.numel() / N}), h, t.u_v, lora.at(l, LoraTarget::v), lora.scratch);
  if (q_norm) {
    o.qk_norm_rope_forward(t.q, t.q_rstd, t.q_raw, q_norm->value, seq, inv_freq, eps);
    o.qk_norm_rope_forward(t.k, t.k_rstd, t.k_raw, k_norm->value, seq, inv_freq, eps);
  } else {  // q_raw / k_raw alias q / k: RoPE rotates the projections in place
    o.rope(t.q, seq, inv_freq, false);
    o.rope(t.k, seq, inv_freq, false);
  }
}

void Attention::backward_qkv(Ops& o, Tensor dh, bool accumulate_dh, const QkvGrads& g, const Tensor& h,
                             const QkvTensors& t, const SeqLayout& seq, const Tensor& inv_freq, const LoraPass& lora,
                             int64_t l) const {
  const int64_t N = h.dim(0);
  Tensor dq_raw = g.dq, dk_raw = g.dk;
  if (q_norm) {
    dq_raw = g.dq_raw;
    dk_raw = g.dk_raw;
    o.qk_norm_rope_backward(dq_raw, grad_or_empty(q_norm), g.dq, t.q_raw, q_norm->value, t.q_rstd, seq, inv_freq);
    o.qk_norm_rope_backward(dk_raw, grad_or_empty(k_norm), g.dk, t.k_raw, k_norm->value, t.k_rstd, seq, inv_freq);
  } else {
    o.rope(g.dq, seq, inv_freq, true);
    o.rope(g.dk, seq, inv_freq, true);
  }
  q.backward(o, &dh, accumulate_dh, dq_raw.view({N, dq_raw.numel() / N}), h, t.u_q, lora.at(l, LoraTarget::q),
             lora.scratch);
  k.backward(o, &dh, true, dk_raw.view({N, dk_raw.numel() / N}), h, t.u_k, lora.at(l, LoraTarget::k), lora.scratch);
  v.backward(o, &dh, true, g.dv.view({N, g.dv.numel() / N}), h, t.u_v, lora.at(l, LoraTarget::v), lora.scratch);
}

std::pair<int64_t, int64_t> projection_shape(const ModelConfig& c, LoraTarget t) {
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  switch (t) {
    case LoraTarget::q: return {c.q_dim(), D};
    case LoraTarget::k:
    case LoraTarget::v: return {c.kv_dim(), D};
    case LoraTarget::o: return {D, c.q_dim()};
    case LoraTarget::gate:
    case LoraTarget::up: return {F, D};
    case LoraTarget::down: return {D, F};
  }
  return {0, 0};
}

namespace {
bool has_bias(const ModelConfig& c, LoraTarget t) {
  if (t == LoraTarget::o) return c.o_bias;
  return is_attention_target(t) ? c.qkv_bias : c.mlp_bias;
}
}  // namespace

void add_layer_parameters(ParameterStore& ps, const ModelConfig& c, int l, const std::optional<LoraConfig>& lora) {
  const bool base_trains = !lora;  // base parameters train in full fine-tuning and are frozen under LoRA
  const std::string p = cat("model.layers.", l, ".");
  auto add = [&](const std::string& n, Shape s) { ps.add(n, std::move(s), base_trains, l); };
  // A QLoRA base holds the projection matrices quantised (their biases stay dense).
  const WeightFormat proj = lora ? lora->base_format : WeightFormat::Dense;
  // Projections that read one input are added weights first, then their biases: a frozen base is stored in the
  // order added, so q/k/v (and gate/up) sit side by side there as in the trainable masters (which keep matrices
  // apart from vectors), and the decoder runs each group as one GEMM (model/decode_fusion.h).
  auto add_projs = [&](std::initializer_list<LoraTarget> ts) {
    for (LoraTarget t : ts) {
      const auto [out, in] = projection_shape(c, t);
      ps.add(lora_module_path(l, t) + ".weight", {out, in}, base_trains, l, proj);
    }
    for (LoraTarget t : ts)
      if (has_bias(c, t)) add(lora_module_path(l, t) + ".bias", {projection_shape(c, t).first});
  };
  // Otherwise in the order of HF's state dict (q, k, v, q/k norms, o; then the MLP).
  add(p + "input_layernorm.weight", {c.hidden_size});
  add_projs({LoraTarget::q, LoraTarget::k, LoraTarget::v});
  if (c.qk_norm) {
    add(p + "self_attn.q_norm.weight", {c.head_dim});
    add(p + "self_attn.k_norm.weight", {c.head_dim});
  }
  add_projs({LoraTarget::o});
  add(p + "post_attention_layernorm.weight", {c.hidden_size});
  if (c.is_moe_layer(l)) {
    add_moe_parameters(ps, c, l, base_trains, proj);
    return;
  }
  add_projs({LoraTarget::gate, LoraTarget::up});
  add_projs({LoraTarget::down});
}

bool layer_has_target(const ModelConfig& c, int l, LoraTarget t) {
  return is_attention_target(t) || (!c.moe.lora_on_experts && !c.is_moe_layer(l));
}

void add_lora_parameters(ParameterStore& ps, const ModelConfig& c, int l, const LoraConfig& lora) {
  if (c.is_moe_layer(l) && c.moe.lora_on_experts)  // the experts' adapters in PEFT's layout (model/moe.h)
    add_expert_lora_parameters(ps, c, l, lora.r, lora.targets(LoraTarget::gate), lora.targets(LoraTarget::down),
                               lora.router);
  if (c.is_moe_layer(l) && c.moe.shared_intermediate_size) add_shared_lora_parameters(ps, c, l, lora);
  for (int t = 0; t < kLoraTargets; ++t) {
    if (!lora.targets(LoraTarget(t)) || !layer_has_target(c, l, LoraTarget(t))) continue;
    const auto [out, in] = projection_shape(c, LoraTarget(t));
    ps.add(lora_a_name(l, LoraTarget(t)), {lora.r, in}, true, l);
    ps.add(lora_b_name(l, LoraTarget(t)), {out, lora.r}, true, l);
  }
}

DecoderLayer bind_layer(ParameterStore& ps, const ModelConfig& c, int l, const std::optional<LoraConfig>& lora) {
  const std::string p = cat("model.layers.", l, ".");
  const float scale = lora ? lora->scale() : 0.0f;
  auto linear = [&](LoraTarget t) {
    const std::string m = lora_module_path(l, t);
    return Linear(&ps.at(m + ".weight"), ps.find(m + ".bias"), ps.find(lora_a_name(l, t)), ps.find(lora_b_name(l, t)),
                  scale);
  };
  DecoderLayer layer;
  layer.ln1 = &ps.at(p + "input_layernorm.weight");
  layer.ln2 = &ps.at(p + "post_attention_layernorm.weight");
  layer.attn.q_norm = ps.find(p + "self_attn.q_norm.weight");
  layer.attn.k_norm = ps.find(p + "self_attn.k_norm.weight");
  layer.attn.q = linear(LoraTarget::q);
  layer.attn.k = linear(LoraTarget::k);
  layer.attn.v = linear(LoraTarget::v);
  layer.attn.o = linear(LoraTarget::o);
  if (c.is_moe_layer(l)) {
    layer.moe = bind_moe(ps, c, l, lora);
    return layer;
  }
  layer.mlp.gate = linear(LoraTarget::gate);
  layer.mlp.up = linear(LoraTarget::up);
  layer.mlp.down = linear(LoraTarget::down);
  return layer;
}

}  // namespace soltrain
