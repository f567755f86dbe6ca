#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "model/lora.h"

namespace soltrain {

namespace {
// A view of the first numel(s) elements of a flat buffer.
Tensor view(const Tensor& flat, Shape s) {
  SOLTRAIN_CHECK(shape_numel(s) <= flat.numel(), "decoder view ", shape_str(s), " of ", shape_str(flat.shape));
  return Tensor{flat.data, flat.dtype, std::move(s), flat.device};
}
Tensor host_i32(std::vector<int32_t>& v) {
  return Tensor{v.data(), DType::I32, {int64_t(v.size())}, Device::CPU};
}
}  // namespace

KvDecoder::KvDecoder(Transformer& model, int batch, int max_len, int max_chunk, bool repetition_penalty,
                     int64_t cache_tokens, Ops* ops)
    : KvDecoder(PlanOnly{}, model, batch, max_len, max_chunk, repetition_penalty, cache_tokens, ops) {
  arena_.bind(ops_.alloc(arena_.total_bytes()));
  for (auto& [t, hnd] : bind_) *t = arena_.get(hnd);
  bind_.clear();
  const int64_t V = model.config().vocab_size;
  logits_ = logits_.view({batch, V});
  if (seen_.defined()) seen_ = seen_.view({batch, V});
  table_ = table_.view({batch, blocks_per_row_});
  const ModelConfig& c = model.config();
  const int64_t N = int64_t(batch) * max_chunk, qn = N * c.num_heads * c.head_dim, kn = N * c.num_kv_heads * c.head_dim;
  q_raw_ = qkv_.rows(0, qn);
  k_raw_ = qkv_.rows(qn, qn + kn);
  v_ = qkv_.rows(qn + kn, qn + 2 * kn);
  const int64_t NF = c.dense_mlp_layers() > 0 ? N * c.intermediate_size : 0;
  gate_ = gate_up_.rows(0, NF);
  up_ = gate_up_.rows(NF, 2 * NF);
  reset();
}

size_t KvDecoder::memory_bytes(Transformer& model, int batch, int max_len, int max_chunk, bool repetition_penalty,
                               int64_t cache_tokens) {
  return KvDecoder(PlanOnly{}, model, batch, max_len, max_chunk, repetition_penalty, cache_tokens, nullptr)
      .arena_.total_bytes();
}

size_t KvDecoder::kv_cache_bytes(Transformer& model, int64_t tokens) {
  const ModelConfig& c = model.config();
  const int64_t blocks = (tokens + kBlock - 1) / kBlock;
  return size_t(2) * size_t(c.num_layers) * size_t(blocks * kBlock) * size_t(c.num_kv_heads) * size_t(c.head_dim) *
         dtype_size(model.ops().activation_dtype());
}

int64_t KvDecoder::cache_tokens_for_groups(int prompts, int group, int max_prompt, int max_new) {
  const auto blocks = [](int64_t n) { return (n + kBlock - 1) / kBlock; };
  // A group whose prompt has p tokens holds blocks(p + new) for the row it was fed to, and each other row the same
  // less the prompt's full blocks, which it shares; the most over every prompt length up to max_prompt.
  int64_t most = 0;
  for (int p = std::max(1, max_prompt - 2 * kBlock); p <= max_prompt; ++p)  // (the maximum is in the last blocks)
    most = std::max(most, group * blocks(p + max_new) - int64_t(group - 1) * (p / kBlock));
  return int64_t(prompts) * most * kBlock;
}

KvDecoder::KvDecoder(PlanOnly, Transformer& model, int batch, int max_len, int max_chunk, bool repetition_penalty,
                     int64_t cache_tokens, Ops* ops)
    : model_(model),
      ops_(ops ? *ops : model.ops()),
      batch_(batch),
      max_len_(max_len),
      max_chunk_(max_chunk),
      lengths_(size_t(std::max(batch, 0)), 0) {
  SOLTRAIN_CHECK(batch > 0 && max_len > 0 && max_chunk > 0, "decoder sizes");
  const ModelConfig& c = model.config();
  if (c.num_labels > 0)
    user_error(c.architecture, " is a classifier (a reward model): it scores text, it does not generate");
  ParameterStore& ps = model.params();
  embed_ = &ps.at("model.embed_tokens.weight");
  final_norm_ = &ps.at("model.norm.weight");
  head_ = &ps.at(model.lm_head_name());
  const int64_t lora_r = model.lora() ? model.lora()->r : 0;

  const int64_t N = int64_t(batch) * max_chunk, D = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim, V = c.vocab_size;
  const DType act = ops_.activation_dtype(), f32 = DType::F32, i32 = DType::I32;
  std::vector<std::pair<Tensor*, size_t>>& bind = bind_;
  auto one = [&](Tensor& t, int64_t n, DType dt) { bind.push_back({&t, arena_.plan({n}, dt)}); };
  blocks_per_row_ = (max_len + kBlock - 1) / kBlock;
  const int64_t pool = cache_tokens > 0 ? (cache_tokens + kBlock - 1) / kBlock : int64_t(batch) * blocks_per_row_;
  SOLTRAIN_CHECK(pool <= std::numeric_limits<int32_t>::max(), "decoder pool of ", pool, " blocks");
  refs_.assign(size_t(pool), 0);
  k_cache_.resize(size_t(c.num_layers));
  v_cache_.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l)
    for (Tensor* t : {&k_cache_[size_t(l)], &v_cache_[size_t(l)]})
      bind.push_back({t, arena_.plan({pool, kBlock, Hkv, hd}, act)});
  for (Tensor* t : {&x_, &h_, &tmp_}) one(*t, N * D, act);
  for (Tensor* t : {&q_, &attn_}) one(*t, N * H * hd, act);
  one(k_, N * Hkv * hd, act);
  one(qkv_, N * (H + 2 * Hkv) * hd, act);
  one(gate_up_, c.dense_mlp_layers() > 0 ? N * 2 * F : 1, act);
  one(act_, c.dense_mlp_layers() > 0 ? N * F : 1, act);
  // The fused projections' adapter copies, where the weights sit side by side now (fuse_layers() checks again).
  fused_.resize(size_t(c.num_layers));
  const bool may = !model.weight_stream() && !ps.sharded();
  for (int l = 0; l < c.num_layers; ++l) {
    FusedLayer& f = fused_[size_t(l)];
    const DecoderLayer& w = model.layers()[size_t(l)];
    if (may && hd % 4 == 0 && hd <= 256) f.qkv = fuse_projections({&w.attn.q, &w.attn.k, &w.attn.v}, ops_);
    if (may && !w.moe) f.gate_up = fuse_projections({&w.mlp.gate, &w.mlp.up}, ops_);
    const std::array<Shape, 3> qkv = f.qkv.copy_shapes(), gu = f.gate_up.copy_shapes();
    for (size_t i = 0; i < 3; ++i) {
      if (!qkv[i].empty()) bind.push_back({&f.qkv_copies[i], arena_.plan(qkv[i], act)});
      if (!gu[i].empty()) bind.push_back({&f.gate_up_copies[i], arena_.plan(gu[i], act)});
    }
  }
  if (c.moe_layers() > 0) {
    const int64_t E = c.moe.num_experts, M = N * c.moe.top_k, Fm = c.moe.intermediate_size;
    one(moe_logits_, N * E, act);
    one(moe_probs_, N * E, f32);
    for (Tensor* t : {&moe_expert_, &moe_rows_, &moe_slot_}) one(*t, M, i32);
    one(moe_weight_, M, f32);
    one(moe_offsets_, E + 1, i32);
    for (Tensor* t : {&moe_xs_, &moe_ys_}) one(*t, M * D, act);
    for (Tensor* t : {&moe_gate_, &moe_up_, &moe_act_}) one(*t, M * Fm, act);
    for (Tensor* t : {&moe_counts_, &moe_prob_sum_}) one(*t, E, f32);
    if (model.lora() && model.lora()->base_format != WeightFormat::Dense)
      one(moe_dequant_, E * Fm * D, act);  // a QLoRA base's experts of one projection
    if (lora_r) {                          // the experts' adapters (model/moe.h): u over gate_up (rank 2r) and down
      one(moe_u_gate_up_, M * 2 * lora_r, act);
      one(moe_u_down_, M * lora_r, act);
    }
    if (const int64_t Fs = c.moe.shared_intermediate_size) {
      for (Tensor* t : {&moe_shared_gate_, &moe_shared_up_, &moe_shared_act_}) one(*t, N * Fs, act);
      one(moe_shared_out_, N * D, act);
      one(moe_shared_logit_, N, act);
    }
  }
  one(rstd_, N * std::max<int64_t>(H, 1), f32);
  if (lora_r) one(lora_u_, N * lora_r * 3, act);  // (a fused q/k/v projection's u: three adapters side by side)
  for (Tensor* t : {&last_x_, &last_h_}) one(*t, int64_t(batch) * D, act);
  one(last_rstd_, batch, f32);
  one(logits_, int64_t(batch) * V, f32);
  one(ids_, N, i32);
  one(positions_, N, i32);
  one(lens_, batch, i32);
  one(table_, int64_t(batch) * blocks_per_row_, i32);
  one(sampled_, batch, i32);
  one(sampled_logp_, batch, f32);
  if (repetition_penalty) one(seen_, int64_t(batch) * V, DType::U8);
}

void KvDecoder::reset() {
  lengths_.assign(lengths_.size(), 0);
  table_host_.assign(size_t(batch_) * size_t(blocks_per_row_), -1);
  std::fill(refs_.begin(), refs_.end(), 0);
  free_.resize(refs_.size());
  for (size_t i = 0; i < free_.size(); ++i) free_[i] = int32_t(free_.size() - 1 - i);  // block 0 first
  table_current_ = false;
  if (seen_.defined()) ops_.zero(seen_);
  lens_current_ = false;
  decode_steps_ = 0;
  recorded_.reset();
  why_not_recorded_.clear();  // (recorded again by the next generation: the weights it read may have moved since)
  fuse_layers();
}

int KvDecoder::fused_projections() const {
  int n = 0;
  for (const FusedLayer& f : fused_) n += int(f.qkv.fused()) + int(f.gate_up.fused());
  return n;
}

void KvDecoder::fuse_layers() {
  for (FusedLayer& f : fused_) {
    auto again = [&](FusedProjection& p, const std::array<Tensor, 3>& planned) {
      if (!p.fused()) return;  // (not fused when planned: no buffers for its copies)
      p = fuse_projections(p.parts, ops_);
      const std::array<Shape, 3> shapes = p.copy_shapes();
      for (size_t i = 0; i < 3; ++i)
        if (shapes[i] != (planned[i].defined() ? planned[i].shape : Shape{})) {
          p.weight = Tensor{};  // (changed since planning: one GEMM a projection)
          return;
        }
      p.copies = planned;
      p.refresh(ops_);
    };
    again(f.qkv, f.qkv_copies);
    again(f.gate_up, f.gate_up_copies);
  }
}

void KvDecoder::feed_drawn() {
  make_room(0, batch_, 1);
  upload_table();
  if (!lens_current_) {
    ops_.copy(view(lens_, {batch_}), host_i32(lengths_));
    lens_current_ = true;
  }
  if (decode_steps_++ == 1) {
    const char* env = std::getenv("SOLTRAIN_DECODE_GRAPH");
    if (env && std::string_view(env) == "0")
      why_not_recorded_ = "SOLTRAIN_DECODE_GRAPH=0";
    else if (model_.weight_stream())
      why_not_recorded_ = "the base's layers stream from host memory";
    else
      recorded_ = ops_.record([this] { decode_step(); }, &why_not_recorded_);
  }
  if (recorded_)
    recorded_->replay();
  else
    decode_step();
  for (int& len : lengths_) ++len;
}

void KvDecoder::read_logits(float* out) {
  ops_.copy(Tensor{out, DType::F32, logits_.shape, Device::CPU}, logits_);
}

void KvDecoder::decode_step() {
  const int64_t B = batch_, D = model_.config().hidden_size;
  // (sample_tokens flagged the drawn tokens as seen already)
  ops_.advance_decode(view(ids_, {B}), view(positions_, {B}), view(lens_, {B}), sampled_);
  forward_chunk(0, batch_, 1);
  head_last(0, batch_, view(x_, {B, D}));
}

void KvDecoder::sample(const SamplingParams& p, uint64_t step, int32_t* ids, float* logprobs) {
  sample_rows(0, batch_, p, step, ids, logprobs);
}

void KvDecoder::sample_rows(int r0, int n, const SamplingParams& p, uint64_t step, int32_t* ids, float* logprobs) {
  SOLTRAIN_CHECK(r0 >= 0 && n > 0 && r0 + n <= batch_, "sample_rows: rows ", r0, "+", n, " of ", batch_);
  if (p.repetition_penalty != 1 && !seen_.defined())
    throw std::logic_error("KvDecoder::sample: a repetition_penalty needs a decoder built to track tokens");
  SamplingParams q = p;
  q.seed = p.seed + uint64_t(r0);  // (Ops::sample_tokens numbers the rows it is given from 0)
  const Tensor drawn = sampled_.rows(r0, r0 + n);
  const Tensor logp = logprobs ? sampled_logp_.rows(r0, r0 + n) : Tensor{};
  ops_.sample_tokens(drawn, logits_.rows(r0, r0 + n), seen_.defined() ? seen_.rows(r0, r0 + n) : Tensor{}, q, step,
                     logp);
  ops_.copy(Tensor{ids, DType::I32, {n}, Device::CPU}, drawn);
  if (logprobs) ops_.copy(Tensor{logprobs, DType::F32, {n}, Device::CPU}, logp);
}

void KvDecoder::restart_row(int row) {
  SOLTRAIN_CHECK(row >= 0 && row < batch_, "restart_row: row ", row, " of ", batch_);
  release(row);
  lengths_[size_t(row)] = 0;
  lens_current_ = false;
  if (seen_.defined()) ops_.zero(seen_.rows(row, row + 1));
}

KvDecoder::~KvDecoder() = default;

void KvDecoder::feed(std::span<const int32_t> tokens, int T, float* last_logits, float* all_logits) {
  feed_rows(0, batch_, tokens, T, last_logits, all_logits);
}

void KvDecoder::feed_row(int row, std::span<const int32_t> tokens, float* last_logits) {
  SOLTRAIN_CHECK(row >= 0 && row < batch_, "feed_row: row ", row, " of ", batch_);
  feed_rows(row, 1, tokens, int(tokens.size()), last_logits, nullptr);
}

void KvDecoder::copy_row(int from, int to) {
  SOLTRAIN_CHECK(from >= 0 && from < batch_ && to >= 0 && to < batch_, "copy_row: rows ", from, ", ", to);
  if (from == to) return;
  release(to);
  const int n = lengths_[size_t(from)], full = n / kBlock, part = n % kBlock;
  const size_t f = size_t(from) * size_t(blocks_per_row_), t = size_t(to) * size_t(blocks_per_row_);
  for (int i = 0; i < full; ++i) {
    table_host_[t + size_t(i)] = table_host_[f + size_t(i)];
    ++refs_[size_t(table_host_[f + size_t(i)])];
  }
  if (part > 0) {  // the partly filled last block: `to` appends to its own copy
    const int64_t src = table_host_[f + size_t(full)], dst = take_block();
    table_host_[t + size_t(full)] = int32_t(dst);
    for (size_t l = 0; l < k_cache_.size(); ++l)
      for (const Tensor* c : {&k_cache_[l], &v_cache_[l]}) {
        const Tensor flat = c->view({c->dim(0) * kBlock, c->dim(2), c->dim(3)});
        ops_.copy(flat.rows(dst * kBlock, dst * kBlock + part), flat.rows(src * kBlock, src * kBlock + part));
      }
  }
  table_current_ = false;
  ops_.copy(logits_.rows(to, to + 1), logits_.rows(from, from + 1));
  if (seen_.defined()) ops_.copy(seen_.rows(to, to + 1), seen_.rows(from, from + 1));
  lengths_[size_t(to)] = n;
  lens_current_ = false;
}

int KvDecoder::take_block() {
  if (free_.empty())
    user_error("generation's KV cache is full: its ", refs_.size(), " blocks of ", kBlock,
               " positions are all held (the pool was sized for fewer or shorter sequences)");
  const int b = free_.back();
  free_.pop_back();
  refs_[size_t(b)] = 1;
  return b;
}

void KvDecoder::release(int row) {
  for (int i = 0; i < blocks_per_row_; ++i) {
    int32_t& b = table_host_[size_t(row) * size_t(blocks_per_row_) + size_t(i)];
    if (b < 0) continue;
    if (--refs_[size_t(b)] == 0) free_.push_back(b);
    b = -1;
    table_current_ = false;
  }
}

void KvDecoder::upload_table() {
  if (table_current_) return;
  ops_.copy(table_, Tensor{table_host_.data(), DType::I32, table_.shape, Device::CPU});
  table_current_ = true;
}

void KvDecoder::make_room(int r0, int B, int T) {
  const int window = model_.config().sliding_window;
  for (int b = r0; b < r0 + B; ++b) {
    if (lengths_[size_t(b)] + T > max_len_)
      user_error("generation needs ", lengths_[size_t(b)] + T, " tokens of context, more than the ", max_len_,
                 " planned");
    if (window > 0 && lengths_[size_t(b)] + T > window)  // (Transformer::refuse_past_window says why)
      user_error("generation needs ", lengths_[size_t(b)] + T,
                 " tokens of context, past the model's sliding_window of ", window,
                 ": sliding-window attention is not built yet");
  }
  for (int b = r0; b < r0 + B; ++b) {  // (a shared block is full: new positions always land in a row's own)
    const int first = (lengths_[size_t(b)] + kBlock - 1) / kBlock, last = (lengths_[size_t(b)] + T - 1) / kBlock;
    for (int i = first; i <= last; ++i) {
      int32_t& e = table_host_[size_t(b) * size_t(blocks_per_row_) + size_t(i)];
      if (e < 0) {
        e = int32_t(take_block());
        table_current_ = false;
      }
    }
  }
}

void KvDecoder::head_last(int r0, int B, const Tensor& lx) {
  const Tensor lh = view(last_h_, {B, model_.config().hidden_size}), lg = logits_.rows(r0, r0 + B);
  ops_.rmsnorm_forward(lh, view(last_rstd_, {B}), lx, final_norm_->value, float(model_.config().rms_norm_eps));
  ops_.linear_forward(lg, lh, head_->value, nullptr);
}

void KvDecoder::feed_rows(int r0, int B, std::span<const int32_t> tokens, int T, float* last_logits,
                          float* all_logits) {
  const int64_t V = model_.config().vocab_size, D = model_.config().hidden_size;
  SOLTRAIN_CHECK(T > 0 && int64_t(tokens.size()) == int64_t(B) * T, "feed: ", tokens.size(), " tokens for ", B, " x ",
                 T);
  make_room(r0, B, T);
  upload_table();
  lens_current_ = false;  // lens_ becomes this call's scratch
  for (int32_t id : tokens)
    if (id < 0 || id >= V) user_error("token id ", id, " is outside the vocabulary of ", V);
  // A single row may take the whole activation budget per chunk: its tokens are the chunk's rows.
  const int chunk = int(std::min<int64_t>(int64_t(max_chunk_) * batch_ / B, std::numeric_limits<int>::max()));
  std::vector<int32_t> ids, pos, lens(static_cast<size_t>(B));
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int Tc = std::min(chunk, T - t0);
    const int64_t N = int64_t(B) * Tc;
    ids.resize(size_t(N));
    pos.resize(size_t(N));
    for (int64_t b = 0; b < B; ++b) {
      const int len = lengths_[size_t(r0 + b)];
      for (int t = 0; t < Tc; ++t) {
        ids[size_t(b * Tc + t)] = tokens[size_t(b * T + t0 + t)];
        pos[size_t(b * Tc + t)] = len + t;
      }
      lens[size_t(b)] = len + Tc;
    }
    ops_.copy(view(ids_, {N}), host_i32(ids));
    ops_.copy(view(positions_, {N}), host_i32(pos));
    ops_.copy(view(lens_, {B}), host_i32(lens));
    if (seen_.defined()) ops_.flag_tokens(seen_.rows(r0, r0 + B), view(ids_, {N}));
    forward_chunk(r0, B, Tc);
    for (int b = r0; b < r0 + B; ++b) lengths_[size_t(b)] += Tc;

    const ModelConfig& c = model_.config();
    const float eps = float(c.rms_norm_eps);
    const Tensor x = view(x_, {N, D});
    if (all_logits) {  // every position: the final norm over the chunk, the head batch rows at a time
      const Tensor h = view(h_, {N, D});
      ops_.rmsnorm_forward(h, view(rstd_, {N}), x, final_norm_->value, eps);
      for (int64_t q0 = 0; q0 < N; q0 += batch_) {
        const int64_t q1 = std::min(N, q0 + batch_);
        const Tensor lg = logits_.rows(0, q1 - q0);
        ops_.linear_forward(lg, h.rows(q0, q1), head_->value, nullptr);
        for (int64_t r = q0; r < q1; ++r) {
          const int64_t b = r / Tc, t = t0 + r % Tc;
          ops_.copy(Tensor{all_logits + (b * T + t) * V, DType::F32, {1, V}, Device::CPU}, lg.rows(r - q0, r - q0 + 1));
        }
      }
    }
    if (t0 + Tc < T) continue;
    // The LM head on each sequence's last token only: one [B, V] GEMM however long the prompt, into the rows'
    // own logits (sample() reads them there). One new token per row: x is those rows already.
    Tensor lx = x;
    if (Tc > 1) {
      lx = view(last_x_, {B, D});
      for (int64_t b = 0; b < B; ++b) ops_.copy(lx.rows(b, b + 1), x.rows(b * Tc + Tc - 1, b * Tc + Tc));
    }
    head_last(r0, B, lx);
    if (last_logits) ops_.copy(Tensor{last_logits, DType::F32, {B, V}, Device::CPU}, logits_.rows(r0, r0 + B));
  }
}

void KvDecoder::forward_chunk(int r0, int nb, int Tc) {
  const ModelConfig& c = model_.config();
  Ops& o = ops_;
  const int64_t B = nb, N = B * Tc, D = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
  const float eps = float(c.rms_norm_eps), scale = 1.0f / std::sqrt(float(hd));
  const Tensor x = view(x_, {N, D}), h = view(h_, {N, D}), tmp = view(tmp_, {N, D});
  const Tensor q = view(q_, {N, H, hd}), k = view(k_, {N, Hkv, hd}), v = view(v_, {N, Hkv, hd});
  // Without q/k norm, RoPE rotates the projections in place (as in training).
  const Tensor q_raw = c.qk_norm ? view(q_raw_, {N, H, hd}) : q, k_raw = c.qk_norm ? view(k_raw_, {N, Hkv, hd}) : k;
  const Tensor attn = view(attn_, {N, H * hd});
  const int64_t r = model_.lora() ? model_.lora()->r : 0;
  const Tensor u = r ? view(lora_u_, {N, r}) : Tensor{};
  // One adapter output at a time: each projection's u is consumed by its own B product at once.
  const QkvTensors qkv{q_raw, k_raw, v, q, k, view(rstd_, {N * H}), view(rstd_, {N * Hkv}), u, u, u};
  const int64_t Fd = c.dense_mlp_layers() > 0 ? F : 0;  // (an all-MoE model plans no dense MLP buffers)
  const MlpTensors mlp{view(gate_, {N, Fd}), view(up_, {N, Fd}), view(act_, {N, Fd}), u, u, u};
  SeqLayout seq{Tensor{}, view(positions_, {N}), 0};  // RoPE reads positions only
  const LoraPass no_dropout;

  o.embedding_forward(x, view(ids_, {N}), embed_->value);
  o.rmsnorm_forward(h, view(rstd_, {N}), x, model_.layers()[0].ln1->value, eps);
  for (int l = 0; l < c.num_layers; ++l) {
    const DecoderLayer& w = model_.layers()[size_t(l)];
    const FusedLayer& f = fused_[size_t(l)];
    // (h is ln1's norm of x: the embedding's, or the previous layer's sum)
    // Keys and values of the new tokens go to the end of each sequence's cache (lens_ already counts them).
    const Tensor& kc = k_cache_[size_t(l)];
    const Tensor& vc = v_cache_[size_t(l)];
    const Tensor table = table_.rows(r0, r0 + B);
    if (f.qkv.fused()) {
      const Tensor y = view(qkv_, {N, f.qkv.out()});
      f.qkv.forward(o, y, h, lora_u_);
      o.decode_qkv(q, kc, vc, y, w.attn.q_norm ? w.attn.q_norm->value : Tensor{},
                   w.attn.k_norm ? w.attn.k_norm->value : Tensor{}, seq.positions, model_.inv_freq(), eps,
                   view(lens_, {B}), table);
    } else {
      w.attn.forward_qkv(o, h, qkv, seq, model_.inv_freq(), eps, no_dropout, l);
      o.kv_append(kc, vc, k, v, view(lens_, {B}), table);
    }
    o.attention_decode(attn.view({N, H, hd}), q, kc, vc, view(lens_, {B}), table, scale);
    w.attn.o.forward(o, tmp, attn, u, {}, no_dropout.scratch);
    o.add_rmsnorm_forward(x, h, view(rstd_, {N}), x, tmp, w.ln2->value, eps);  // x += tmp, then its norm
    Tensor out = tmp;
    if (w.moe) {
      const int64_t E = c.moe.num_experts, K = c.moe.top_k, M = N * K, Fm = c.moe.intermediate_size;
      MoeTensors t{view(moe_logits_, {N, E}),   view(moe_probs_, {N, E}), view(moe_expert_, {N, K}),
                   view(moe_weight_, {N, K}),   view(moe_rows_, {M}),     view(moe_slot_, {M}),
                   view(moe_offsets_, {E + 1}), view(moe_xs_, {M, D}),    view(moe_gate_, {M, Fm}),
                   view(moe_up_, {M, Fm}),      view(moe_act_, {M, Fm}),  view(moe_ys_, {M, D})};
      if (w.moe->router_linear.adapted()) t.u_router = u;
      if (w.moe->shared_gate_linear.adapted()) t.u_shared_gate = u;
      if (const MoeSwiGLU& m = *w.moe; m.gate_up_lora.on() || m.down_lora.on()) {
        if (m.gate_up_lora.on()) t.u_gate_up = view(moe_u_gate_up_, {M, m.gate_up_lora.rank});
        if (m.down_lora.on()) t.u_down = view(moe_u_down_, {M, m.down_lora.rank});
      }
      t.dequant = moe_dequant_;
      if (const int64_t Fs = c.moe.shared_intermediate_size) {
        t.shared = MlpTensors{
            view(moe_shared_gate_, {N, Fs}), view(moe_shared_up_, {N, Fs}), view(moe_shared_act_, {N, Fs}), u, u, u};
        t.shared_out = view(moe_shared_out_, {N, D});
        t.shared_logit = view(moe_shared_logit_, {N, 1});
      }
      const MoeStats stats{view(moe_counts_, {E}), view(moe_prob_sum_, {E})};  // (not read: no loss here)
      // (no path generates on an expert-parallel model: sft and pt do not generate, dpo and grpo refuse ep_size)
      SOLTRAIN_CHECK(!w.moe->ep, "generation on an expert-parallel model");
      w.moe->forward(o, &out, h, t, &stats, /*route=*/true, no_dropout, l);
    } else if (f.gate_up.fused()) {
      const Tensor gu = view(gate_up_, {N, 2 * F});
      f.gate_up.forward(o, gu, h, lora_u_);
      o.swiglu_packed_forward(mlp.act, gu);
      w.mlp.down.forward(o, out, mlp.act, u, {}, no_dropout.scratch);
    } else {
      w.mlp.forward(o, &out, h, mlp, no_dropout, l, tmp);
    }
    if (l + 1 < c.num_layers)  // x += tmp, then the next layer's first norm
      o.add_rmsnorm_forward(x, h, view(rstd_, {N}), x, tmp, model_.layers()[size_t(l) + 1].ln1->value, eps);
    else
      o.add_inplace(x, tmp);
  }
}

}  // namespace soltrain
