#include "model/transformer.h"

#include <array>
#include <cmath>
#include <limits>

namespace soltrain {

namespace {
const char* kEmbed = "model.embed_tokens.weight";
const char* kFinalNorm = "model.norm.weight";
const char* kLmHead = "lm_head.weight";

// The gradient of a parameter, or null when it is frozen (the op then skips that output).
Tensor* grad(Parameter* p) {
  return p->trainable ? &p->grad : nullptr;
}
// For ops whose weight gradient is not optional (RMSNorm): an empty tensor the op must skip.
Tensor grad_or_empty(Parameter* p) {
  return p->trainable ? p->grad : Tensor{};
}

// [out, in] of a projection's weight.
std::pair<int64_t, int64_t> proj_shape(const ModelConfig& c, LoraTarget t) {
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
}  // namespace

// A projection's tensors: weight, bias and adapter; null where the config has none.
struct Transformer::Proj {
  Parameter *w = nullptr, *b = nullptr, *lora_a = nullptr, *lora_b = nullptr;
};

// Pointers into the ParameterStore for one decoder layer; null where the config has no such tensor.
struct Transformer::Layer {
  Parameter *ln1, *q_norm, *k_norm, *ln2;
  std::array<Proj, kLoraTargets> proj;  // indexed by LoraTarget
};

// Everything forward saves for backward, plus backward's scratch.
struct Transformer::Activations {
  Recompute recompute = Recompute::None;
  float scale = 0, eps = 0;
  Tensor inv_freq;
  int rows = 0, seq_len = 0, head_chunk = 0;
  Arena arena;
  // per layer, saved
  std::vector<Tensor> resid;  // L+1 residual streams [N,D]: input of layer l, and the final one
  std::vector<Tensor> h1, rstd1, q_raw, k_raw, q_rstd, k_rstd, q, k, v, attn, lse, mid, h2, rstd2, gate, up, act;
  Tensor hf, rstdf;  // final norm
  // scratch
  Tensor tmp, dres, dh, dhf, dact, dgate, dup, dattn, dq, dk, dv, dq_raw, dk_raw, logits, dlogits, row_loss;
  // batch on the device
  Tensor ids, targets, positions, cu_seqlens;
  SeqLayout seq;
  // LoRA: scale·(x·Aᵀ) per layer and projection [N, r] (saved), and scratch sized for the widest projection
  std::array<std::vector<Tensor>, kLoraTargets> lora_u;
  Tensor lora_x, lora_dx, lora_g;  // flat; dropout(x) / its gradient, dU
};

Transformer::Transformer(ModelConfig config, Ops& ops, std::optional<LoraConfig> lora)
    : config_(std::move(config)), lora_(std::move(lora)), ops_(ops) {
  const auto& c = config_;
  const int64_t D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  if (lora_) lora_->validate("lora config");
  if (hd > ops.max_attention_head_dim())
    user_error("head_dim ", hd, " is not supported on ", ops.device() == Device::CUDA ? "CUDA" : "this device",
               " yet (at most ", ops.max_attention_head_dim(), ")");
  const bool base_trains = !lora_;
  // Base parameters train in full fine-tuning and are frozen under LoRA.
  auto add = [&](const std::string& n, Shape s) { params_.add(n, std::move(s), base_trains); };
  add(kEmbed, {c.vocab_size, D});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {D});
    for (auto [proj, out] : {std::pair{"q_proj", c.q_dim()}, {"k_proj", c.kv_dim()}, {"v_proj", c.kv_dim()}}) {
      add(p + "self_attn." + proj + ".weight", {out, D});
      if (c.qkv_bias) add(p + "self_attn." + proj + ".bias", {out});
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {hd});
      add(p + "self_attn.k_norm.weight", {hd});
    }
    add(p + "self_attn.o_proj.weight", {D, c.q_dim()});
    if (c.o_bias) add(p + "self_attn.o_proj.bias", {D});
    add(p + "post_attention_layernorm.weight", {D});
    for (auto [proj, out, in] : {std::tuple{"gate_proj", F, D}, {"up_proj", F, D}, {"down_proj", D, F}}) {
      add(p + "mlp." + proj + ".weight", {out, in});
      if (c.mlp_bias) add(p + "mlp." + proj + ".bias", {out});
    }
  }
  add(kFinalNorm, {D});
  if (!c.tie_word_embeddings) add(kLmHead, {c.vocab_size, D});
  if (lora_) {
    for (int l = 0; l < c.num_layers; ++l)
      for (int t = 0; t < kLoraTargets; ++t) {
        if (!lora_->targets(LoraTarget(t))) continue;
        const auto [out, in] = proj_shape(c, LoraTarget(t));
        params_.add(lora_a_name(l, LoraTarget(t)), {lora_->r, in});
        params_.add(lora_b_name(l, LoraTarget(t)), {out, lora_->r});
      }
  }
  params_.allocate(ops_);
  ParameterStore& ps = params_;

  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    auto P = [&](const std::string& n) { return ps.find(p + n); };
    Layer layer{P("input_layernorm.weight"),
                P("self_attn.q_norm.weight"),
                P("self_attn.k_norm.weight"),
                P("post_attention_layernorm.weight"),
                {}};
    for (int t = 0; t < kLoraTargets; ++t) {
      const std::string m = lora_module_path(l, LoraTarget(t));
      Proj& pr = layer.proj[size_t(t)];
      pr.w = ps.find(m + ".weight");
      pr.b = ps.find(m + ".bias");
      pr.lora_a = ps.find(lora_a_name(l, LoraTarget(t)));
      pr.lora_b = ps.find(lora_b_name(l, LoraTarget(t)));
      if (pr.lora_a) {
        const auto a = lora_a_init(lora_->r, int(pr.lora_a->shape[1]), lora_->seed, pr.lora_a->name);
        ps.upload(ops_, *pr.lora_a, a.data());
      }
    }
    layers_.push_back(std::move(layer));
  }

  const std::vector<float> inv = rope_inv_freq(c.rope, c.head_dim);
  inv_freq_ = ops_.alloc(inv.size() * 4);
  ops_.copy(Tensor{inv_freq_.data(), DType::F32, {int64_t(inv.size())}, ops_.device()},
            Tensor{const_cast<float*>(inv.data()), DType::F32, {int64_t(inv.size())}, Device::CPU});
}

Transformer::~Transformer() = default;

const std::string& Transformer::lm_head_name() const {
  static const std::string embed = kEmbed, head = kLmHead;
  return config_.tie_word_embeddings ? embed : head;
}

size_t Transformer::activation_bytes() const {
  return acts_ ? acts_->arena.total_bytes() : 0;
}

Recompute parse_recompute(const std::string& s, const std::string& where) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  user_error(where, ": recompute must be none, selective or full, got '", s, "'");
}

void Transformer::plan(int rows, int seq_len, Recompute recompute) {
  const auto& c = config_;
  const int64_t N = int64_t(rows) * seq_len, D = c.hidden_size, F = c.intermediate_size, L = c.num_layers;
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim, V = c.vocab_size;
  auto a = std::make_unique<Activations>();
  a->rows = rows;
  a->seq_len = seq_len;
  // Logits are materialised for this many tokens at a time. On the GPU the chunk must stay a good GEMM
  // shape: 64 MiB chunks (110 tokens at vocab 151936) made the LM head 150 thin GEMMs per step; 1 GiB of
  // fp32 logits (+0.5 GiB bf16 gradient) gives ~1770-token chunks. The CPU keeps 64 MiB.
  const int64_t chunk_bytes = ops_.activation_dtype() == DType::F32 ? int64_t(64) << 20 : int64_t(1) << 30;
  a->head_chunk = int(std::max<int64_t>(1, std::min<int64_t>(N, chunk_bytes / (4 * V))));
  Arena& ar = a->arena;
  const DType act = ops_.activation_dtype(), f32 = DType::F32;
  std::vector<std::pair<Tensor*, size_t>> bind;
  auto one = [&](Tensor& t, Shape s, DType dt) { bind.push_back({&t, ar.plan(std::move(s), dt)}); };
  // Recomputed tensors get one buffer that every layer's entry aliases: only the layer in hand needs it.
  std::vector<std::pair<std::vector<Tensor>*, size_t>> aliased;
  auto per_layer = [&](std::vector<Tensor>& v, Shape s, int64_t count, DType dt, bool recomputed = false) {
    v.resize(size_t(count));
    if (recomputed) {
      one(v[0], s, dt);
      aliased.push_back({&v, size_t(count)});
    } else {
      for (auto& t : v) one(t, s, dt);
    }
  };
  a->recompute = recompute;
  const bool attn_rc = recompute == Recompute::Full, mlp_rc = recompute != Recompute::None;
  per_layer(a->resid, {N, D}, L + 1, act);
  per_layer(a->h1, {N, D}, L, act, attn_rc);
  per_layer(a->rstd1, {N}, L, f32, attn_rc);
  per_layer(a->q, {N, H, hd}, L, act, attn_rc);
  per_layer(a->k, {N, Hkv, hd}, L, act, attn_rc);
  per_layer(a->v, {N, Hkv, hd}, L, act, attn_rc);
  if (c.qk_norm) {
    per_layer(a->q_raw, {N, H, hd}, L, act, attn_rc);
    per_layer(a->k_raw, {N, Hkv, hd}, L, act, attn_rc);
    per_layer(a->q_rstd, {N * H}, L, f32, attn_rc);
    per_layer(a->k_rstd, {N * Hkv}, L, f32, attn_rc);
  }
  per_layer(a->attn, {N, H * hd}, L, act, attn_rc);
  per_layer(a->lse, {H, N}, L, f32, attn_rc);
  per_layer(a->mid, {N, D}, L, act, attn_rc);
  per_layer(a->h2, {N, D}, L, act, mlp_rc);
  per_layer(a->rstd2, {N}, L, f32, mlp_rc);
  per_layer(a->gate, {N, F}, L, act, mlp_rc);
  per_layer(a->up, {N, F}, L, act, mlp_rc);
  per_layer(a->act, {N, F}, L, act, mlp_rc);
  one(a->hf, {N, D}, act);
  one(a->rstdf, {N}, f32);
  for (Tensor* t : {&a->tmp, &a->dres, &a->dh, &a->dhf}) one(*t, {N, D}, act);
  for (Tensor* t : {&a->dact, &a->dgate, &a->dup}) one(*t, {N, F}, act);
  one(a->dattn, {N, H * hd}, act);
  one(a->dq, {N, H, hd}, act);
  one(a->dk, {N, Hkv, hd}, act);
  one(a->dv, {N, Hkv, hd}, act);
  if (c.qk_norm) {
    one(a->dq_raw, {N, H, hd}, act);
    one(a->dk_raw, {N, Hkv, hd}, act);
  }
  one(a->logits, {a->head_chunk, V}, f32);
  if (act != f32) one(a->dlogits, {a->head_chunk, V}, act);
  one(a->row_loss, {N}, f32);
  one(a->ids, {N}, DType::I32);
  one(a->targets, {N}, DType::I32);
  one(a->positions, {N}, DType::I32);
  one(a->cu_seqlens, {N + 1}, DType::I32);  // packed batches: up to one document per token
  if (lora_) {
    int64_t widest = 0;
    for (int t = 0; t < kLoraTargets; ++t) {
      const auto [out, in] = proj_shape(c, LoraTarget(t));
      widest = std::max({widest, out, in});
      const bool mlp_target = t >= int(LoraTarget::gate);  // gate, up, down belong to the MLP half
      if (lora_->targets(LoraTarget(t)))
        per_layer(a->lora_u[size_t(t)], {N, lora_->r}, L, act, mlp_target ? mlp_rc : attn_rc);
    }
    // dropout(x) and its gradient exist only with dropout; B's output always
    if (lora_->dropout > 0)
      for (Tensor* t : {&a->lora_x, &a->lora_dx}) one(*t, {N * widest}, act);
    one(a->lora_g, {N, lora_->r}, act);
  }
  ar.bind(ops_.alloc(ar.total_bytes()));
  for (auto& [t, h] : bind) *t = ar.get(h);
  for (auto& [v, count] : aliased) v->assign(count, (*v)[0]);
  if (act == f32) a->dlogits = a->logits;  // the gradient overwrites the logits in place
  if (!c.qk_norm) {                        // without q/k norm, RoPE rotates the projections in place
    a->q_raw = a->q;
    a->k_raw = a->k;
  }
  acts_ = std::move(a);
}

StepResult Transformer::step(const HostBatch& batch, bool backward, float* logits_out) {
  SOLTRAIN_CHECK(acts_ && acts_->rows == batch.rows && acts_->seq_len == batch.seq_len,
                 "step() on a batch shape that plan() did not size");
  Activations& a = *acts_;
  Ops& o = ops_;
  const auto& c = config_;
  const int64_t N = int64_t(batch.rows) * batch.seq_len, H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
  const int64_t V = c.vocab_size, L = c.num_layers;
  const float scale = 1.0f / std::sqrt(float(hd));
  const float eps = float(c.rms_norm_eps);

  // Document layout: the packing loader's (positions restart per document), or one document per row.
  std::vector<int32_t> pos = batch.positions, cu = batch.cu_seqlens;
  if (cu.empty()) {
    pos.resize(size_t(N));
    cu.resize(size_t(batch.rows) + 1);
    for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = int32_t(n % batch.seq_len);
    for (int r = 0; r <= batch.rows; ++r) cu[size_t(r)] = r * batch.seq_len;
  }
  SOLTRAIN_CHECK(int64_t(pos.size()) == N && cu.size() >= 2 && cu.front() == 0 && cu.back() == N,
                 "batch positions / cu_seqlens do not describe ", N, " tokens");
  int max_len = 0;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    SOLTRAIN_CHECK(cu[d + 1] > cu[d], "empty or decreasing document in cu_seqlens");
    max_len = std::max(max_len, cu[d + 1] - cu[d]);
  }
  auto host = [](const std::vector<int32_t>& v) {
    return Tensor{const_cast<int32_t*>(v.data()), DType::I32, {int64_t(v.size())}, Device::CPU};
  };
  o.copy(a.ids, host(batch.input_ids));
  o.copy(a.targets, host(batch.targets));
  o.copy(a.positions, host(pos));
  a.seq = SeqLayout{a.cu_seqlens.rows(0, int64_t(cu.size())), a.positions, max_len};
  o.copy(a.seq.cu_seqlens, host(cu));
  int64_t counted = 0;
  for (int32_t t : batch.targets) counted += t != -100;
  const float grad_scale = counted ? 1.0f / float(counted) : 0.0f;
  dropout_now_ = backward && dropout_enabled_ && lora_ && lora_->dropout > 0;
  const Tensor inv_freq{inv_freq_.data(), DType::F32, {hd / 2}, o.device()};

  // ---- forward
  a.scale = scale;
  a.eps = eps;
  a.inv_freq = inv_freq;
  Parameter& embed = params_.at(kEmbed);
  o.embedding_forward(a.resid[0], a.ids, embed.value);
  // Each residual add is fused with the RMSNorm after it (the next layer's ln1, or the final norm), so
  // only the first layer normalises its own input here.
  for (int64_t l = 0; l < L; ++l) {
    forward_attention(l, l == 0);
    forward_mlp(l, true, false);
  }
  Parameter& final_norm = params_.at(kFinalNorm);

  // ---- LM head + cross-entropy, chunked over tokens; backward through the head happens per chunk
  Parameter& head = params_.at(lm_head_name());
  for (int64_t t0 = 0; t0 < N; t0 += a.head_chunk) {
    const int64_t t1 = std::min(N, t0 + a.head_chunk);
    Tensor logits = a.logits.rows(0, t1 - t0);
    const Tensor hf = a.hf.rows(t0, t1);
    o.linear_forward(logits, hf, head.value, nullptr);
    if (logits_out) o.copy(Tensor{logits_out + t0 * V, DType::F32, {t1 - t0, V}, Device::CPU}, logits);
    Tensor dlogits = a.dlogits.rows(0, t1 - t0);
    o.cross_entropy(logits, dlogits, a.row_loss.rows(t0, t1), a.targets.rows(t0, t1), grad_scale);
    if (backward) {
      Tensor dhf = a.dhf.rows(t0, t1);
      o.linear_backward(&dhf, false, grad(&head), nullptr, dlogits, hf, head.value);
    }
  }
  // Summing the loss waits for the device: done last, so backward is queued behind the forward first.
  const auto loss = [&] {
    return counted ? o.sum(a.row_loss) / double(counted) : std::numeric_limits<double>::quiet_NaN();
  };
  if (!backward) return {loss(), counted};

  // ---- backward (frozen parameters get no gradient: their grad pointers are null)
  o.rmsnorm_backward(a.dres, false, grad_or_empty(&final_norm), a.dhf, a.resid[L], final_norm.value, a.rstdf);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Layer& w = layers_[size_t(l)];
    // Recompute what was not kept (same ops, same inputs, same dropout seeds: bitwise the same values).
    if (a.recompute == Recompute::Full) forward_attention(l, true);  // (its fused add + norm refills h2 too)
    if (a.recompute != Recompute::None) forward_mlp(l, false, a.recompute == Recompute::Selective);
    // MLP: resid[l+1] = mid + down(swiglu(gate(h2), up(h2)))
    proj_backward(l, LoraTarget::down, &a.dact, false, a.dres, a.act[l]);
    o.swiglu_backward(a.dgate, a.dup, a.dact, a.gate[l], a.up[l]);
    proj_backward(l, LoraTarget::gate, &a.dh, false, a.dgate, a.h2[l]);
    proj_backward(l, LoraTarget::up, &a.dh, true, a.dup, a.h2[l]);
    o.rmsnorm_backward(a.dres, true, grad_or_empty(w.ln2), a.dh, a.mid[l], w.ln2->value, a.rstd2[l]);
    // attention: mid = resid[l] + o_proj(attn(rope(norm(q)), rope(norm(k)), v))
    proj_backward(l, LoraTarget::o, &a.dattn, false, a.dres, a.attn[l]);
    o.attention_backward(a.dq, a.dk, a.dv, a.dattn.view({N, H, hd}), a.q[l], a.k[l], a.v[l], a.attn[l].view({N, H, hd}),
                         a.lse[l], a.seq, scale);
    Tensor dq_raw = a.dq, dk_raw = a.dk;
    if (c.qk_norm) {
      dq_raw = a.dq_raw;
      dk_raw = a.dk_raw;
      o.qk_norm_rope_backward(dq_raw, grad_or_empty(w.q_norm), a.dq, a.q_raw[l], w.q_norm->value, a.q_rstd[l], a.seq,
                              inv_freq);
      o.qk_norm_rope_backward(dk_raw, grad_or_empty(w.k_norm), a.dk, a.k_raw[l], w.k_norm->value, a.k_rstd[l], a.seq,
                              inv_freq);
    } else {
      o.rope(a.dq, a.seq, inv_freq, true);
      o.rope(a.dk, a.seq, inv_freq, true);
    }
    proj_backward(l, LoraTarget::q, &a.dh, false, dq_raw.view({N, H * hd}), a.h1[l]);
    proj_backward(l, LoraTarget::k, &a.dh, true, dk_raw.view({N, Hkv * hd}), a.h1[l]);
    proj_backward(l, LoraTarget::v, &a.dh, true, a.dv.view({N, Hkv * hd}), a.h1[l]);
    o.rmsnorm_backward(a.dres, true, grad_or_empty(w.ln1), a.dh, a.resid[l], w.ln1->value, a.rstd1[l]);
  }
  // The embedding's backward only produces its gradient: a frozen one needs none.
  if (embed.trainable) o.embedding_backward(embed.grad, a.ids, a.dres);
  if (dropout_now_) ++dropout_step_;  // after backward, which regenerates this step's masks
  return {loss(), counted};
}

void Transformer::forward_attention(int64_t l, bool norm_input) {
  Activations& a = *acts_;
  Ops& o = ops_;
  const auto& c = config_;
  const Layer& w = layers_[size_t(l)];
  const int64_t N = a.resid[0].dim(0), H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
  if (norm_input) o.rmsnorm_forward(a.h1[l], a.rstd1[l], a.resid[l], w.ln1->value, a.eps);
  proj_forward(l, LoraTarget::q, a.q_raw[l].view({N, H * hd}), a.h1[l]);
  proj_forward(l, LoraTarget::k, a.k_raw[l].view({N, Hkv * hd}), a.h1[l]);
  proj_forward(l, LoraTarget::v, a.v[l].view({N, Hkv * hd}), a.h1[l]);
  if (c.qk_norm) {
    o.qk_norm_rope_forward(a.q[l], a.q_rstd[l], a.q_raw[l], w.q_norm->value, a.seq, a.inv_freq, a.eps);
    o.qk_norm_rope_forward(a.k[l], a.k_rstd[l], a.k_raw[l], w.k_norm->value, a.seq, a.inv_freq, a.eps);
  } else {
    o.rope(a.q[l], a.seq, a.inv_freq, false);
    o.rope(a.k[l], a.seq, a.inv_freq, false);
  }
  o.attention_forward(a.attn[l].view({N, H, hd}), a.lse[l], a.q[l], a.k[l], a.v[l], a.seq, a.scale);
  proj_forward(l, LoraTarget::o, a.tmp, a.attn[l]);
  // mid = resid + o_proj(...), fused with the MLP's input norm (bitwise the norm forward_mlp recomputes)
  o.add_rmsnorm_forward(a.mid[l], a.h2[l], a.rstd2[l], a.resid[l], a.tmp, w.ln2->value, a.eps);
}

void Transformer::forward_mlp(int64_t l, bool write_residual, bool norm_input) {
  Activations& a = *acts_;
  Ops& o = ops_;
  const Layer& w = layers_[size_t(l)];
  if (norm_input) o.rmsnorm_forward(a.h2[l], a.rstd2[l], a.mid[l], w.ln2->value, a.eps);
  proj_forward(l, LoraTarget::gate, a.gate[l], a.h2[l]);
  proj_forward(l, LoraTarget::up, a.up[l], a.h2[l]);
  o.swiglu_forward(a.act[l], a.gate[l], a.up[l]);
  // The down projection's output is needed only for the residual; with LoRA its adapter input u (saved
  // by proj_forward) is needed by backward, so a recompute still runs it when down has an adapter.
  const bool down_adapted = layers_[size_t(l)].proj[size_t(LoraTarget::down)].lora_a != nullptr;
  if (!write_residual && !down_adapted) return;
  proj_forward(l, LoraTarget::down, a.tmp, a.act[l]);
  if (!write_residual) return;
  // resid[l+1] = mid + down(...), fused with the norm that reads it: the next layer's ln1, or the final norm
  const int64_t L = int64_t(layers_.size());
  if (l + 1 < L)
    o.add_rmsnorm_forward(a.resid[l + 1], a.h1[l + 1], a.rstd1[l + 1], a.mid[l], a.tmp,
                          layers_[size_t(l + 1)].ln1->value, a.eps);
  else
    o.add_rmsnorm_forward(a.resid[L], a.hf, a.rstdf, a.mid[l], a.tmp, params_.at(kFinalNorm).value, a.eps);
}

uint64_t Transformer::dropout_seed(int64_t l, LoraTarget t) const {
  // Distinct streams per (seed, step, layer, projection); the mask hash mixes the bits further.
  return lora_->seed * 0x9E3779B97F4A7C15ull + uint64_t(dropout_step_) * 0xD1B54A32D192ED03ull +
         uint64_t(l * kLoraTargets + int(t)) * 0xBF58476D1CE4E5B9ull;
}

void Transformer::proj_forward(int64_t l, LoraTarget t, Tensor y, const Tensor& x) {
  const Proj& p = layers_[size_t(l)].proj[size_t(t)];
  Ops& o = ops_;
  o.linear_forward(y, x, p.w->value, p.b ? &p.b->value : nullptr);
  if (!p.lora_a) return;
  Activations& a = *acts_;
  const int64_t N = x.dim(0), in = x.dim(1);
  Tensor xin = x;
  if (dropout_now_) {
    xin = Tensor{a.lora_x.data, a.lora_x.dtype, {N, in}, a.lora_x.device};
    o.dropout_scale(xin, x, 1.0f, lora_->dropout, dropout_seed(l, t));
  }
  // u = scale·(x·Aᵀ) is saved: B's gradient is dyᵀ·u. The scale rides on the GEMM's alpha, and B's
  // product accumulates straight into y (beta = 1): no pass over [N, out] beyond the GEMMs.
  Tensor u = a.lora_u[size_t(t)][size_t(l)];
  o.linear_forward(u, xin, p.lora_a->value, nullptr, lora_->scale());
  o.linear_forward(y, u, p.lora_b->value, nullptr, 1.0f, /*accumulate=*/true);
}

void Transformer::proj_backward(int64_t l, LoraTarget t, Tensor* dx, bool accumulate_dx, const Tensor& dy,
                                const Tensor& x) {
  const Proj& p = layers_[size_t(l)].proj[size_t(t)];
  Ops& o = ops_;
  // A frozen base linear still passes the gradient on to its input, but computes no dW / db.
  o.linear_backward(dx, accumulate_dx, grad(p.w), p.b ? grad(p.b) : nullptr, dy, x, p.w->value);
  if (!p.lora_a) return;
  Activations& a = *acts_;
  const int64_t N = x.dim(0), in = x.dim(1);
  // g = scale·(dy·B) = d loss / d(x·Aᵀ); dB += dyᵀ·u.
  o.linear_backward(&a.lora_g, false, &p.lora_b->grad, nullptr, dy, a.lora_u[size_t(t)][size_t(l)], p.lora_b->value);
  o.dropout_scale(a.lora_g, a.lora_g, lora_->scale(), 0.0f, 0);
  if (!dropout_now_) {
    o.linear_backward(dx, true, &p.lora_a->grad, nullptr, a.lora_g, x, p.lora_a->value);
    return;
  }
  // With dropout, regenerate forward's dropped input from the same seed, and drop the same gradient entries.
  const uint64_t seed = dropout_seed(l, t);
  Tensor xin{a.lora_x.data, a.lora_x.dtype, {N, in}, a.lora_x.device};
  Tensor dxin{a.lora_dx.data, a.lora_dx.dtype, {N, in}, a.lora_dx.device};
  o.dropout_scale(xin, x, 1.0f, lora_->dropout, seed);
  o.linear_backward(&dxin, false, &p.lora_a->grad, nullptr, a.lora_g, xin, p.lora_a->value);
  o.dropout_scale(dxin, dxin, 1.0f, lora_->dropout, seed);
  o.add_inplace(*dx, dxin);
}

void validate_batch(const HostBatch& b, int vocab_size, const std::string& source) {
  const size_t n = size_t(b.rows) * size_t(b.seq_len);
  if (b.input_ids.size() != n || b.targets.size() != n)
    user_error(source, ": input_ids and targets must both have ", b.rows, "x", b.seq_len, " tokens");
  for (size_t i = 0; i < n; ++i) {
    if (b.input_ids[i] < 0 || b.input_ids[i] >= vocab_size)
      user_error(source, ": input_ids[", i / b.seq_len, ", ", i % b.seq_len, "] = ", b.input_ids[i],
                 " is outside the vocabulary [0, ", vocab_size, ")");
    if (b.targets[i] != -100 && (b.targets[i] < 0 || b.targets[i] >= vocab_size))
      user_error(source, ": targets[", i / b.seq_len, ", ", i % b.seq_len, "] = ", b.targets[i],
                 " is neither -100 nor inside the vocabulary [0, ", vocab_size, ")");
  }
}

}  // namespace soltrain
