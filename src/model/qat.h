// Quantisation-aware training (Axolotl's `qat:` block, torchao's QATConfig prepare step): every projection of the
// model (the decoder layers' q, k, v, o, gate, up, down and the LM head, every nn.Linear torchao's quantize_
// swaps) computes with its weight and its input fake-quantised (kernels/fake_quant.h), and the gradients pass
// through them as torchao's do. The masters stay fp32 and are what the run saves: the plain model, as Axolotl's
// convert step leaves it (quantising it for deployment is the user's next step, with the same scheme).
//
// Schemes (Axolotl's weight_dtype / activation_dtype / group_size as its _make_qat_config maps them):
//   int4 weights (any group size dividing every projection's input width) with int8 activations (per token): torchao's
//   int4 without activations is another scheme (weights through fp8 rows first), not built;
//   mxfp4 weights and activations (block 32); nvfp4 weights and activations (block 16, per-tensor scales).
// `fake_quant_after_n_steps` N: the first N optimizer steps compute without fake quantisation.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/buffer.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace soltrain {

struct QatSettings {
  FakeQuant weight, activation;
  int64_t fake_quant_after_n_steps = 0;  // 0: from the first step
  std::string describe() const;          // "int4 weights (group 32), int8 activations (per token)"
};

// The `qat` block's settings (names as Axolotl and torchao spell them: int4, int8, mxfp4, nvfp4, and
// float4_e2m1fn_x2 for mxfp4). `where` prefixes the one-line errors.
QatSettings parse_qat(const std::string& weight_dtype, const std::string& activation_dtype, int64_t group_size,
                      bool group_given, int64_t fake_quant_after_n_steps, const std::string& where);

// Why QAT with `s` cannot train a model of config `c`, from the config alone ("" when it can): Mixture-of-Experts
// layers, classifier heads, a group size that does not divide every projection's input width. One line.
std::string qat_refusal(const QatSettings& s, const ModelConfig& c);

// The run's fake quantisation: the settings and the scratch the projections share (one input and one weight
// copy at a time: the projections run one after another).
class QatState {
 public:
  QatState(Ops& ops, const QatSettings& s) : ops_(ops), settings_(s) {}
  const QatSettings& settings() const { return settings_; }
  // Sizes the scratch for inputs of up to `tokens` × `widest_in` values and weights of up to `weight_numel`.
  void plan(int64_t tokens, int64_t widest_in, int64_t weight_numel, DType act, DType weight);
  size_t device_bytes() const;
  // Whether this step computes fake-quantised (fake_quant_after_n_steps passed).
  bool active() const { return active_; }
  void set_step(int64_t completed_steps) { active_ = completed_steps >= settings_.fake_quant_after_n_steps; }

  // x [N, in] as the projection reads it (fake-quantised into the input scratch, or x itself without activation
  // quantisation), and w [out, in] fake-quantised into the weight scratch.
  Tensor input(const Tensor& x) const;
  Tensor weight(const Tensor& w) const;
  // After the backward GEMM wrote dx given the fake-quantised input: the input quantiser's mask (Int8Token).
  void input_backward(Tensor dx, const Tensor& x) const;
  // The weight's gradient: where the weight quantiser is not straight through (Int4Weight), `dw` is the scratch
  // the GEMM should write (zeroed here), and weight_backward adds its gradient into `grad`; else `grad` itself.
  Tensor weight_grad_target(Tensor grad) const;
  void weight_backward(Tensor grad, const Tensor& w) const;

 private:
  Ops& ops_;
  QatSettings settings_;
  bool active_ = true;
  Buffer x_, w_, dw_, amax_;
  int64_t tokens_ = 0, widest_in_ = 0, weight_numel_ = 0;
  DType act_ = DType::F32, wdt_ = DType::F32;
};

}  // namespace soltrain
