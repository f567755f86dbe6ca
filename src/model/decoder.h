// Incremental decoding with a KV cache: the training model's own layers (model/layer.h: the same
// projections with LoRA, Qwen3 q/k norm and RoPE, MLP block), fed a few tokens at a time, with keys and
// values of earlier tokens kept per layer and cached attention in place of flash attention. The LM head
// runs on each sequence's last token only. Each sequence has its own length: prompts of different lengths are
// fed row by row (feed_row), a prompt shared by several rows is fed once and its cache shared (copy_row), and
// decoding then feeds one token to every row at its own position.
//
// The cache is paged (kernels/ops.h): blocks of kBlock positions from one pool, a block table per row. copy_row
// shares the full blocks of a prompt (only its last, partly filled block is copied), so a group of G rows holds its
// prompt's keys and values once; a row takes a block from the pool when its length crosses into a new one.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "model/decode_fusion.h"
#include "model/transformer.h"

namespace soltrain {

class KvDecoder {
 public:
  static constexpr int kBlock = 16;  // positions per cache block
  // Reads the weights of `model` (which must outlive the decoder) by their HF names. The cache holds
  // `batch` sequences of up to `max_len` tokens, in a pool of `cache_tokens` positions (0: batch × max_len, room
  // for every row without sharing; cache_tokens_for_groups: for groups sharing their prompt); activations are
  // sized for `max_chunk` new tokens per sequence per forward (longer inputs are split), so all memory is
  // allocated here. With `repetition_penalty` each row also flags the tokens it holds (a byte per vocabulary
  // entry), for sampling with a repetition_penalty. `ops`: the backend it queues its work on (the model's when
  // null; make_ops_beside's to decode in a thread of its own while the model trains, which must then leave the
  // weights unchanged until the decoding is done).
  KvDecoder(Transformer& model, int batch, int max_len, int max_chunk = 256, bool repetition_penalty = false,
            int64_t cache_tokens = 0, Ops* ops = nullptr);
  ~KvDecoder();
  // The device bytes a decoder of these sizes allocates (its KV cache, activations, logits), without building it.
  static size_t memory_bytes(Transformer& model, int batch, int max_len, int max_chunk = 256,
                             bool repetition_penalty = false, int64_t cache_tokens = 0);
  // Of those, the KV cache's: keys and values of `tokens` positions in every layer.
  static size_t kv_cache_bytes(Transformer& model, int64_t tokens);
  // The pool that `prompts` groups of `group` rows need when each group's prompt (up to max_prompt tokens) is fed
  // once and shared (copy_row) and each row then takes up to max_new tokens.
  static int64_t cache_tokens_for_groups(int prompts, int group, int max_prompt, int max_new);

  int batch() const { return batch_; }
  int max_len() const { return max_len_; }
  int vocab_size() const { return model_.config().vocab_size; }
  int length(int row = 0) const { return lengths_[size_t(row)]; }  // tokens in a sequence's cache
  void reset();                                                    // forget every sequence (the cache is overwritten)

  // Appends `tokens` ([batch, T] row-major, the same T for every sequence) and runs them through the model.
  // Each sequence's last new token's logits stay on the device for sample(); `last_logits` (host, [batch, vocab]
  // fp32), when given, receives them; `all_logits` (host, [batch, T, vocab]) every new position's. A UserError
  // when the cache would overflow max_len.
  void feed(std::span<const int32_t> tokens, int T, float* last_logits = nullptr, float* all_logits = nullptr);
  // Appends `tokens` to sequence `row` alone (its last logits kept as feed() keeps them; `last_logits`, when
  // given, [vocab] on the host).
  void feed_row(int row, std::span<const int32_t> tokens, float* last_logits = nullptr);
  // Sequence `to` becomes a copy of sequence `from` (its cache, length and last logits): a prompt fed once for a
  // group. The full blocks of `from` are shared, its last, partly filled one copied; `to`'s own are given back.
  void copy_row(int from, int to);
  // One token per sequence from its last logits, drawn on the device (Ops::sample_tokens; row b with seed + b,
  // `step` numbering the draws); only the ids come back, into `ids` (host, [batch]), and when `logprobs` is given
  // (host, [batch]) each drawn token's log-probability under the distribution it was drawn from.
  void sample(const SamplingParams& p, uint64_t step, int32_t* ids, float* logprobs = nullptr);
  // The same for rows [r0, r0 + n) alone (row b still with seed + b), into ids (host, [n]): the first token of
  // rows restarted while the others decode (continuous batching); the next feed_drawn() feeds it.
  void sample_rows(int r0, int n, const SamplingParams& p, uint64_t step, int32_t* ids, float* logprobs = nullptr);
  // Sequence `row` forgets its tokens (its blocks back to the pool, its flags cleared): feed_row starts it afresh.
  void restart_row(int row);
  // feed() of the tokens sample() last drew, one per sequence, without them leaving the device: the decode step.
  // Its inputs advance on the device (Ops::advance_decode), so from the second call after a reset() the step is
  // recorded once and replayed (Ops::record: one CUDA graph launch instead of a few hundred kernel launches);
  // the arithmetic is the same either way. SOLTRAIN_DECODE_GRAPH=0 keeps it op by op.
  void feed_drawn();
  // Every sequence's last logits (host, [batch, vocab] fp32), as sample() reads them.
  void read_logits(float* out);
  // Whether feed_drawn() replays a recording, and if not, why not (empty before its second call).
  bool recorded() const { return recorded_ != nullptr; }
  // How many q/k/v and gate/up projections run as one GEMM each (model/decode_fusion.h).
  int fused_projections() const;
  const std::string& why_not_recorded() const { return why_not_recorded_; }

 private:
  struct PlanOnly {};
  KvDecoder(PlanOnly, Transformer& model, int batch, int max_len, int max_chunk, bool repetition_penalty,
            int64_t cache_tokens, Ops* ops);
  // Rows [r0, r0 + nb) each take Tc new tokens (ids and positions already on the device, in that order; lens_
  // holds their lengths after them); writes x (the final residual).
  void forward_chunk(int r0, int nb, int Tc);
  // Tokens [B, T] for rows [r0, r0 + B) through the model in chunks; logits as feed() says.
  void feed_rows(int r0, int B, std::span<const int32_t> tokens, int T, float* last_logits, float* all_logits);
  // A UserError when T more tokens would not fit rows [r0, r0 + B); else their blocks taken from the pool.
  void make_room(int r0, int B, int T);
  // Row r's blocks back to the pool (a shared block when its last holder lets go).
  void release(int row);
  int take_block();
  void upload_table();  // the host's block table to the device, when it changed
  // The final norm and the LM head over `lx` ([B, hidden], each row's last position) into rows [r0, r0 + B) of
  // the logits.
  void head_last(int r0, int B, const Tensor& lx);
  // feed_drawn()'s device work: inputs advanced, the layers, the head.
  void decode_step();
  // Each layer's q/k/v and gate/up as one GEMM where their weights sit side by side (model/decode_fusion.h): found
  // again at each reset() (cheap: pointer checks), the adapters' stacked copies taken again.
  void fuse_layers();

  Transformer& model_;
  Ops& ops_;
  int batch_, max_len_, max_chunk_;
  std::vector<int> lengths_;  // per sequence
  Parameter *embed_, *final_norm_, *head_;
  Arena arena_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer: the pool [blocks, kBlock, Hkv, hd]
  int blocks_per_row_ = 0;
  std::vector<int32_t> table_host_;  // [batch, blocks_per_row_], -1 where a row has no block yet
  std::vector<int> refs_;            // rows holding each pool block
  std::vector<int32_t> free_;        // pool blocks nobody holds
  bool table_current_ = false;       // table_ (device) equals table_host_
  // activations for batch × max_chunk tokens; q_raw_, k_raw_ and v_ are parts of qkv_ (which a fused q/k/v
  // projection fills whole), gate_ and up_ of gate_up_
  Tensor x_, h_, rstd_, qkv_, q_raw_, k_raw_, q_, k_, v_, attn_, tmp_, gate_up_, gate_, up_, act_, lora_u_;
  struct FusedLayer {
    FusedProjection qkv, gate_up;
    std::array<Tensor, 3> qkv_copies, gate_up_copies;  // the copies' buffers planned for them (FusedProjection)
  };
  std::vector<FusedLayer> fused_;
  Tensor last_x_, last_h_, last_rstd_, logits_;  // [batch, ...]
  // MoE layers' routing and per-pair tensors for one call (flat, viewed per call), and its statistics' scratch
  Tensor moe_logits_, moe_probs_, moe_expert_, moe_weight_, moe_rows_, moe_slot_, moe_offsets_, moe_xs_, moe_gate_,
      moe_up_, moe_act_, moe_ys_, moe_counts_, moe_prob_sum_, moe_shared_gate_, moe_shared_up_, moe_shared_act_,
      moe_shared_out_, moe_shared_logit_, moe_u_gate_up_, moe_u_down_, moe_dequant_;
  Tensor ids_, positions_, lens_, table_;
  std::vector<std::pair<Tensor*, size_t>> bind_;  // the planned buffers, until the arena is allocated
  // I32 [batch] drawn ids; F32 [batch] their log-probs; U8 [batch, vocab] tokens held (with repetition_penalty only)
  Tensor sampled_, sampled_logp_, seen_;
  // lens_ holds every row's length (feed_rows uses it as per-chunk scratch): what feed_drawn() advances.
  bool lens_current_ = false;
  int decode_steps_ = 0;  // feed_drawn() calls since the last reset(): the first runs op by op, sizing scratch
  std::unique_ptr<Ops::Recorded> recorded_;
  std::string why_not_recorded_;
};

}  // namespace soltrain
