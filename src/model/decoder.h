// Incremental decoding with a KV cache: the training model's own layers (model/layer.h: the same
// projections with LoRA, Qwen3 q/k norm and RoPE, MLP block), fed a few tokens at a time, with keys and
// values of earlier tokens kept per layer and cached attention in place of flash attention. The LM head
// runs on each sequence's last token only.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "model/transformer.h"

namespace soltrain {

class KvDecoder {
 public:
  // Reads the weights of `model` (which must outlive the decoder) by their HF names. The cache holds
  // `batch` sequences of up to `max_len` tokens; activations are sized for `max_chunk` new tokens per
  // sequence per forward (longer inputs are split), so all memory is allocated here.
  KvDecoder(Transformer& model, int batch, int max_len, int max_chunk = 256);
  ~KvDecoder();

  int batch() const { return batch_; }
  int max_len() const { return max_len_; }
  int vocab_size() const { return model_.config().vocab_size; }
  int length() const { return length_; }  // tokens in every sequence's cache
  void reset() { length_ = 0; }           // forget every sequence (the cache is overwritten)

  // Appends `tokens` ([batch, T] row-major, the same T for every sequence) and runs them through the model.
  // `last_logits` (host, [batch, vocab] fp32) receives the logits of each sequence's last new token; with
  // `all_logits` (host, [batch, T, vocab]) every new position's logits too. A UserError when the cache
  // would overflow max_len.
  void feed(std::span<const int32_t> tokens, int T, float* last_logits, float* all_logits = nullptr);

 private:
  void forward_chunk(int Tc);  // ids of the chunk are already on the device; writes x (the final residual)

  Transformer& model_;
  Ops& ops_;
  int batch_, max_len_, max_chunk_, length_ = 0;
  Parameter *embed_, *final_norm_, *head_;
  Arena arena_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [batch, max_len, Hkv, hd]
  // activations for batch × max_chunk tokens
  Tensor x_, h_, rstd_, q_raw_, k_raw_, q_, k_, v_, attn_, tmp_, gate_, up_, act_, lora_u_;
  Tensor last_x_, last_h_, last_rstd_, logits_;  // [batch, ...]
  Tensor ids_, positions_, lens_;
};

}  // namespace soltrain
