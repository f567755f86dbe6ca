// The decoder-only transformer (Llama / Qwen2 / Qwen3), forward and backward, written once against Ops.
// Activations for a (rows × seq_len) batch are planned and allocated once by plan(); a step allocates
// nothing. The LM head and cross-entropy run in token chunks so full logits never exist at once.
// With a LoraConfig the base weights are frozen and every targeted projection gains a trainable adapter:
// y = x·Wᵀ (+b) + scale·(dropout(x)·Aᵀ)·Bᵀ, and backward computes the adapters' gradients only.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace soltrain {

// One batch on the host: rows × seq_len tokens, targets already shifted (-100 = not counted).
struct HostBatch {
  int rows = 0, seq_len = 0;
  std::vector<int32_t> input_ids, targets;
  // From the packing loader (empty = one document per row): positions restart at 0 for every packed
  // document; cu_seqlens are document start offsets into the flattened rows × seq_len tokens, ending
  // with rows × seq_len (a row's padding is a segment of its own), so attention can stay per document.
  std::vector<int32_t> positions, cu_seqlens;
};

struct StepResult {
  double loss;      // mean cross-entropy over counted targets (NaN when none is counted)
  int64_t counted;  // targets != -100
};

// Activation recompute: `none` keeps every layer's activations for backward; `selective` keeps the
// attention side (its recompute would cost a flash-attention forward) and recomputes each layer's MLP
// (norm, gate/up, SwiGLU: 3·F + D values per token, the largest share); `full` keeps only each layer's input
// and recomputes the whole layer before its backward. All three give bitwise-identical results.
enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& s, const std::string& where);  // none | selective | full

class Transformer {
 public:
  // Without `lora` every parameter trains (full fine-tuning); with it only the adapters do (A initialised as
  // PEFT does, B zero).
  Transformer(ModelConfig config, Ops& ops, std::optional<LoraConfig> lora = std::nullopt);
  ~Transformer();

  const ModelConfig& config() const { return config_; }
  const std::optional<LoraConfig>& lora() const { return lora_; }
  // LoRA dropout is applied in steps with backward (training), as PEFT applies it in train() mode only.
  // Each such step draws fresh masks from (seed, step count); set_dropout_step restores the count on resume,
  // and enable_dropout(false) turns it off (gradient dumps against a reference).
  void enable_dropout(bool on) { dropout_enabled_ = on; }
  void set_dropout_step(int64_t s) { dropout_step_ = s; }
  ParameterStore& params() { return params_; }
  const ParameterStore& params() const { return params_; }
  Ops& ops() { return ops_; }

  // Sizes and allocates every activation for batches of `rows` × `seq_len` tokens.
  void plan(int rows, int seq_len, Recompute recompute = Recompute::None);
  size_t activation_bytes() const;

  // Forward, then (if `backward`) backward: gradients are added into params().grad. When `logits_out`
  // is given (host, [rows*seq_len, vocab]) the logits are copied there as they are computed.
  StepResult step(const HostBatch& batch, bool backward, float* logits_out = nullptr);

  // The name of the tensor that holds the LM head (the embedding when tied).
  const std::string& lm_head_name() const;

 private:
  struct Layer;
  struct Activations;
  struct Proj;
  // One projection of layer l, with its adapter if it has one (forward, then backward into dx).
  void proj_forward(int64_t l, LoraTarget t, Tensor y, const Tensor& x);
  void proj_backward(int64_t l, LoraTarget t, Tensor* dx, bool accumulate_dx, const Tensor& dy, const Tensor& x);
  uint64_t dropout_seed(int64_t l, LoraTarget t) const;
  // Layer l's forward in two halves: attention (resid[l] → mid[l], and h2 = ln2(mid) fused with that add)
  // and MLP (mid[l] → resid[l+1], and the next norm fused with that add; the residual write is skipped
  // when recomputing for backward). norm_input: normalise the half's input here (h1 from resid, h2 from
  // mid), when no fused add before it has.
  void forward_attention(int64_t l, bool norm_input);
  void forward_mlp(int64_t l, bool write_residual, bool norm_input);

  ModelConfig config_;
  std::optional<LoraConfig> lora_;
  bool dropout_enabled_ = true, dropout_now_ = false;
  int64_t dropout_step_ = 0;
  Ops& ops_;
  ParameterStore params_;
  std::vector<Layer> layers_;
  std::unique_ptr<Activations> acts_;
  Buffer inv_freq_;
};

// Checks every id and target against the vocabulary; errors name `source`.
void validate_batch(const HostBatch& b, int vocab_size, const std::string& source);

}  // namespace soltrain
