// Linear: one projection of the model: its weight (in the weight's own storage format), optional bias and
// optional LoRA adapter, with forward and backward. Training and the KV-cache decoder both run it.
// With an adapter: y = x·Wᵀ (+b) + scale·(dropout(x)·Aᵀ)·Bᵀ; the base is frozen and backward computes the
// adapter's gradients (and the base's only when it trains).
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "model/fp8_recipe.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "model/qat.h"

namespace soltrain {

// LoRA dropout of one projection in one step: p == 0 is off. The mask is regenerated from the seed in
// backward, so nothing is saved for it.
struct LoraDropout {
  float p = 0;
  uint64_t seed = 0;
  bool off = false;  // the adapter is skipped: the base alone (DPO's reference forward; no backward follows)
};

// Scratch the adapters share (sized for the widest projection): dropout(x) and its gradient when dropout
// is on, and g = d loss / d(x·Aᵀ).
struct LoraScratch {
  Tensor x, dx, g;
};

// LoRA's state for one pass: whether dropout is on, and the step's masks (distinct per layer and
// projection, regenerated in backward from the same seed).
struct LoraPass {
  float dropout = 0;          // 0: off (no adapter, evaluation, or no dropout configured)
  bool adapters_off = false;  // every adapter skipped: the frozen base model (a reference forward)
  uint64_t seed = 0, step = 0;
  LoraScratch scratch;
  // The mask of (layer, projection); for a tile of tokens starting at row `first_row` of an input `width`
  // wide, the part of the whole input's mask those rows draw (a tiled pass drops what an untiled one does).
  LoraDropout at(int64_t layer, LoraTarget t, int64_t first_row = 0, int64_t width = 0) const;
};

class Linear {
 public:
  Linear() = default;
  Linear(Parameter* w, Parameter* b, Parameter* lora_a, Parameter* lora_b, float lora_scale)
      : w_(w), b_(b), lora_a_(lora_a), lora_b_(lora_b), lora_scale_(lora_scale) {}

  // The weight as the matmuls read it: dense in the compute dtype, or a QLoRA base's quantised codes with
  // their scales (the backend dequantises them per call).
  Weight weight() const {
    if (w_->format == WeightFormat::Dense) return Weight(w_->value);
    return Weight(w_->value, w_->format, w_->scale, w_->shape);
  }
  bool adapted() const { return lora_a_ != nullptr; }
  // The fp8-hybrid recipe's state for this projection's base GEMMs (null: bf16). Passes whose token count
  // FP8 GEMMs cannot take (Fp8Projection::usable) run in bf16.
  void set_fp8(Fp8Projection* f) { fp8_ = f; }
  // Quantisation-aware training (model/qat.h): the weight and input fake-quantised while `q` is active.
  void set_qat(const QatState* q) { qat_ = q; }
  const Parameter& weight_parameter() const { return *w_; }
  const Parameter* bias_parameter() const { return b_; }
  const Parameter* lora_a() const { return lora_a_; }
  const Parameter* lora_b() const { return lora_b_; }
  float lora_scale() const { return lora_scale_; }
  bool on_fp8() const { return fp8_ != nullptr; }
  int64_t lora_rank() const { return lora_a_ ? lora_a_->shape[0] : 0; }

  // y = x·Wᵀ (+ b) (+ the adapter's term). u [N, r] receives scale·dropout(x)·Aᵀ, what B's gradient needs.
  void forward(Ops& o, Tensor y, const Tensor& x, Tensor u, const LoraDropout& d, const LoraScratch& s) const;
  // dx (= or +=) d loss / dx; gradients of the trainable tensors among W, b, A, B added into their grads.
  void backward(Ops& o, Tensor* dx, bool accumulate_dx, const Tensor& dy, const Tensor& x, const Tensor& u,
                const LoraDropout& d, const LoraScratch& s) const;

 private:
  Parameter *w_ = nullptr, *b_ = nullptr, *lora_a_ = nullptr, *lora_b_ = nullptr;
  float lora_scale_ = 0;
  Fp8Projection* fp8_ = nullptr;
  const QatState* qat_ = nullptr;
};

}  // namespace soltrain
