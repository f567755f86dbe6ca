#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/host_memory.h"

namespace soltrain {

namespace {
const char* kEmbed = "model.embed_tokens.weight";
const char* kFinalNorm = "model.norm.weight";
const char* kLmHead = "lm_head.weight";
const char* kScore = "score.weight";    // a classifier's head (transformers' name)
const char* kScoreBias = "score.bias";  // a token classifier's (its nn.Linear keeps the bias)

// For ops whose weight gradient is not optional (RMSNorm): an empty tensor the op must skip.
Tensor grad_or_empty(Parameter* p) {
  return p->trainable ? p->grad : Tensor{};
}
}  // namespace

int64_t HostBatch::counted() const {
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != -100; });
}

// Everything forward saves for backward, plus backward's scratch.
struct Transformer::Activations {
  Recompute recompute = Recompute::None;
  float scale = 0, eps = 0;
  int rows = 0, seq_len = 0, head_chunk = 0;
  int64_t tile = 0;  // the MLP's token tile
  ActivationPlan plan;
  Arena arena;
  // per layer, saved
  std::vector<Tensor> resid;  // L+1 residual streams [N,D]: input of layer l, and the final one
  std::vector<Tensor> h1, rstd1, q_raw, k_raw, q_rstd, k_rstd, q, k, v, attn, lse, mid, h2, rstd2;
  std::vector<Tensor> gate, up, act;  // per dense-MLP layer (ModelConfig::dense_mlp_index)
  // per MoE layer (ModelConfig::moe_index): model/moe.h's MoeTensors
  std::vector<Tensor> moe_logits, moe_probs, moe_expert, moe_weight, moe_rows, moe_slot, moe_offsets, moe_xs, moe_gate,
      moe_up, moe_act, moe_ys, moe_u_gate_up, moe_u_down, moe_u_router, moe_u_shared_gate, moe_shared_gate,
      moe_shared_up, moe_shared_act, moe_shared_out, moe_shared_logit, moe_xl, moe_yl;
  Tensor moe_dequant;  // a quantised base's experts of one projection (scratch)
  MoeGrads moe_grads;
  MoeStats moe_stats;
  bool aux_on = false;  // this pass's backward adds the load-balancing loss's gradient (moe_grads.aux_grad)
  Tensor hf, rstdf;     // final norm
  // scratch. dres is the residual stream's gradient (in its dtype); dres_act the same rounded to the
  // activation dtype for the GEMMs that read it (the same tensor when the dtypes agree).
  Tensor tmp, dres, dres_act, dh, dhf, dact, dgate, dup, dattn, dq, dk, dv, dq_raw, dk_raw, logits, dlogits;
  // the objective's view: per-token NLL, d loss / d NLL, per-document sums
  Tensor token_nll, token_weight, doc_nll, token_entropy;
  ForwardOutputs out;
  bool head_fused = false, backward_pending = false;
  // batch on the device, and its pinned staging (two slots, so one can fill while the other is copied)
  Tensor ids, targets, positions, cu_seqlens;
  SeqLayout seq;
  Buffer staging;
  uint64_t staged_mark[2] = {0, 0};
  int next_slot = 0;
  // LoRA: scale·(x·Aᵀ) per layer and projection [N, r] (saved), and scratch sized for the widest projection
  std::array<std::vector<Tensor>, kLoraTargets> lora_u;
  LoraScratch lora_scratch;
  // `offload_activations`: resid[j] is device slot j % slots of a ring; layers below host_layers also have a
  // host copy, host[j] (see "The offloaded checkpoints' ring" below).
  struct Ring {
    bool on = false, downloads = false;  // downloads: this forward copies out (a backward follows)
    int64_t slots = 0, host_layers = 0;
    int64_t fetched_down_to = 0;  // backward: uploads are queued for layers [fetched_down_to, host_layers)
    Buffer host_buffer;
    std::vector<Tensor> host;  // [host_layers] views of host_buffer
    // Per slot: the mark after the last side-stream copy touching it that Main has not waited for yet (0:
    // none), and the layer whose checkpoint it holds (-1: none).
    std::vector<uint64_t> side_mark;
    std::vector<int64_t> holds;
  } ring;
};

void add_model_parameters(ParameterStore& ps, const ModelConfig& c, const std::optional<LoraConfig>& lora) {
  const bool base_trains = !lora;
  const int outer = c.num_layers;  // the group of the embedding, final norm and LM head
  ps.add(kEmbed, {c.vocab_size, c.hidden_size}, base_trains || lora->saves("embed_tokens"), outer);
  for (int l = 0; l < c.num_layers; ++l) add_layer_parameters(ps, c, l, lora);
  ps.add(kFinalNorm, {c.hidden_size}, base_trains, outer);
  // A classifier's score head trains under LoRA too (PEFT's modules_to_save for SEQ_CLS: it starts untrained)
  if (c.num_labels > 0) {
    ps.add(kScore, {c.num_labels, c.hidden_size}, true, outer);
    if (c.token_classifier) ps.add(kScoreBias, {c.num_labels}, true, outer);
  } else if (!c.tie_word_embeddings)
    ps.add(kLmHead, {c.vocab_size, c.hidden_size}, base_trains || lora->saves("lm_head"), outer);
  if (lora)
    for (int l = 0; l < c.num_layers; ++l) add_lora_parameters(ps, c, l, *lora);
  if (lora && lora->offload_base)
    ps.keep_frozen_on_host(WeightStream::streamed_layers(c.num_layers, lora->offload_resident_layers));
}

std::string modules_to_save_refusal(const std::vector<std::string>& modules, const ModelConfig& c) {
  if (!modules.empty() && c.num_labels > 0)
    return "lora_modules_to_save on a reward model (its score head already trains beside the adapters) is not built "
           "yet";
  return "";
}

void untie_for_modules_to_save(ModelConfig& c, const std::optional<LoraConfig>& lora) {
  // PEFT (ensure_weight_tying false, its default and Axolotl's) wraps each listed module in a trained copy of the
  // one weight both share: the embedding lookup and the LM head then differ, and the one not listed stays the
  // stored weight, frozen.
  if (!lora || !c.tie_word_embeddings || c.num_labels > 0) return;
  if (!lora->saves("embed_tokens") && !lora->saves("lm_head")) return;
  c.tie_word_embeddings = false;
  c.lm_head_from_embedding = true;
}

Transformer::Transformer(ModelConfig config, Ops& ops, std::optional<LoraConfig> lora, StoreOptions store)
    : config_(std::move(config)), lora_(std::move(lora)), ops_(ops) {
  const auto& c = config_;
  const int64_t hd = c.head_dim;
  if (lora_) lora_->validate("lora config");
  if (lora_)
    if (const std::string why = modules_to_save_refusal(lora_->modules_to_save, c); !why.empty()) user_error(why);
  untie_for_modules_to_save(config_, lora_);
  if (hd > ops.max_attention_head_dim())
    user_error("head_dim ", hd, " is not supported on ", ops.device() == Device::CUDA ? "CUDA" : "this device",
               " yet (at most ", ops.max_attention_head_dim(), ")");
  if (lora_ && lora_->expert_targets && !(c.moe_layers() > 0 && c.moe.lora_on_experts))
    user_error("the adapter targets MoE experts (target_parameters) and ", c.architecture, " has none");
  if (lora_ && lora_->shared_expert_gate && !(c.moe_layers() > 0 && c.moe.shared_intermediate_size))
    user_error("the adapter targets shared_expert_gate and ", c.architecture, " has no shared expert");
  if (c.moe_layers() > 0) {
    if (const std::string why = ops.moe_unsupported(c.moe.num_experts, c.moe.top_k); !why.empty())
      user_error(c.architecture, ": ", why);
    // all-linear: PEFT adapts Qwen3-MoE's router too, and Qwen2-MoE's shared_expert_gate (a Linear)
    if (lora_ && lora_->all_linear && c.moe.lora_on_experts) lora_->router = true;
    if (lora_ && lora_->all_linear && c.moe.shared_intermediate_size) lora_->shared_expert_gate = true;
    if (lora_ && lora_->shared_expert_gate && lora_->dropout > 0)
      user_error("lora_dropout ", lora_->dropout, ": the shared_expert_gate's adapter (all-linear on ", c.architecture,
                 ") takes no dropout in soltrain yet; set lora_dropout: 0 or list the projections instead");
    // PEFT fuses gate_proj and up_proj into one adapter over the stacked gate_up_proj, and refuses dropout on
    // adapters of parameters (the experts', the router's)
    const bool experts = lora_ && c.moe.lora_on_experts;
    if (experts && lora_->targets(LoraTarget::gate) != lora_->targets(LoraTarget::up))
      user_error("lora_target_modules: on ", c.architecture,
                 " gate_proj and up_proj are one adapter over the experts' ",
                 "fused gate_up_proj (as PEFT holds it): target both or neither");
    if (experts && lora_->dropout > 0 &&
        (lora_->targets(LoraTarget::gate) || lora_->targets(LoraTarget::down) || lora_->router))
      user_error("lora_dropout ", lora_->dropout, ": PEFT's adapters on the experts and the router (", c.architecture,
                 ") take no dropout; set lora_dropout: 0 or target the attention projections only");
  }
  add_model_parameters(params_, c, lora_);
  params_.allocate(ops_, store);
  if (c.moe_layers() > 0) {
    aux_loss_ = ops_.alloc(sizeof(double));
    aux_loss_t_ = Tensor{aux_loss_.data(), DType::F64, {1}, ops_.device()};
  }
  if (lora_ && lora_->offload_base) weight_stream_ = std::make_unique<WeightStream>(params_, ops_, c.num_layers);

  for (int l = 0; l < c.num_layers; ++l) layers_.push_back(bind_layer(params_, c, l, lora_));
  // Every adapter's A as PEFT initialises it (the projections' and the experts', whose A has E·R rows); B stays 0.
  if (lora_)
    for (Parameter& a : params_.all())
      if (is_lora_name(a.name) && a.name.ends_with(".lora_A.weight")) {
        const auto init = lora_a_init(int(a.shape[0]), int(a.shape[1]), lora_->seed, a.name);
        params_.upload(ops_, a, init.data());
      }

  const std::vector<float> inv = rope_inv_freq(c.rope, c.head_dim);
  inv_freq_ = ops_.alloc(inv.size() * 4);
  inv_freq_t_ = Tensor{inv_freq_.data(), DType::F32, {int64_t(inv.size())}, ops_.device()};
  ops_.copy(inv_freq_t_, Tensor{const_cast<float*>(inv.data()), DType::F32, {int64_t(inv.size())}, Device::CPU});
}

Transformer::~Transformer() = default;

size_t Transformer::fp8_bytes() const {
  return fp8_ ? fp8_->device_bytes() : 0;
}

const std::string& Transformer::lm_head_name() const {
  static const std::string embed = kEmbed, head = kLmHead, score = kScore;
  return config_.num_labels > 0 ? score : config_.tie_word_embeddings ? embed : head;
}

size_t Transformer::activation_bytes() const {
  return acts_ ? acts_->arena.total_bytes() : 0;
}

const ActivationPlan& Transformer::activation_plan() const {
  SOLTRAIN_CHECK(acts_, "activation_plan() before plan()");
  return acts_->plan;
}

size_t Transformer::checkpoint_host_bytes() const {
  return acts_ ? acts_->ring.host_buffer.bytes() : 0;
}

size_t Transformer::staging_bytes() const {
  return acts_ ? acts_->staging.bytes() : 0;
}

std::optional<DType> parse_residual_dtype(const std::string& s, const std::string& where) {
  if (s == "auto") return std::nullopt;
  if (s == "fp32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  user_error(where, ": residual_dtype must be auto, fp32 or bf16, got '", s, "'");
}

void Transformer::enable_fp8(const Fp8Settings& s) {
  SOLTRAIN_CHECK(!fp8_, "enable_fp8 twice");
  const std::string why = ops_.fp8_unsupported();
  if (!why.empty()) user_error("recipe fp8-hybrid: ", why);
  const int L = config_.num_layers;
  if (config_.moe_layers() > 0) user_error(moe_refusal(config_, MoeUnsupported::Fp8Recipe));
  if (s.skip_first_layers < 0 || s.skip_last_layers < 0 || s.skip_first_layers + s.skip_last_layers > L)
    user_error("skip_quant_first_layers + skip_quant_last_layers must be between 0 and the model's ", L, " layers");
  if (weight_stream_)
    user_error(
        "recipe fp8-hybrid keeps FP8 copies of the base's projections on the device, and offload_weights "
        "streams the base from host memory: use one of them");
  fp8_ = std::make_unique<Fp8Recipe>(ops_, s);
  std::vector<std::pair<int64_t, int64_t>> registered;
  for (int l = s.skip_first_layers; l < L - s.skip_last_layers; ++l) {
    DecoderLayer& layer = layers_[size_t(l)];
    auto add = [&](Linear& lin, Fp8Projection* same_input_as) {
      const Parameter& w = lin.weight_parameter();
      Fp8Projection* p = fp8_->add(w.shape[0], w.shape[1], w.trainable, same_input_as, w.format != WeightFormat::Dense);
      registered.emplace_back(w.shape[0], w.shape[1]);
      lin.set_fp8(p);
      return p;
    };
    // q, k, v read the normed input in that order, gate and up the MLP's: one cast each (layer.cpp's order).
    Fp8Projection* q = add(layer.attn.q, nullptr);
    add(layer.attn.k, q);
    add(layer.attn.v, q);
    add(layer.attn.o, nullptr);
    Fp8Projection* gate = add(layer.mlp.gate, nullptr);
    add(layer.mlp.up, gate);
    add(layer.mlp.down, nullptr);
  }
  SOLTRAIN_CHECK(registered == fp8_projection_shapes(config_, s), "enable_fp8: the planned projections differ");
  fp8_->allocate();
  if (acts_) fp8_->plan(int64_t(acts_->rows) * acts_->seq_len);
}

void Transformer::enable_qat(const QatSettings& s) {
  SOLTRAIN_CHECK(!qat_, "enable_qat twice");
  const auto refuse = [](const std::string& what) {
    user_error("qat: quantisation-aware training trains the whole model; ", what);
  };
  if (lora_) refuse("it does not combine with LoRA adapters (Axolotl refuses QAT with peft as well)");
  if (fp8_) refuse("it does not combine with recipe fp8-hybrid");
  if (const std::string why = qat_refusal(s, config_); !why.empty()) user_error(why);
  qat_ = std::make_unique<QatState>(ops_, s);
  for (DecoderLayer& layer : layers_)
    for (Linear* lin :
         {&layer.attn.q, &layer.attn.k, &layer.attn.v, &layer.attn.o, &layer.mlp.gate, &layer.mlp.up, &layer.mlp.down})
      lin->set_qat(qat_.get());
  if (acts_) plan_qat();
}

void Transformer::plan_qat() {
  const int64_t N = int64_t(acts_->rows) * acts_->seq_len, D = config_.hidden_size, F = config_.intermediate_size;
  const int64_t widest = std::max({D, F, int64_t(config_.q_dim())});
  int64_t weight = 0;
  for (const Parameter& p : params_.all())
    if (p.shape.size() == 2) weight = std::max(weight, p.shape[0] * p.shape[1]);  // (the LM head's among them)
  // (the compute copies are in the activation dtype: fp32 on the CPU, bf16 on the GPU)
  qat_->plan(N, widest, weight, ops_.activation_dtype(), ops_.activation_dtype());
}

std::vector<std::pair<int64_t, int64_t>> Transformer::fp8_projection_shapes(const ModelConfig& c,
                                                                            const Fp8Settings& s) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  for (int l = s.skip_first_layers; l < c.num_layers - s.skip_last_layers; ++l)
    for (const auto& shape : {std::pair<int64_t, int64_t>{c.q_dim(), D},
                              {c.kv_dim(), D},
                              {c.kv_dim(), D},
                              {D, c.q_dim()},
                              {F, D},
                              {F, D},
                              {D, F}})
      out.push_back(shape);  // q, k, v, o, gate, up, down: enable_fp8's order
  return out;
}

void Transformer::after_update() {
  if (fp8_) fp8_->after_update();
}

// Every buffer of the activation plan allocated in one arena and bound to its tensor by name (per-layer ones,
// then single tensors); recomputed tensors alias one buffer, offloaded checkpoints a ring of `copies`.
void Transformer::bind_planned_buffers(Activations& a, Ops& ops) {
  // The plan's buffers by name: per-layer ones, then single tensors.
  std::map<std::string, std::vector<Tensor>*> layered = {
      {"resid", &a.resid}, {"h1", &a.h1},       {"rstd1", &a.rstd1}, {"q", &a.q},           {"k", &a.k},
      {"v", &a.v},         {"q_raw", &a.q_raw}, {"k_raw", &a.k_raw}, {"q_rstd", &a.q_rstd}, {"k_rstd", &a.k_rstd},
      {"attn", &a.attn},   {"lse", &a.lse},     {"mid", &a.mid},     {"h2", &a.h2},         {"rstd2", &a.rstd2},
      {"gate", &a.gate},   {"up", &a.up},       {"act", &a.act}};
  for (auto [name, v] : {std::pair{"moe_logits", &a.moe_logits},
                         {"moe_probs", &a.moe_probs},
                         {"moe_expert", &a.moe_expert},
                         {"moe_weight", &a.moe_weight},
                         {"moe_rows", &a.moe_rows},
                         {"moe_slot", &a.moe_slot},
                         {"moe_offsets", &a.moe_offsets},
                         {"moe_xs", &a.moe_xs},
                         {"moe_gate", &a.moe_gate},
                         {"moe_up", &a.moe_up},
                         {"moe_act", &a.moe_act},
                         {"moe_ys", &a.moe_ys},
                         {"moe_u_gate_up", &a.moe_u_gate_up},
                         {"moe_u_down", &a.moe_u_down},
                         {"moe_u_router", &a.moe_u_router},
                         {"moe_u_shared_gate", &a.moe_u_shared_gate},
                         {"moe_shared_gate", &a.moe_shared_gate},
                         {"moe_shared_up", &a.moe_shared_up},
                         {"moe_shared_act", &a.moe_shared_act},
                         {"moe_shared_out", &a.moe_shared_out},
                         {"moe_shared_logit", &a.moe_shared_logit},
                         {"moe_xl", &a.moe_xl},
                         {"moe_yl", &a.moe_yl}})
    layered[name] = v;
  for (int t = 0; t < kLoraTargets; ++t) layered[cat("lora_u.", kLoraModuleNames[size_t(t)])] = &a.lora_u[size_t(t)];
  const std::map<std::string, Tensor*> single = {{"hf", &a.hf},
                                                 {"moe_dys", &a.moe_grads.dys},
                                                 {"moe_lora_g", &a.moe_grads.lora_g},
                                                 {"moe_dequant", &a.moe_dequant},
                                                 {"moe_shared_dact", &a.moe_grads.shared.dact},
                                                 {"moe_shared_dgate", &a.moe_grads.shared.dgate},
                                                 {"moe_shared_dup", &a.moe_grads.shared.dup},
                                                 {"moe_dshared_out", &a.moe_grads.dshared_out},
                                                 {"moe_dshared_logit", &a.moe_grads.dshared_logit},
                                                 {"moe_dxs", &a.moe_grads.dxs},
                                                 {"moe_dyl", &a.moe_grads.dyl},
                                                 {"moe_dxl", &a.moe_grads.dxl},
                                                 {"moe_dact", &a.moe_grads.dact},
                                                 {"moe_dgate", &a.moe_grads.dgate},
                                                 {"moe_dup", &a.moe_grads.dup},
                                                 {"moe_dweight", &a.moe_grads.dweight},
                                                 {"moe_dlogits", &a.moe_grads.dlogits},
                                                 {"moe_aux_grad", &a.moe_grads.aux_grad},
                                                 {"moe_counts", &a.moe_stats.counts},
                                                 {"moe_prob_sum", &a.moe_stats.prob_sum},
                                                 {"rstdf", &a.rstdf},
                                                 {"tmp", &a.tmp},
                                                 {"dh", &a.dh},
                                                 {"dhf", &a.dhf},
                                                 {"dres", &a.dres},
                                                 {"dres_act", &a.dres_act},
                                                 {"dact", &a.dact},
                                                 {"dgate", &a.dgate},
                                                 {"dup", &a.dup},
                                                 {"dattn", &a.dattn},
                                                 {"dq", &a.dq},
                                                 {"dk", &a.dk},
                                                 {"dv", &a.dv},
                                                 {"dq_raw", &a.dq_raw},
                                                 {"dk_raw", &a.dk_raw},
                                                 {"logits", &a.logits},
                                                 {"dlogits", &a.dlogits},
                                                 {"token_nll", &a.token_nll},
                                                 {"token_entropy", &a.token_entropy},
                                                 {"token_weight", &a.token_weight},
                                                 {"doc_nll", &a.doc_nll},
                                                 {"ids", &a.ids},
                                                 {"targets", &a.targets},
                                                 {"positions", &a.positions},
                                                 {"cu_seqlens", &a.cu_seqlens},
                                                 {"lora_x", &a.lora_scratch.x},
                                                 {"lora_dx", &a.lora_scratch.dx},
                                                 {"lora_g", &a.lora_scratch.g}};
  Arena& ar = a.arena;
  std::vector<std::pair<Tensor*, size_t>> bind;
  // Recomputed tensors: one buffer that every layer's entry aliases; offloaded checkpoints: a ring of
  // `copies` buffers, entry i aliasing copy i % copies.
  std::vector<std::pair<std::vector<Tensor>*, size_t>> aliased;
  for (const PlannedBuffer& b : a.plan.buffers) {
    if (b.layers == 0) {
      const auto it = single.find(b.name);
      SOLTRAIN_CHECK(it != single.end(), "planned buffer ", b.name, " has no tensor");
      bind.push_back({it->second, ar.plan(b.shape, b.dtype)});
      continue;
    }
    const auto it = layered.find(b.name);
    SOLTRAIN_CHECK(it != layered.end(), "planned buffer ", b.name, " has no tensors");
    std::vector<Tensor>& v = *it->second;
    v.resize(size_t(b.layers));
    for (int64_t i = 0; i < b.copies; ++i) bind.push_back({&v[size_t(i)], ar.plan(b.shape, b.dtype)});
    if (b.copies < b.layers) aliased.push_back({&v, size_t(b.copies)});
  }
  ar.bind(ops.alloc(ar.total_bytes()));
  for (auto& [t, h] : bind) *t = ar.get(h);
  for (auto& [v, copies] : aliased)
    for (size_t i = copies; i < v->size(); ++i) (*v)[i] = (*v)[i % copies];
}

std::string moe_refusal(const ModelConfig& c, MoeUnsupported what) {
  switch (what) {
    case MoeUnsupported::Fp8Recipe:
      return cat("recipe fp8-hybrid does not cover Mixture-of-Experts layers yet (", c.architecture,
                 "): use recipe: bf16");
    case MoeUnsupported::TokenTile:
      return cat("token_tile: Mixture-of-Experts layers run all of a micro-batch's tokens at once (", c.architecture,
                 "); leave token_tile unset");
    case MoeUnsupported::GenerationOverlap:
      return cat("generation_overlap is not built for Mixture-of-Experts models (", c.architecture,
                 "): drop generation_overlap");
  }
  return {};
}

void Transformer::set_expert_parallel(std::unique_ptr<Communicator> group, const LoadBalance& balance) {
  SOLTRAIN_CHECK(!acts_ && group, "set_expert_parallel after plan()");
  const ModelConfig& c = config_;
  const int P = group->size();
  if (c.moe_layers() == 0) user_error("ep_size ", P, ": ", c.architecture, " has no Mixture-of-Experts layers");
  if (c.moe.num_experts % P != 0) user_error("ep_size ", P, " must divide the model's ", c.moe.num_experts, " experts");
  if (ops_.device() != Device::CPU)
    user_error("ep_size ", P,
               ": expert parallelism runs on CPU ranks for now (its all-to-all over NCCL is not built); "
               "leave ep_size unset on GPUs");
  ep_ = std::make_unique<ExpertParallel>(std::move(group), c.moe.num_experts, c.num_layers, balance);
  SOLTRAIN_CHECK(!c.moe.held_count || (!balance.on && c.moe.held_first == ep_->first_expert() &&
                                       c.moe.held_count == ep_->local_experts()),
                 "the experts held are not the ones this rank runs");
  for (DecoderLayer& layer : layers_)
    if (layer.moe) layer.moe->ep = ep_.get();
}

void Transformer::plan(int rows, int seq_len, Recompute recompute) {
  const int64_t N = int64_t(rows) * seq_len;
  if (config_.moe_layers() > 0 && token_tile_ != kTokenTileAuto)
    user_error(moe_refusal(config_, MoeUnsupported::TokenTile));
  if (offload_checkpoints_ && recompute != Recompute::Full)
    user_error(
        "offload_activations needs recompute: full (it offloads the layer-input checkpoints, the only "
        "activations full recompute keeps); got recompute: ",
        recompute_name(recompute));
  if (fp8_) fp8_->plan(N);
  if (qat_ && token_tile_ != kTokenTileAuto && qat_->settings().activation.kind == FakeQuantKind::Nvfp4)
    user_error(
        "qat: nvfp4 activations take one per-tensor scale over each projection's whole input; token_tile "
        "would split the MLP's into tiles (leave token_tile unset)");
  auto a = std::make_unique<Activations>();
  a->rows = rows;
  a->seq_len = seq_len;
  a->recompute = recompute;
  a->plan = plan_activations(
      config_, {rows, seq_len, recompute, ops_.activation_dtype(), residual_dtype(), lora_ ? &*lora_ : nullptr,
                token_tile_, head_chunk_bytes_for(ops_.activation_dtype(), params_.at(lm_head_name()).trainable),
                offload_checkpoints_, ep_ ? ep_->size() : 1});
  // Offloaded checkpoints that would not fit the host are refused with the figures before anything is
  // allocated (pinned pages past the cgroup's limit get the process killed without a word).
  if (const size_t host = a->plan.host_bytes()) check_host_memory(host, "offload_activations' layer-input checkpoints");
  a->head_chunk = int(a->plan.head_chunk);
  a->tile = a->plan.tile;
  bind_planned_buffers(*a, ops_);
  const auto& c = config_;
  const DType res = residual_dtype(), act = ops_.activation_dtype(), f32 = DType::F32;
  if (res == act) a->dres_act = a->dres;
  if (act == f32) a->dlogits = a->logits;  // the gradient overwrites the logits in place
  if (!c.qk_norm) {                        // without q/k norm, RoPE rotates the projections in place
    a->q_raw = a->q;
    a->k_raw = a->k;
  }
  // ids, targets, positions (N each) and cu_seqlens (up to N + 1) per slot
  a->staging = ops_.alloc_host(2 * size_t(4 * N + 1) * sizeof(int32_t));
  if (const PlannedBuffer* r = a->plan.find("resid"); r && r->host_copies > 0) {
    Activations::Ring& ring = a->ring;
    ring.on = true;
    ring.slots = r->copies;
    ring.host_layers = r->host_copies;
    ring.host_buffer = ops_.alloc_host(r->host_bytes());
    for (int64_t j = 0; j < ring.host_layers; ++j)
      ring.host.push_back(Tensor{static_cast<char*>(ring.host_buffer.data()) + size_t(j) * r->bytes(), r->dtype,
                                 r->shape, ring.host_buffer.device()});
    ring.side_mark.assign(size_t(ring.slots), 0);
    ring.holds.assign(size_t(ring.slots), -1);
  }
  acts_ = std::move(a);
  if (qat_) plan_qat();
}

Tensor Transformer::lora_u(LoraTarget t, int64_t l) const {
  const auto& u = acts_->lora_u[size_t(t)];
  return u.empty() ? Tensor{} : u[size_t(l)];
}

QkvTensors Transformer::qkv(int64_t l) const {
  const Activations& a = *acts_;
  const bool qk = config_.qk_norm;
  return {a.q_raw[l],
          a.k_raw[l],
          a.v[l],
          a.q[l],
          a.k[l],
          qk ? a.q_rstd[l] : Tensor{},
          qk ? a.k_rstd[l] : Tensor{},
          lora_u(LoraTarget::q, l),
          lora_u(LoraTarget::k, l),
          lora_u(LoraTarget::v, l)};
}

MlpTensors Transformer::mlp_tile(int64_t l, int64_t t0, int64_t t1) const {
  const Activations& a = *acts_;
  // Kept for every token unless the MLP is recomputed; else one tile's buffer, refilled for each tile.
  const bool whole = a.recompute < Recompute::Selective;
  const size_t d = size_t(config_.dense_mlp_index(int(l)));
  auto f = [&](const Tensor& t) { return whole ? t.rows(t0, t1) : t.rows(0, t1 - t0); };
  auto u = [&](LoraTarget t) {  // the adapters' u are small ([tokens, r]) and kept whole
    const Tensor x = lora_u(t, l);
    return x.data ? x.rows(t0, t1) : x;
  };
  return {f(a.gate[d]), f(a.up[d]), f(a.act[d]), u(LoraTarget::gate), u(LoraTarget::up), u(LoraTarget::down)};
}

MoeTensors Transformer::moe_tensors(int64_t l) const {
  const Activations& a = *acts_;
  const size_t m = size_t(config_.moe_index(int(l)));
  MoeTensors t{a.moe_logits[m],  a.moe_probs[m], a.moe_expert[m], a.moe_weight[m], a.moe_rows[m], a.moe_slot[m],
               a.moe_offsets[m], a.moe_xs[m],    a.moe_gate[m],   a.moe_up[m],     a.moe_act[m],  a.moe_ys[m]};
  if (!a.moe_xl.empty()) {
    t.xl = a.moe_xl[m];
    t.yl = a.moe_yl[m];
  }
  if (!a.moe_u_gate_up.empty()) t.u_gate_up = a.moe_u_gate_up[m];
  if (!a.moe_u_down.empty()) t.u_down = a.moe_u_down[m];
  if (!a.moe_u_router.empty()) t.u_router = a.moe_u_router[m];
  if (!a.moe_u_shared_gate.empty()) t.u_shared_gate = a.moe_u_shared_gate[m];
  t.dequant = a.moe_dequant;
  if (!a.moe_shared_out.empty()) {
    t.shared = MlpTensors{a.moe_shared_gate[m],        a.moe_shared_up[m],        a.moe_shared_act[m],
                          lora_u(LoraTarget::gate, l), lora_u(LoraTarget::up, l), lora_u(LoraTarget::down, l)};
    t.shared_out = a.moe_shared_out[m];
    t.shared_logit = a.moe_shared_logit[m];
  }
  return t;
}

LoraPass Transformer::lora_pass() const {
  LoraPass p;
  if (lora_) {
    p.dropout = dropout_now_ ? lora_->dropout : 0.0f;
    p.adapters_off = !adapters_on_;
    p.seed = lora_->seed;
    p.step = uint64_t(dropout_step_);
    p.scratch = acts_->lora_scratch;
  }
  return p;
}

void Transformer::upload(const HostBatch& batch) {
  Activations& a = *acts_;
  const int64_t N = int64_t(batch.rows) * batch.seq_len;
  // Document layout: the packing loader's (positions restart per document), or one document per row.
  // It is written straight into the pinned slot, which waits only for its own previous copy.
  const int slot = a.next_slot;
  a.next_slot ^= 1;
  ops_.host_wait(a.staged_mark[slot]);
  int32_t* base = static_cast<int32_t*>(a.staging.data()) + size_t(slot) * size_t(4 * N + 1);
  int32_t *ids = base, *targets = base + N, *pos = base + 2 * N, *cu = base + 3 * N;
  std::copy(batch.input_ids.begin(), batch.input_ids.end(), ids);
  std::copy(batch.targets.begin(), batch.targets.end(), targets);
  int64_t docs = 0;
  if (batch.cu_seqlens.empty()) {
    for (int64_t n = 0; n < N; ++n) pos[n] = int32_t(n % batch.seq_len);
    for (int r = 0; r <= batch.rows; ++r) cu[r] = r * batch.seq_len;
    docs = batch.rows;
  } else {
    SOLTRAIN_CHECK(int64_t(batch.positions.size()) == N && int64_t(batch.cu_seqlens.size()) <= N + 1,
                   "batch positions / cu_seqlens do not describe ", N, " tokens");
    std::copy(batch.positions.begin(), batch.positions.end(), pos);
    std::copy(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), cu);
    docs = int64_t(batch.cu_seqlens.size()) - 1;
  }
  SOLTRAIN_CHECK(docs >= 1 && cu[0] == 0 && cu[docs] == N, "batch cu_seqlens do not describe ", N, " tokens");
  int max_len = 0;
  for (int64_t d = 0; d < docs; ++d) {
    SOLTRAIN_CHECK(cu[d + 1] > cu[d], "empty or decreasing document in cu_seqlens");
    max_len = std::max(max_len, cu[d + 1] - cu[d]);
  }
  if (const int window = config().sliding_window; window > 0 && max_len > window) refuse_past_window(batch, window);
  auto host = [&](int32_t* p, int64_t n) { return Tensor{p, DType::I32, {n}, Device::CPU}; };
  ops_.upload_async(a.ids, host(ids, N));
  ops_.upload_async(a.targets, host(targets, N));
  ops_.upload_async(a.positions, host(pos, N));
  a.seq = SeqLayout{a.cu_seqlens.rows(0, docs + 1), a.positions, max_len};
  ops_.upload_async(a.seq.cu_seqlens, host(cu, docs + 1));
  a.staged_mark[slot] = ops_.mark();

  a.out =
      ForwardOutputs{a.token_nll, a.doc_nll.rows(0, docs), a.targets, a.token_entropy, a.seq, batch.counted(), &batch};
  if (config_.sequence_classifier()) {  // the head's outputs are scores (one label), in token_nll's buffer
    a.out.scores = a.token_nll;
    a.out.token_nll = a.out.doc_nll = Tensor{};
  }
}

// Mistral's sliding window is not in the attention kernels: a document whose scored tokens reach past it (its
// last target more than `window` tokens in) would be computed with full attention, unlike transformers. Refused
// in one line; padding after a row's last target does not count (nothing it sees reaches the loss).
void Transformer::refuse_past_window(const HostBatch& batch, int window) const {
  const int64_t N = int64_t(batch.rows) * batch.seq_len;
  std::vector<int32_t> cu = batch.cu_seqlens;
  if (cu.empty())
    for (int r = 0; r <= batch.rows; ++r) cu.push_back(r * batch.seq_len);
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    int64_t reach = 0;
    for (int64_t p = cu[d]; p < cu[d + 1] && p < N; ++p)
      if (batch.targets[size_t(p)] != -100) reach = p - cu[d] + 1;
    if (reach > window)
      user_error("a document reaches ", reach, " tokens, past the model's sliding_window of ", window,
                 ": sliding-window attention is not built yet; lower sequence_len to ", window,
                 " or drop the longer documents");
  }
}

const ForwardOutputs& Transformer::outputs() const {
  SOLTRAIN_CHECK(acts_, "outputs() before plan()");
  return acts_->out;
}

void Transformer::forward(const HostBatch& batch, Objective* objective, bool backward_follows, float* logits_out) {
  SOLTRAIN_CHECK(acts_ && acts_->rows == batch.rows && acts_->seq_len == batch.seq_len,
                 "forward() on a batch shape that plan() did not size");
  SOLTRAIN_CHECK(!backward_follows || objective, "a forward for backward needs an objective");
  SOLTRAIN_CHECK(!backward_follows || adapters_on_, "a forward with the adapters off cannot be trained");
  SOLTRAIN_CHECK(!objective || objective->reads_scores() == config_.sequence_classifier(),
                 config_.sequence_classifier() ? "a sequence classifier's forward under a language-model objective"
                                               : "a reward objective on a model without a score head");
  Activations& a = *acts_;
  const auto& c = config_;
  const int64_t L = c.num_layers;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.eps = float(c.rms_norm_eps);
  upload(batch);
  dropout_now_ = backward_follows && dropout_enabled_ && lora_ && lora_->dropout > 0;
  a.head_fused = backward_follows && objective->weights_before_forward();
  a.backward_pending = backward_follows;
  if (a.head_fused) objective->token_weights(ops_, a.out, a.token_weight);

  if (a.ring.on) {
    // A pass that ended early (a forward whose backward never ran) may leave side copies Main never waited
    // for: order everything after them once, rather than trusting marks that old.
    for (uint64_t& m : a.ring.side_mark)
      if (m) {
        ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
        std::fill(a.ring.side_mark.begin(), a.ring.side_mark.end(), uint64_t(0));
        break;
      }
    a.ring.downloads = backward_follows;  // a forward alone (evaluation, DPO's reference) needs no host copy
    a.ring.fetched_down_to = a.ring.host_layers;
  }
  weights_needed_forward(head_group());
  before_checkpoint_write(0);
  ops_.embedding_forward(a.resid[0], a.ids, params_.at(kEmbed).value);
  checkpoint_written(0);
  // Each residual add is fused with the RMSNorm after it (the next layer's ln1, or the final norm), so
  // only the first layer normalises its own input here.
  weights_needed_forward(0);  // each later layer's fires inside the layer before (forward_mlp)
  if (c.moe_layers() > 0) {
    ops_.zero(a.moe_stats.counts);
    ops_.zero(a.moe_stats.prob_sum);
  }
  for (int64_t l = 0; l < L; ++l) {
    forward_attention(l, l == 0);
    forward_mlp(l);
  }
  // transformers' load-balancing loss over every MoE layer's routing of this micro-batch: its value joins the
  // update's loss, and its gradient backward's router (training passes only, as the loss it reports).
  // (Expert parallelism runs passes without targets too, to serve its experts: like the one process that skips
  // them, they add no load-balancing loss.)
  a.aux_on = backward_follows && c.moe_layers() > 0 && c.moe.aux_loss_coef > 0 && !(ep_ && batch.counted() == 0);
  if (a.aux_on)
    ops_.moe_aux_loss(a.moe_grads.aux_grad, aux_loss_t_, a.moe_stats.counts, a.moe_stats.prob_sum, c.moe.aux_loss_coef,
                      double(c.moe_layers()) * double(a.resid[0].dim(0)));
  head_pass(a.head_fused ? &a.token_weight : nullptr, logits_out, objective && objective->wants_entropy());
  if (objective && objective->needs_document_sums()) ops_.segment_sum(a.out.doc_nll, a.token_nll, a.seq.cu_seqlens);
  if (objective) objective->add_loss(ops_, a.out);
}

void Transformer::head_pass(const Tensor* weights, float* logits_out, bool entropy) {
  Activations& a = *acts_;
  if (config_.sequence_classifier()) {  // its score head over every token at once (the plan's one chunk)
    const int64_t N = a.hf.dim(0), K = config_.num_labels;
    SOLTRAIN_CHECK(a.head_chunk == N && K == 1 && !entropy, "a score head's pass as planned");
    Parameter& score = params_.at(kScore);
    ops_.linear_forward(a.token_nll.view({N, K}), a.hf, score.value, nullptr);
    if (logits_out) ops_.copy(Tensor{logits_out, DType::F32, {N, K}, Device::CPU}, a.token_nll.view({N, K}));
    if (!weights) return;
    Tensor dy = a.dlogits.view({N, K});  // d loss / d score in the GEMM's dtype
    if (dy.dtype == DType::F32)
      ops_.copy(dy, weights->view({N, K}));
    else
      ops_.convert(dy, weights->view({N, K}));
    ops_.linear_backward(&a.dhf, false, score.trainable ? &score.grad : nullptr, nullptr, dy, a.hf, score.value);
    return;
  }
  // (a token classifier's head is this one with num_labels outputs and a bias: the label at each token is its target)
  const int64_t N = a.hf.dim(0), V = config_.head_outputs();
  Parameter& head = params_.at(lm_head_name());
  Parameter* bias = config_.token_classifier ? &params_.at(kScoreBias) : nullptr;
  // With a temperature the loss reads logits / T: d loss / d logits is then (softmax − onehot) · weight / T.
  if (weights && inv_temperature_ != 1.0f) ops_.scale(*weights, inv_temperature_);
  // QAT: the head's input and weight fake-quantised once for every chunk (nvfp4's per-tensor scale is the whole
  // input's, as torchao's lm_head sees it), and its weight gradient gathered over the chunks before Int4Weight's
  // extremes' terms (a sum over each group of the whole gradient).
  const bool qat = qat_ && qat_->active();
  const Tensor head_in = qat ? qat_->input(a.hf) : a.hf;
  const Tensor head_w = qat ? qat_->weight(head.value) : head.value;
  Tensor* head_grad = weights && head.trainable ? &head.grad : nullptr;
  Tensor head_target = head_grad && qat ? qat_->weight_grad_target(*head_grad) : Tensor{};
  if (qat && head_grad) head_grad = &head_target;
  for (int64_t t0 = 0; t0 < N; t0 += a.head_chunk) {
    const int64_t t1 = std::min(N, t0 + a.head_chunk);
    Tensor logits = a.logits.rows(0, t1 - t0);
    const Tensor hf = head_in.rows(t0, t1);
    ops_.linear_forward(logits, hf, head_w, bias ? &bias->value : nullptr);
    if (inv_temperature_ != 1.0f) ops_.scale(logits, inv_temperature_);
    if (logits_out) ops_.copy(Tensor{logits_out + t0 * V, DType::F32, {t1 - t0, V}, Device::CPU}, logits);
    Tensor dlogits = a.dlogits.rows(0, t1 - t0);
    ops_.cross_entropy(logits, dlogits, a.token_nll.rows(t0, t1), a.targets.rows(t0, t1),
                       weights ? weights->rows(t0, t1) : Tensor{}, entropy ? a.token_entropy.rows(t0, t1) : Tensor{});
    if (weights) {
      Tensor dhf = a.dhf.rows(t0, t1);
      ops_.linear_backward(&dhf, false, head_grad, bias && bias->trainable ? &bias->grad : nullptr, dlogits, hf,
                           head_w);
    }
  }
  if (qat && weights) {
    qat_->input_backward(a.dhf, a.hf);
    if (head.trainable) qat_->weight_backward(head.grad, head.value);
  }
}

void Transformer::backward(Objective& objective) {
  SOLTRAIN_CHECK(acts_ && acts_->backward_pending, "backward() without a forward(..., backward_follows) before it");
  Activations& a = *acts_;
  a.backward_pending = false;
  const int64_t L = config_.num_layers;
  weights_needed_backward(head_group());
  if (!a.head_fused) {  // the weights depend on forward's results: the head's chunks run again
    objective.token_weights(ops_, a.out, a.token_weight);
    head_pass(&a.token_weight, nullptr, /*entropy=*/false);
  }
  Parameter& final_norm = params_.at(kFinalNorm);
  checkpoint_ready(L);
  ops_.rmsnorm_backward(a.dres, false, grad_or_empty(&final_norm), a.dhf, a.resid[L], final_norm.value, a.rstdf,
                        dres_rounded());
  for (int64_t l = L - 1; l >= 0; --l) {
    weights_needed_backward(int(l));
    prefetch_checkpoints(l);
    checkpoint_ready(l);
    backward_layer(l);
    if (hooks_) hooks_->grads_ready(int(l));
  }
  // The embedding's backward only produces its gradient: a frozen one needs none.
  Parameter& embed = params_.at(kEmbed);
  if (embed.trainable) ops_.embedding_backward(embed.grad, a.ids, a.dres, config_.padding_idx);
  if (hooks_) hooks_->grads_ready(head_group());
  if (dropout_now_) ++dropout_step_;  // after backward, which regenerates this pass's masks
}

void Transformer::weights_needed_forward(int group) {
  if (weight_stream_) weight_stream_->before_forward(group);
  if (hooks_) hooks_->before_forward(group);
}

void Transformer::weights_needed_backward(int group) {
  if (weight_stream_) weight_stream_->before_backward(group);
  if (hooks_) hooks_->before_backward(group);
}

void Transformer::backward_layer(int64_t l) {
  Activations& a = *acts_;
  Ops& o = ops_;
  const auto& c = config_;
  const DecoderLayer& w = layers_[size_t(l)];
  const int64_t N = a.resid[0].dim(0), H = c.num_heads, hd = c.head_dim;
  const LoraPass lp = lora_pass();
  // Recompute what was not kept (same ops, same inputs, same dropout seeds: bitwise the same values).
  if (a.recompute == Recompute::Full)
    forward_attention(l, true);  // (its fused add + norm refills h2 too)
  else if (a.recompute != Recompute::None && c.qk_norm)
    refill_qk(l);  // q and k are one buffer each for all layers (the plan)
  if (a.recompute == Recompute::Selective) o.rmsnorm_forward(a.h2[l], a.rstd2[l], a.mid[l], w.ln2->value, a.eps);
  // MLP: resid[l+1] = mid + down(swiglu(gate(h2), up(h2)))
  backward_mlp(l);
  o.rmsnorm_backward(a.dres, true, grad_or_empty(w.ln2), a.dh, a.mid[l], w.ln2->value, a.rstd2[l], dres_rounded());
  // attention: mid = resid[l] + o_proj(attn(rope(norm(q)), rope(norm(k)), v))
  const QkvTensors t = qkv(l);
  w.attn.o.backward(o, &a.dattn, false, a.dres_act, a.attn[l], lora_u(LoraTarget::o, l), lp.at(l, LoraTarget::o),
                    lp.scratch);
  o.attention_backward(a.dq, a.dk, a.dv, a.dattn.view({N, H, hd}), a.q[l], a.k[l], a.v[l], a.attn[l].view({N, H, hd}),
                       a.lse[l], a.seq, a.scale);
  w.attn.backward_qkv(o, a.dh, false, QkvGrads{a.dq, a.dk, a.dv, a.dq_raw, a.dk_raw}, a.h1[l], t, a.seq, inv_freq_t_,
                      lp, l);
  // (layer 0's rounded copy has no reader: the embedding's backward takes the residual gradient itself)
  o.rmsnorm_backward(a.dres, true, grad_or_empty(w.ln1), a.dh, a.resid[l], w.ln1->value, a.rstd1[l],
                     l > 0 ? dres_rounded() : Tensor{});
}

void Transformer::backward_mlp(int64_t l) {
  Activations& a = *acts_;
  const DecoderLayer& w = layers_[size_t(l)];
  if (w.moe) {  // untiled; the routing is kept, the per-pair tensors recomputed from it as the MLP's would be
    const MoeTensors t = moe_tensors(l);
    const LoraPass lp = lora_pass();
    if (a.recompute >= Recompute::Selective) w.moe->forward(ops_, nullptr, a.h2[l], t, nullptr, /*route=*/false, lp, l);
    if (a.recompute == Recompute::Elementwise) {
      ops_.swiglu_forward(t.act, t.gate, t.up);
      if (w.moe->shared_gate) ops_.swiglu_forward(t.shared.act, t.shared.gate, t.shared.up);
    }
    MoeGrads g = a.moe_grads;
    if (!a.aux_on) g.aux_grad = Tensor{};
    w.moe->backward(ops_, a.dh, a.dres_act, a.h2[l], t, g, lp, l);
    return;
  }
  const LoraPass lp = lora_pass();
  const int64_t N = a.h2[l].dim(0);
  // Weight gradients accumulate across tiles (the ops add into them): no full-size buffer, but each
  // tile's partial sum is rounded before the next is added, where one pass summed all tokens at once.
  for (int64_t t0 = 0; t0 < N; t0 += a.tile) {
    const int64_t t1 = std::min(N, t0 + a.tile), n = t1 - t0;
    const MlpTensors t = mlp_tile(l, t0, t1);
    const Tensor h = a.h2[l].rows(t0, t1);
    // (an adapted down runs again to refill its u: its output goes to tmp, which holds nothing by now)
    if (a.recompute >= Recompute::Selective) w.mlp.forward(ops_, nullptr, h, t, lp, l, a.tmp.rows(t0, t1), t0);
    if (a.recompute == Recompute::Elementwise) ops_.swiglu_forward(t.act, t.gate, t.up);  // one act for all layers
    w.mlp.backward(ops_, a.dh.rows(t0, t1), a.dres_act.rows(t0, t1), h, t,
                   MlpGrads{a.dact.rows(0, n), a.dgate.rows(0, n), a.dup.rows(0, n)}, lp, l, t0);
  }
}

void Transformer::refill_qk(int64_t l) {
  Activations& a = *acts_;
  const Attention& w = layers_[size_t(l)].attn;
  // The same op forward_qkv ran on the same q_raw / k_raw: bitwise the values attention read in forward.
  ops_.qk_norm_rope_forward(a.q[l], a.q_rstd[l], a.q_raw[l], w.q_norm->value, a.seq, inv_freq_t_, a.eps);
  ops_.qk_norm_rope_forward(a.k[l], a.k_rstd[l], a.k_raw[l], w.k_norm->value, a.seq, inv_freq_t_, a.eps);
}

Tensor Transformer::dres_rounded() const {
  return acts_->dres_act.data != acts_->dres.data ? acts_->dres_act : Tensor{};
}

void Transformer::forward_attention(int64_t l, bool norm_input) {
  Activations& a = *acts_;
  Ops& o = ops_;
  const auto& c = config_;
  const DecoderLayer& w = layers_[size_t(l)];
  const int64_t N = a.resid[0].dim(0), H = c.num_heads, hd = c.head_dim;
  const LoraPass lp = lora_pass();
  if (norm_input) o.rmsnorm_forward(a.h1[l], a.rstd1[l], a.resid[l], w.ln1->value, a.eps);
  w.attn.forward_qkv(o, a.h1[l], qkv(l), a.seq, inv_freq_t_, a.eps, lp, l);
  o.attention_forward(a.attn[l].view({N, H, hd}), a.lse[l], a.q[l], a.k[l], a.v[l], a.seq, a.scale);
  w.attn.o.forward(o, a.tmp, a.attn[l], lora_u(LoraTarget::o, l), lp.at(l, LoraTarget::o), lp.scratch);
  // mid = resid + o_proj(...), fused with the MLP's input norm (bitwise the norm selective recompute redoes)
  o.add_rmsnorm_forward(a.mid[l], a.h2[l], a.rstd2[l], a.resid[l], a.tmp, w.ln2->value, a.eps);
}

void Transformer::forward_mlp(int64_t l) {
  Activations& a = *acts_;
  Ops& o = ops_;
  const DecoderLayer& w = layers_[size_t(l)];
  const LoraPass lp = lora_pass();
  const int64_t N = a.h2[l].dim(0);
  if (w.moe)
    w.moe->forward(o, &a.tmp, a.h2[l], moe_tensors(l), &a.moe_stats, /*route=*/true, lp, l);
  else
    for (int64_t t0 = 0; t0 < N; t0 += a.tile) {
      const int64_t t1 = std::min(N, t0 + a.tile);
      Tensor out = a.tmp.rows(t0, t1);
      w.mlp.forward(o, &out, a.h2[l].rows(t0, t1), mlp_tile(l, t0, t1), lp, l, out, t0);
    }
  // resid[l+1] = mid + down(...), fused with the norm that reads it: the next layer's ln1, or the final norm
  const int64_t L = int64_t(layers_.size());
  if (l + 1 < L) {
    // The next layer's ln1 is the first of its weights read, here inside this layer's forward.
    weights_needed_forward(int(l + 1));
    before_checkpoint_write(l + 1);
    o.add_rmsnorm_forward(a.resid[l + 1], a.h1[l + 1], a.rstd1[l + 1], a.mid[l], a.tmp,
                          layers_[size_t(l + 1)].ln1->value, a.eps);
  } else {
    before_checkpoint_write(L);
    o.add_rmsnorm_forward(a.resid[L], a.hf, a.rstdf, a.mid[l], a.tmp, params_.at(kFinalNorm).value, a.eps);
  }
  checkpoint_written(l + 1);
}

// The offloaded checkpoints' ring (`offload_activations`). resid[j], layer j's input (j = L: the final
// residual), is device slot j % R of R = kCheckpointSlots buffers; layers j < H = L + 1 - R also have a pinned
// host buffer host[j]. Who touches what:
//  - Main writes slot j % R (forward: the embedding, or layer j-1's fused add + norm) and reads it (layer j's
//    forward; backward: layer j's recompute and its ln1 backward; j = L: the final norm's backward).
//  - Side downloads slot -> host[j] in forward and uploads host[j] -> slot in backward. Every access to the
//    host buffers is a Side copy, so Side's own order keeps them apart (backward's upload of host[j] follows
//    forward's download of it; the next forward's download follows that upload); the host never touches them.
// Guards, per slot, between the streams:
//  (1) download after write: Side waits on a mark Main takes right after the producing kernel; Main goes on.
//  (2) write after download: before Main overwrites slot s (with resid[j + R]) it waits on side_mark[s], the
//      mark after resid[j]'s download, queued a layer's compute earlier (R = 2), so Main rarely stalls.
//  (3) upload after Main's last read: the upload of host[j] into slot s overwrites resid[j + R], last read by
//      layer j + R's backward (or the final norm's, j + R = L); it is queued before layer j + R - 1's backward
//      (R - 1 layers ahead), when that read is already queued on Main: Side waits on a mark taken then.
//  (4) read after upload: Main waits on side_mark[s] before layer j's backward reads resid[j].
// When backward starts the ring holds the last R checkpoints written (layers H..L), still on the device: they
// are never downloaded nor uploaded. So every download is waited on by (2) within the forward, every upload by
// (4) within the backward, and a forward + backward leaves no side copy unwaited (no stale marks: CudaOps
// recycles its events after 256 marks). A forward without backward (evaluation) downloads nothing.
// On the CPU the copies run as they are called and marks are 0: the same code, in program order.
// Token tiles change nothing here: the MLP's tiles read h2 and write tmp, and resid[l + 1] is written once, by
// the fused add after the last tile. With data parallel the hooks queue their collectives on Side too (the
// reduce-scatters, ZeRO-3's gathers): Side's order then puts a copy behind the collectives queued before it,
// which delays it but changes no guard above (each still waits on marks of work queued earlier, so no cycle).
void Transformer::before_checkpoint_write(int64_t j) {
  Activations::Ring& r = acts_->ring;
  if (!r.on) return;
  const size_t s = size_t(j % r.slots);
  if (r.side_mark[s]) ops_.wait_mark(r.side_mark[s]);  // (2) (or (4)'s upload, already waited on)
  r.side_mark[s] = 0;
  r.holds[s] = j;
}

void Transformer::checkpoint_written(int64_t j) {
  Activations::Ring& r = acts_->ring;
  if (!r.on || !r.downloads || j >= r.host_layers) return;
  const size_t s = size_t(j % r.slots);
  const uint64_t written = ops_.mark();  // (1)
  ops_.use_stream(Ops::Stream::Side);
  ops_.wait_mark(written);
  ops_.download_async(r.host[size_t(j)], acts_->resid[size_t(j)]);
  r.side_mark[s] = ops_.mark();
  ops_.use_stream(Ops::Stream::Main);
}

void Transformer::prefetch_checkpoints(int64_t l) {
  Activations::Ring& r = acts_->ring;
  if (!r.on) return;
  const int64_t lowest = std::max<int64_t>(0, l - (r.slots - 1));
  if (r.fetched_down_to <= lowest) return;
  const uint64_t main_done = ops_.mark();  // (3): every read of the slots' old checkpoints is queued by now
  ops_.use_stream(Ops::Stream::Side);
  ops_.wait_mark(main_done);
  for (int64_t j = r.fetched_down_to - 1; j >= lowest; --j) {
    const size_t s = size_t(j % r.slots);
    SOLTRAIN_CHECK(r.holds[s] > l, "checkpoint slot ", s, " holds layer ", r.holds[s], ", still needed at ", l);
    SOLTRAIN_CHECK(r.side_mark[s] == 0, "checkpoint slot ", s, " has an unwaited copy");
    ops_.upload_async(acts_->resid[size_t(j)], r.host[size_t(j)]);
    r.side_mark[s] = ops_.mark();
    r.holds[s] = j;
  }
  r.fetched_down_to = lowest;
  ops_.use_stream(Ops::Stream::Main);
}

void Transformer::checkpoint_ready(int64_t j) {
  Activations::Ring& r = acts_->ring;
  if (!r.on) return;
  const size_t s = size_t(j % r.slots);
  SOLTRAIN_CHECK(r.holds[s] == j, "checkpoint slot ", s, " holds layer ", r.holds[s], ", not ", j);
  if (r.side_mark[s]) ops_.wait_mark(r.side_mark[s]);  // (4)
  r.side_mark[s] = 0;
}

void Transformer::reset_aux_loss() {
  if (aux_loss_t_.data) ops_.zero(aux_loss_t_);
}

double Transformer::read_aux_loss() const {
  double v = 0;
  if (aux_loss_t_.data) ops_.copy(Tensor{&v, DType::F64, {1}, Device::CPU}, aux_loss_t_);
  return v;
}

std::vector<std::pair<std::string, double>> Transformer::moe_load() const {
  if (!acts_ || acts_->moe_offsets.empty()) return {};
  double worst = 0, sum = 0;
  std::vector<int32_t> off;
  for (const Tensor& t : acts_->moe_offsets) {
    off.resize(size_t(t.numel()));
    ops_.copy(Tensor{off.data(), DType::I32, t.shape, Device::CPU}, t);
    const int64_t E = t.numel() - 1, pairs = off.back();
    int64_t busiest = 0;
    for (int64_t e = 0; e < E; ++e) busiest = std::max<int64_t>(busiest, off[size_t(e) + 1] - off[size_t(e)]);
    const double imbalance = pairs > 0 ? double(busiest) * double(E) / double(pairs) : 1.0;
    worst = std::max(worst, imbalance);
    sum += imbalance;
  }
  std::vector<std::pair<std::string, double>> v = {
      {"moe_load_imbalance", worst}, {"moe_load_imbalance_mean", sum / double(acts_->moe_offsets.size())}};
  if (ep_)
    if (const ExpertParallel::Load l = ep_->load(); l.worst > 0) {
      v.push_back({"ep_load_imbalance", l.worst});
      v.push_back({"ep_load_imbalance_mean", l.mean});
      if (ep_->balance().on) {  // what the native placement would have run: LLEP's effect
        v.push_back({"ep_load_imbalance_native", l.native_worst});
        v.push_back({"ep_load_imbalance_native_mean", l.native_mean});
      }
    }
  return v;
}

StepResult Transformer::step(const HostBatch& batch, bool backward_too, float* logits_out) {
  if (!own_sft_) own_sft_ = std::make_unique<SftObjective>(ops_);
  own_sft_->begin_update(batch.counted());
  reset_aux_loss();
  forward(batch, own_sft_.get(), backward_too, logits_out);
  if (backward_too) backward(*own_sft_);
  return {own_sft_->read_loss(ops_) + read_aux_loss(), batch.counted()};
}

void validate_batch(const HostBatch& b, int vocab_size, const std::string& source, int target_classes) {
  const int classes = target_classes > 0 ? target_classes : vocab_size;
  const size_t n = size_t(b.rows) * size_t(b.seq_len);
  if (b.input_ids.size() != n || b.targets.size() != n)
    user_error(source, ": input_ids and targets must both have ", b.rows, "x", b.seq_len, " tokens");
  for (size_t i = 0; i < n; ++i) {
    if (b.input_ids[i] < 0 || b.input_ids[i] >= vocab_size)
      user_error(source, ": input_ids[", i / b.seq_len, ", ", i % b.seq_len, "] = ", b.input_ids[i],
                 " is outside the vocabulary [0, ", vocab_size, ")");
    if (b.targets[i] != -100 && (b.targets[i] < 0 || b.targets[i] >= classes))
      user_error(source, ": targets[", i / b.seq_len, ", ", i % b.seq_len, "] = ", b.targets[i],
                 " is neither -100 nor ", target_classes > 0 ? "a label in [0, " : "inside the vocabulary [0, ",
                 classes, ")");
  }
}

}  // namespace soltrain
