#include "model/activation_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/format.h"

namespace soltrain {

Recompute parse_recompute(const std::string& s, const std::string& where) {
  for (Recompute r : {Recompute::None, Recompute::Elementwise, Recompute::Selective, Recompute::Full})
    if (s == recompute_name(r)) return r;
  user_error(where, ": recompute must be none, elementwise, selective or full, got '", s, "'");
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Elementwise: return "elementwise";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

int64_t token_tile_for(int64_t token_tile, int64_t tokens, int64_t intermediate, DType act) {
  SOLTRAIN_CHECK(token_tile >= 0 && tokens > 0, "token_tile ", token_tile, " for ", tokens, " tokens");
  int64_t tile = token_tile;
  if (tile == kTokenTileAuto) {
    tile = kTokenTileBytes / (intermediate * int64_t(dtype_size(act)));
    tile = std::max<int64_t>(1024, tile / 1024 * 1024);
  }
  return std::min(tile, tokens);
}

DType residual_dtype_for(DType act, std::optional<DType> setting, bool lora) {
  if (act == DType::F32) return DType::F32;
  return setting.value_or(lora ? DType::F32 : act);
}

int64_t head_chunk_bytes_for(DType act, bool head_trains) {
  if (act == DType::F32) return int64_t(64) << 20;
  return head_trains ? int64_t(1) << 30 : int64_t(256) << 20;
}

size_t ActivationPlan::total_bytes() const {
  size_t n = 0;
  for (const PlannedBuffer& b : buffers) n += b.total_bytes();
  return n;
}

size_t ActivationPlan::host_bytes() const {
  size_t n = 0;
  for (const PlannedBuffer& b : buffers) n += b.host_bytes();
  return n;
}

const PlannedBuffer* ActivationPlan::find(const std::string& name) const {
  for (const PlannedBuffer& b : buffers)
    if (b.name == name) return &b;
  return nullptr;
}

std::vector<const PlannedBuffer*> ActivationPlan::largest() const {
  std::vector<const PlannedBuffer*> v;
  for (const PlannedBuffer& b : buffers) v.push_back(&b);
  std::stable_sort(v.begin(), v.end(),
                   [](const PlannedBuffer* a, const PlannedBuffer* b) { return a->bytes() > b->bytes(); });
  return v;
}

ActivationPlan plan_activations(const ModelConfig& c, const ActivationSettings& s) {
  const int64_t N = int64_t(s.rows) * s.seq_len, D = c.hidden_size, F = c.intermediate_size, L = c.num_layers;
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
  const int64_t V = c.head_outputs();  // (a classifier's: its labels)
  const DType act = s.act, res = s.res, f32 = DType::F32, i32 = DType::I32;
  ActivationPlan p;
  p.tokens = N;
  p.tile = token_tile_for(s.token_tile, N, F, act);
  // Whole 128-row GEMM tiles where the budget allows (a 441-row chunk would run four tiles, the last half empty).
  int64_t chunk = s.head_chunk_bytes / (4 * V);
  if (chunk >= 128) chunk = chunk / 128 * 128;
  p.head_chunk = std::max<int64_t>(1, std::min<int64_t>(N, chunk));
  const int64_t T = p.tile;
  auto one = [&](const char* name, Shape shape, DType dt) { p.buffers.push_back({name, std::move(shape), dt, 0, 1}); };
  // Recomputed tensors get one buffer that every layer's entry aliases: only the layer in hand needs it.
  auto per_layer = [&](std::string name, Shape shape, DType dt, bool recomputed, int64_t layers = 0) {
    layers = layers ? layers : L;
    p.buffers.push_back({std::move(name), std::move(shape), dt, layers, recomputed ? 1 : layers});
  };
  const bool attn_rc = s.recompute == Recompute::Full, mlp_rc = s.recompute >= Recompute::Selective;
  const bool elem_rc = s.recompute != Recompute::None;
  per_layer("resid", {N, D}, res, false, L + 1);
  p.buffers.back().checkpoint = true;
  if (s.offload_checkpoints) {
    SOLTRAIN_CHECK(s.recompute == Recompute::Full, "offloaded checkpoints without recompute full");
    // The ring holds the last kCheckpointSlots written (layers L+1-slots .. L) when backward starts: those
    // are read there and never need a host copy; every earlier one has its own host buffer.
    PlannedBuffer& r = p.buffers.back();
    r.copies = std::min<int64_t>(kCheckpointSlots, L + 1);
    r.host_copies = L + 1 - r.copies;
  }
  per_layer("h1", {N, D}, act, attn_rc);
  per_layer("rstd1", {N}, f32, attn_rc);
  // Recompute elementwise, with q/k norms: the normed and rotated q and k are one buffer each that backward
  // refills from q_raw / k_raw (one elementwise pass) where keeping them costs L·N·(H + Hkv)·hd values.
  per_layer("q", {N, H, hd}, act, attn_rc || (elem_rc && c.qk_norm));
  per_layer("k", {N, Hkv, hd}, act, attn_rc || (elem_rc && c.qk_norm));
  per_layer("v", {N, Hkv, hd}, act, attn_rc);
  if (c.qk_norm) {
    per_layer("q_raw", {N, H, hd}, act, attn_rc);
    per_layer("k_raw", {N, Hkv, hd}, act, attn_rc);
    per_layer("q_rstd", {N * H}, f32, attn_rc);
    per_layer("k_rstd", {N * Hkv}, f32, attn_rc);
  }
  per_layer("attn", {N, H * hd}, act, attn_rc);
  per_layer("lse", {H, N}, f32, attn_rc);
  per_layer("mid", {N, D}, res, attn_rc);
  per_layer("h2", {N, D}, act, mlp_rc);
  per_layer("rstd2", {N}, f32, mlp_rc);
  // The MLP's [tokens, F] tensors: kept whole for every layer without recompute; else one tile, refilled
  // tile by tile in forward and again in backward. Recompute elementwise keeps gate and up but not act =
  // silu(gate)·up: backward refills it with one pass at memory bandwidth where keeping it costs L·N·F values
  // (2.7 GiB for Qwen3-4B at 2x2048).
  // (numbered among the dense-MLP layers: an MoE layer has none of them)
  const int64_t Ld = c.dense_mlp_layers(), Lm = c.moe_layers();
  if (Ld > 0) {
    for (const char* n : {"gate", "up"}) per_layer(n, {mlp_rc ? T : N, F}, act, mlp_rc, Ld);
    per_layer("act", {mlp_rc ? T : N, F}, act, elem_rc, Ld);
  }
  // MoE layers (model/moe.h), numbered among themselves, run untiled: the routing is kept (a few values per
  // token and expert); the per-pair tensors (M = N·top_k rows) follow the MLP's recompute rules.
  const int64_t E = c.moe.num_experts, K = c.moe.top_k, M = N * K, Fm = c.moe.intermediate_size;
  const int64_t Fs = c.moe.shared_intermediate_size;
  // the experts' side: this rank's pairs, or with expert parallelism room for every rank of its group's
  const int64_t Mx = M * std::max(1, s.expert_parallel);
  if (Lm > 0) {
    per_layer("moe_logits", {N, E}, act, false, Lm);
    per_layer("moe_probs", {N, E}, f32, false, Lm);
    per_layer("moe_expert", {N, K}, i32, false, Lm);
    per_layer("moe_weight", {N, K}, f32, false, Lm);
    per_layer("moe_rows", {M}, i32, false, Lm);
    per_layer("moe_slot", {M}, i32, false, Lm);
    per_layer("moe_offsets", {E + 1}, i32, false, Lm);
    per_layer("moe_xs", {M, D}, act, mlp_rc, Lm);
    for (const char* n : {"moe_gate", "moe_up"}) per_layer(n, {Mx, Fm}, act, mlp_rc, Lm);
    per_layer("moe_act", {Mx, Fm}, act, elem_rc, Lm);
    per_layer("moe_ys", {M, D}, act, mlp_rc, Lm);
    if (s.expert_parallel > 1)
      for (const char* n : {"moe_xl", "moe_yl"}) per_layer(n, {Mx, D}, act, mlp_rc, Lm);
    if (const LoraConfig* lora = s.lora; lora && c.moe.lora_on_experts) {  // experts' adapters' u: rank 2r / r
      if (lora->targets(LoraTarget::gate)) per_layer("moe_u_gate_up", {Mx, 2 * lora->r}, act, mlp_rc, Lm);
      if (lora->targets(LoraTarget::down)) per_layer("moe_u_down", {Mx, lora->r}, act, mlp_rc, Lm);
      if (lora->router) per_layer("moe_u_router", {N, lora->r}, act, false, Lm);  // (routing is kept, not redone)
    }
    if (Fs > 0) {  // Qwen2-MoE's shared expert: a dense MLP over every token, and its gate's logit (kept)
      for (const char* n : {"moe_shared_gate", "moe_shared_up"}) per_layer(n, {N, Fs}, act, mlp_rc, Lm);
      per_layer("moe_shared_act", {N, Fs}, act, elem_rc, Lm);
      per_layer("moe_shared_out", {N, D}, act, mlp_rc, Lm);
      per_layer("moe_shared_logit", {N, 1}, act, false, Lm);
      if (s.lora && s.lora->shared_expert_gate) per_layer("moe_u_shared_gate", {N, s.lora->r}, act, false, Lm);
    }
  }
  one("hf", {N, D}, act);
  one("rstdf", {N}, f32);
  for (const char* n : {"tmp", "dh", "dhf"}) one(n, {N, D}, act);
  one("dres", {N, D}, res);
  if (res != act) one("dres_act", {N, D}, act);
  if (Ld > 0)
    for (const char* n : {"dact", "dgate", "dup"}) one(n, {T, F}, act);
  if (Lm > 0) {
    for (const char* n : {"moe_dys", "moe_dxs"}) one(n, {M, D}, act);
    if (s.expert_parallel > 1)
      for (const char* n : {"moe_dyl", "moe_dxl"}) one(n, {Mx, D}, act);
    for (const char* n : {"moe_dact", "moe_dgate", "moe_dup"}) one(n, {Mx, Fm}, act);
    one("moe_dweight", {N, K}, f32);
    one("moe_dlogits", {N, E}, act);
    for (const char* n : {"moe_counts", "moe_prob_sum", "moe_aux_grad"}) one(n, {E}, f32);
    const LoraConfig* lora = s.lora;
    if (lora && c.moe.lora_on_experts && (lora->targets(LoraTarget::gate) || lora->targets(LoraTarget::down))) {
      one("moe_lora_g", {Mx, 2 * lora->r}, act);
    }
    if (lora && lora->base_format != WeightFormat::Dense)  // one projection of the experts a rank runs, dequantised
      one("moe_dequant", {E / std::max(1, s.expert_parallel) * Fm * D}, act);
    if (Fs > 0) {
      for (const char* n : {"moe_shared_dact", "moe_shared_dgate", "moe_shared_dup"}) one(n, {N, Fs}, act);
      one("moe_dshared_out", {N, D}, act);
      one("moe_dshared_logit", {N, 1}, act);
    }
  }
  one("dattn", {N, H * hd}, act);
  one("dq", {N, H, hd}, act);
  one("dk", {N, Hkv, hd}, act);
  one("dv", {N, Hkv, hd}, act);
  if (c.qk_norm) {
    one("dq_raw", {N, H, hd}, act);
    one("dk_raw", {N, Hkv, hd}, act);
  }
  one("logits", {p.head_chunk, V}, f32);
  if (act != f32) one("dlogits", {p.head_chunk, V}, act);
  one("token_nll", {N}, f32);
  one("token_entropy", {N}, f32);
  one("token_weight", {N}, f32);
  one("doc_nll", {N}, f32);  // packed batches: up to one document per token
  one("ids", {N}, i32);
  one("targets", {N}, i32);
  one("positions", {N}, i32);
  one("cu_seqlens", {N + 1}, i32);
  if (const LoraConfig* lora = s.lora) {
    for (int t = 0; t < kLoraTargets; ++t)
      if (lora->targets(LoraTarget(t))) {
        const bool mlp_target = !is_attention_target(LoraTarget(t));
        per_layer(cat("lora_u.", kLoraModuleNames[size_t(t)]), {N, lora->r}, act, mlp_target ? mlp_rc : attn_rc);
      }
    // dropout(x) and its gradient exist only with dropout, as wide as the widest adapted input: the attention
    // projections see every token at once, the MLP's one tile.
    if (lora->dropout > 0) {
      // (an MoE layer's shared expert runs all tokens at once)
      const int64_t widest = std::max({N * std::max<int64_t>(D, c.q_dim()), T * std::max(D, F), N * std::max(D, Fs)});
      one("lora_x", {widest}, act);
      one("lora_dx", {widest}, act);
    }
    one("lora_g", {N, lora->r}, act);  // B's output gradient, always
  }
  return p;
}

std::string describe_largest(const ActivationPlan& p, size_t n) {
  std::string out;
  const auto v = p.largest();
  for (size_t i = 0; i < v.size() && i < n; ++i) {
    const PlannedBuffer& b = *v[i];
    if (!out.empty()) out += ", ";
    out += cat(b.name, " ");
    if (b.copies > 1) out += cat(b.copies, " x ");
    out += format_bytes(double(b.bytes()));
    if (b.checkpoint)
      out += b.host_copies ? cat(" (layer inputs; ", b.host_copies, " more in host memory)") : " (layer inputs)";
  }
  return out;
}

}  // namespace soltrain
