#include "model/transformer.h"

#include <cmath>
#include <limits>

namespace soltrain {

namespace {
const char* kEmbed = "model.embed_tokens.weight";
const char* kFinalNorm = "model.norm.weight";
const char* kLmHead = "lm_head.weight";
}  // namespace

// Pointers into the ParameterStore for one decoder layer; null where the config has no such tensor.
struct Transformer::Layer {
  Parameter *ln1, *q, *q_b, *k, *k_b, *v, *v_b, *q_norm, *k_norm, *o, *o_b;
  Parameter *ln2, *gate, *gate_b, *up, *up_b, *down, *down_b;
};

// Everything forward saves for backward, plus backward's scratch.
struct Transformer::Activations {
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
};

Transformer::Transformer(ModelConfig config, Ops& ops) : config_(std::move(config)), ops_(ops) {
  const auto& c = config_;
  const int64_t D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  params_.add(kEmbed, {c.vocab_size, D});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    params_.add(p + "input_layernorm.weight", {D});
    for (auto [proj, out] : {std::pair{"q_proj", c.q_dim()}, {"k_proj", c.kv_dim()}, {"v_proj", c.kv_dim()}}) {
      params_.add(p + "self_attn." + proj + ".weight", {out, D});
      if (c.qkv_bias) params_.add(p + "self_attn." + proj + ".bias", {out});
    }
    if (c.qk_norm) {
      params_.add(p + "self_attn.q_norm.weight", {hd});
      params_.add(p + "self_attn.k_norm.weight", {hd});
    }
    params_.add(p + "self_attn.o_proj.weight", {D, c.q_dim()});
    if (c.o_bias) params_.add(p + "self_attn.o_proj.bias", {D});
    params_.add(p + "post_attention_layernorm.weight", {D});
    for (auto [proj, out, in] : {std::tuple{"gate_proj", F, D}, {"up_proj", F, D}, {"down_proj", D, F}}) {
      params_.add(p + "mlp." + proj + ".weight", {out, in});
      if (c.mlp_bias) params_.add(p + "mlp." + proj + ".bias", {out});
    }
  }
  params_.add(kFinalNorm, {D});
  if (!c.tie_word_embeddings) params_.add(kLmHead, {c.vocab_size, D});
  params_.allocate(ops_);

  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    auto P = [&](const std::string& n) { return params_.find(p + n); };
    layers_.push_back(Layer{P("input_layernorm.weight"), P("self_attn.q_proj.weight"), P("self_attn.q_proj.bias"),
                            P("self_attn.k_proj.weight"), P("self_attn.k_proj.bias"), P("self_attn.v_proj.weight"),
                            P("self_attn.v_proj.bias"), P("self_attn.q_norm.weight"), P("self_attn.k_norm.weight"),
                            P("self_attn.o_proj.weight"), P("self_attn.o_proj.bias"),
                            P("post_attention_layernorm.weight"), P("mlp.gate_proj.weight"), P("mlp.gate_proj.bias"),
                            P("mlp.up_proj.weight"), P("mlp.up_proj.bias"), P("mlp.down_proj.weight"),
                            P("mlp.down_proj.bias")});
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

void Transformer::plan(int rows, int seq_len) {
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
  auto per_layer = [&](std::vector<Tensor>& v, Shape s, int64_t count, DType dt) {
    v.resize(size_t(count));
    for (auto& t : v) one(t, s, dt);
  };
  per_layer(a->resid, {N, D}, L + 1, act);
  per_layer(a->h1, {N, D}, L, act);
  per_layer(a->rstd1, {N}, L, f32);
  per_layer(a->q, {N, H, hd}, L, act);
  per_layer(a->k, {N, Hkv, hd}, L, act);
  per_layer(a->v, {N, Hkv, hd}, L, act);
  if (c.qk_norm) {
    per_layer(a->q_raw, {N, H, hd}, L, act);
    per_layer(a->k_raw, {N, Hkv, hd}, L, act);
    per_layer(a->q_rstd, {N * H}, L, f32);
    per_layer(a->k_rstd, {N * Hkv}, L, f32);
  }
  per_layer(a->attn, {N, H * hd}, L, act);
  per_layer(a->lse, {H, N}, L, f32);
  per_layer(a->mid, {N, D}, L, act);
  per_layer(a->h2, {N, D}, L, act);
  per_layer(a->rstd2, {N}, L, f32);
  per_layer(a->gate, {N, F}, L, act);
  per_layer(a->up, {N, F}, L, act);
  per_layer(a->act, {N, F}, L, act);
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
  ar.bind(ops_.alloc(ar.total_bytes()));
  for (auto& [t, h] : bind) *t = ar.get(h);
  if (act == f32) a->dlogits = a->logits;  // the gradient overwrites the logits in place
  if (!c.qk_norm) {  // without q/k norm, RoPE rotates the projections in place
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
  const Tensor inv_freq{inv_freq_.data(), DType::F32, {hd / 2}, o.device()};
  auto bias = [](Parameter* p) { return p ? &p->value : nullptr; };

  // ---- forward
  Parameter& embed = params_.at(kEmbed);
  o.embedding_forward(a.resid[0], a.ids, embed.value);
  for (int64_t l = 0; l < L; ++l) {
    const Layer& w = layers_[size_t(l)];
    o.rmsnorm_forward(a.h1[l], a.rstd1[l], a.resid[l], w.ln1->value, eps);
    o.linear_forward(a.q_raw[l].view({N, H * hd}), a.h1[l], w.q->value, bias(w.q_b));
    o.linear_forward(a.k_raw[l].view({N, Hkv * hd}), a.h1[l], w.k->value, bias(w.k_b));
    o.linear_forward(a.v[l].view({N, Hkv * hd}), a.h1[l], w.v->value, bias(w.v_b));
    if (c.qk_norm) {
      o.rmsnorm_forward(a.q[l], a.q_rstd[l], a.q_raw[l], w.q_norm->value, eps);
      o.rmsnorm_forward(a.k[l], a.k_rstd[l], a.k_raw[l], w.k_norm->value, eps);
    }
    o.rope(a.q[l], a.seq, inv_freq, false);
    o.rope(a.k[l], a.seq, inv_freq, false);
    o.attention_forward(a.attn[l].view({N, H, hd}), a.lse[l], a.q[l], a.k[l], a.v[l], a.seq, scale);
    o.linear_forward(a.tmp, a.attn[l], w.o->value, bias(w.o_b));
    o.copy(a.mid[l], a.resid[l]);
    o.add_inplace(a.mid[l], a.tmp);
    o.rmsnorm_forward(a.h2[l], a.rstd2[l], a.mid[l], w.ln2->value, eps);
    o.linear_forward(a.gate[l], a.h2[l], w.gate->value, bias(w.gate_b));
    o.linear_forward(a.up[l], a.h2[l], w.up->value, bias(w.up_b));
    o.swiglu_forward(a.act[l], a.gate[l], a.up[l]);
    o.linear_forward(a.tmp, a.act[l], w.down->value, bias(w.down_b));
    o.copy(a.resid[l + 1], a.mid[l]);
    o.add_inplace(a.resid[l + 1], a.tmp);
  }
  Parameter& final_norm = params_.at(kFinalNorm);
  o.rmsnorm_forward(a.hf, a.rstdf, a.resid[L], final_norm.value, eps);

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
      o.linear_backward(&dhf, false, &head.grad, nullptr, dlogits, hf, head.value);
    }
  }
  const double loss = counted ? o.sum(a.row_loss) / double(counted) : std::numeric_limits<double>::quiet_NaN();
  if (!backward) return {loss, counted};

  // ---- backward
  auto grad = [](Parameter* p) { return p ? &p->grad : nullptr; };
  o.rmsnorm_backward(a.dres, false, final_norm.grad, a.dhf, a.resid[L], final_norm.value, a.rstdf);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Layer& w = layers_[size_t(l)];
    // MLP: resid[l+1] = mid + down(swiglu(gate(h2), up(h2)))
    o.linear_backward(&a.dact, false, &w.down->grad, grad(w.down_b), a.dres, a.act[l], w.down->value);
    o.swiglu_backward(a.dgate, a.dup, a.dact, a.gate[l], a.up[l]);
    o.linear_backward(&a.dh, false, &w.gate->grad, grad(w.gate_b), a.dgate, a.h2[l], w.gate->value);
    o.linear_backward(&a.dh, true, &w.up->grad, grad(w.up_b), a.dup, a.h2[l], w.up->value);
    o.rmsnorm_backward(a.dres, true, w.ln2->grad, a.dh, a.mid[l], w.ln2->value, a.rstd2[l]);
    // attention: mid = resid[l] + o_proj(attn(rope(norm(q)), rope(norm(k)), v))
    o.linear_backward(&a.dattn, false, &w.o->grad, grad(w.o_b), a.dres, a.attn[l], w.o->value);
    o.attention_backward(a.dq, a.dk, a.dv, a.dattn.view({N, H, hd}), a.q[l], a.k[l], a.v[l], a.attn[l].view({N, H, hd}),
                         a.lse[l], a.seq, scale);
    o.rope(a.dq, a.seq, inv_freq, true);
    o.rope(a.dk, a.seq, inv_freq, true);
    Tensor dq_raw = a.dq, dk_raw = a.dk;
    if (c.qk_norm) {
      dq_raw = a.dq_raw;
      dk_raw = a.dk_raw;
      o.rmsnorm_backward(dq_raw, false, w.q_norm->grad, a.dq, a.q_raw[l], w.q_norm->value, a.q_rstd[l]);
      o.rmsnorm_backward(dk_raw, false, w.k_norm->grad, a.dk, a.k_raw[l], w.k_norm->value, a.k_rstd[l]);
    }
    o.linear_backward(&a.dh, false, &w.q->grad, grad(w.q_b), dq_raw.view({N, H * hd}), a.h1[l], w.q->value);
    o.linear_backward(&a.dh, true, &w.k->grad, grad(w.k_b), dk_raw.view({N, Hkv * hd}), a.h1[l], w.k->value);
    o.linear_backward(&a.dh, true, &w.v->grad, grad(w.v_b), a.dv.view({N, Hkv * hd}), a.h1[l], w.v->value);
    o.rmsnorm_backward(a.dres, true, w.ln1->grad, a.dh, a.resid[l], w.ln1->value, a.rstd1[l]);
  }
  o.embedding_backward(embed.grad, a.ids, a.dres);
  return {loss, counted};
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
