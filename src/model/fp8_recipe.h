// The fp8-hybrid recipe (`recipe: fp8-hybrid`, TransformerEngine's HYBRID format, Surogate's recipe name):
// the decoder layers' projection GEMMs run in FP8 with per-tensor scales: forward E4M3(x) × E4M3(W),
// backward dgrad E5M2(dy) × E4M3(W) and wgrad E4M3(x) × E5M2(dy), with fp32 accumulation into bf16
// outputs and fp32 weight gradients. Masters stay fp32; attention, norms, embedding, the LM head and LoRA's
// adapters stay bf16.
//
// Scaling: activations and output gradients use delayed scaling (a scale from the max of an amax history
// over past steps, TransformerEngine's DelayedScaling; no pass over the tensor before it is cast), or
// current scaling (`fp8_scaling: current`, each tensor from its own amax: one extra read). The first cast of
// each tensor scales currently, since no history exists yet (a scale of 1 would flush the small output
// gradients to zero). Weights are scaled currently, once per optimizer update (once for a frozen base), and
// kept as FP8 in both layouts Hopper's TN-only FP8 GEMMs need (W for forward, Wᵀ for dgrad). The wgrad
// GEMM needs xᵀ and dyᵀ: dy is cast once into both layouts by one transposing pass; x is cast transposed in
// backward from its saved bf16 copy with forward's scale.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"

namespace soltrain {

struct Fp8Settings {
  bool delayed = true;        // fp8_scaling: delayed | current
  int amax_history = 1024;    // fp8_amax_history (TransformerEngine's and Surogate's default)
  int margin = 0;             // fp8_margin: scale = fp8_max · 2^-margin / amax
  int skip_first_layers = 0;  // skip_quant_first_layers: these decoder layers stay bf16
  int skip_last_layers = 0;   // skip_quant_last_layers
};

class Fp8Recipe;

// One projection's FP8 state (its weight's FP8 copies and its tensors' scales), owned by the recipe.
class Fp8Projection {
 public:
  // Whether this pass's token count suits the FP8 GEMMs (multiples of 16); otherwise the bf16 path runs.
  static bool usable(int64_t tokens) { return tokens % 16 == 0 && tokens > 0; }
  // y = x·Wᵀ (+ bias) with W = `w` (the bf16 compute copy, cast here when it changed; a quantised QLoRA base's
  // weight is dequantised first, once: it is frozen).
  void forward(Ops& o, Tensor y, const Tensor& x, const Weight& w, const Tensor* bias);
  // dx (when given; = or +=) dy·W; dw (when given) += dyᵀ·x.
  void backward(Ops& o, Tensor* dx, bool accumulate_dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Weight& w);

 private:
  friend class Fp8Recipe;
  void refresh_weight(Ops& o, const Weight& w);
  Ops::Fp8Scaling scaling(Ops::Fp8Scaling s, bool seen) const;
  Fp8Projection& input() { return input_owner_ ? *input_owner_ : *this; }  // whose input scale this one uses

  Fp8Recipe* recipe_ = nullptr;
  int64_t out_ = 0, in_ = 0;
  Tensor w8_, w8t_, w_scale_;              // E4M3 [out, in] and [in, out]; its scale record
  Ops::Fp8Scaling x_, dy_;                 // scale record and history slot 0 of the input and of the output gradient
  bool trains_ = false;                    // the weight changes every update (else cast once)
  bool weight_stale_ = true;               // the weight changed since w8_ was cast
  bool x_seen_ = false, dy_seen_ = false;  // an update has recorded their amaxes (else cast currently)
  Fp8Projection* input_owner_ = nullptr;   // same_input_as
};

class Fp8Recipe {
 public:
  Fp8Recipe(Ops& ops, Fp8Settings s);
  const Fp8Settings& settings() const { return settings_; }
  // Registers a projection's weight [out, in]; pointers stay valid. Then allocate() once. With
  // `same_input_as`, the projection reads the same input as that one (k and v as q, up as gate), runs
  // right after it, and reuses its FP8 input and its scale rather than casting the input again.
  // `quantised`: a frozen QLoRA base weight (NF4 / FP8 blocks), dequantised for its one cast.
  Fp8Projection* add(int64_t out, int64_t in, bool trains, Fp8Projection* same_input_as = nullptr,
                     bool quantised = false);
  void allocate();
  // Sizes the shared cast scratch for passes of up to `tokens` tokens.
  void plan(int64_t tokens);
  // What a recipe over projections of these [out, in] shapes allocates for passes of up to `tokens` tokens:
  // allocate() and plan() size their buffers by it, and `bench --plan-only` plans a run with it.
  struct Bytes {
    size_t weights = 0, state = 0, scratch = 0;  // the FP8 W and Wᵀ copies; scales and histories; cast scratch
    size_t total() const { return weights + state + scratch; }
  };
  static Bytes planned(const std::vector<std::pair<int64_t, int64_t>>& shapes, const Fp8Settings& s, int64_t tokens);
  // The amax histories of the inputs and output gradients ([2 · projections, amax_history], F32; empty with
  // current scaling): data parallel makes each rank's the largest over the ranks before after_update(), so
  // every rank scales alike (TransformerEngine's reduce_amax) and a checkpoint's state is every rank's.
  Tensor amax_histories() const;
  // After each optimizer update: delayed scales from the amax histories (which roll), trained weights stale.
  // A tensor is current-scaled until the first update has recorded its amaxes: so every micro-batch of that
  // update scales from itself, on one rank or many alike.
  void after_update();
  size_t device_bytes() const;  // FP8 weight copies, scales, histories and scratch
  // The scaling state (scales, amax histories, which tensors have one) in a checkpoint, so a resumed run
  // scales as the uninterrupted one would. load() refuses a state of another shape (projections, history).
  void save(const std::filesystem::path& file) const;
  void load(const std::filesystem::path& file);

 private:
  friend class Fp8Projection;
  Tensor scratch(int i, int64_t rows, int64_t cols, DType t) const;  // shared buffer i as [rows, cols]
  // A quantised base weight dequantised for its one cast (`quantised` casts in all): the buffer is made for the
  // first and released after the last, so it costs memory only while the base's FP8 copies are made.
  Tensor dequantised(int64_t rows, int64_t cols);
  void dequantised_done();

  Ops& ops_;
  Fp8Settings settings_;
  std::vector<std::unique_ptr<Fp8Projection>> projections_;
  Buffer weights_, state_, scratch_[4];  // scratch: x, xᵀ, dy, dyᵀ codes
  Buffer dequant_;                       // see dequantised()
  int quantised_left_ = 0;               // quantised projections not cast yet
  int64_t widest_quantised_ = 0;         // the largest of them, in elements
  int64_t widest_ = 0, scratch_tokens_ = 0;
  Tensor x_history_, x_scales_, dy_history_, dy_scales_;
  // What the input scratch holds: whose cast of which tensor (a sharing projection skips its own cast then);
  // likewise the transposed input's scratch in backward, where any projection of a shared input may come first
  // (that record lasts until the next forward, since a forward may reuse the tensor's memory for another).
  const void* x_cast_data_ = nullptr;
  const Fp8Projection* x_cast_by_ = nullptr;
  const void* xt_cast_data_ = nullptr;
  const Fp8Projection* xt_cast_by_ = nullptr;
};

}  // namespace soltrain
