#include "model/qat.h"

#include "core/error.h"
#include "core/format.h"

namespace soltrain {

namespace {
std::string name_of(const FakeQuant& q) {
  switch (q.kind) {
    case FakeQuantKind::Int4Weight: return cat("int4 (group ", q.group, ")");
    case FakeQuantKind::Int8Token: return "int8 (per token)";
    case FakeQuantKind::Mxfp4: return "mxfp4 (block 32)";
    case FakeQuantKind::Nvfp4: return "nvfp4 (block 16, per-tensor scale)";
    case FakeQuantKind::Off: break;
  }
  return "none";
}
Tensor at(const Buffer& b, DType t, Shape s) {
  return Tensor{b.data(), t, std::move(s), b.device()};
}
}  // namespace

std::string QatSettings::describe() const {
  return cat(name_of(weight), " weights, ", activation.on() ? name_of(activation) : "unquantised", " activations");
}

QatSettings parse_qat(const std::string& weight_dtype, const std::string& activation_dtype, int64_t group_size,
                      bool group_given, int64_t fake_quant_after_n_steps, const std::string& where) {
  const std::string w = weight_dtype == "float4_e2m1fn_x2" ? "mxfp4" : weight_dtype;
  const std::string a = activation_dtype == "float4_e2m1fn_x2" ? "mxfp4" : activation_dtype;
  QatSettings s;
  if (fake_quant_after_n_steps < 0) user_error(where, "fake_quant_after_n_steps must be 0 or more");
  s.fake_quant_after_n_steps = fake_quant_after_n_steps;
  if (w == "int4") {
    if (group_size <= 0) user_error(where, "group_size must be positive, got ", group_size);
    s.weight = {FakeQuantKind::Int4Weight, int(group_size)};
    if (a != "int8")
      user_error(where, "int4 weights train with activation_dtype int8 here; ",
                 a.empty() || a == "none" ? "without it torchao's int4 QAT casts each weight row to fp8 first (its "
                                            "fp8-activation scheme), which is not built"
                                          : "int4 with " + a + " activations is not built");
    s.activation = {FakeQuantKind::Int8Token, 0};
    return s;
  }
  if (w == "mxfp4" || w == "nvfp4") {
    const int block = w == "mxfp4" ? 32 : 16;
    if (group_given && group_size != block)
      user_error(where, w, " quantises blocks of ", block, " (group_size ", block, "), got group_size ", group_size);
    if (!a.empty() && a != w)
      user_error(where, w, " weights train with ", w, " activations (torchao's ", w,
                 " QAT fake-quantises both), got activation_dtype ", a);
    const FakeQuant q{w == "mxfp4" ? FakeQuantKind::Mxfp4 : FakeQuantKind::Nvfp4, block};
    s.weight = s.activation = q;
    return s;
  }
  if (w.empty()) user_error(where, "weight_dtype is required (int4, mxfp4 or nvfp4)");
  user_error(where, "weight_dtype ", w,
             " is not built: soltrain's QAT fake-quantises int4 (with int8 activations), mxfp4 or nvfp4");
}

std::string qat_refusal(const QatSettings& s, const ModelConfig& c) {
  const std::string lead = "qat: quantisation-aware training ";
  if (c.moe_layers() > 0) return lead + "of Mixture-of-Experts layers is not built";
  if (c.sequence_classifier() || c.token_classifier)
    return lead + "of a reward or process reward model's score head is not built";
  for (const int64_t in : {int64_t(c.hidden_size), int64_t(c.intermediate_size), int64_t(c.q_dim())})
    if (s.weight.on() && in % s.weight.group != 0)
      return cat("qat: group_size ", s.weight.group, " does not divide the model's projection input width ", in, " (",
                 c.architecture, ": hidden ", c.hidden_size, ", intermediate ", c.intermediate_size, ", attention ",
                 c.q_dim(), ")");
  return "";
}

void QatState::plan(int64_t tokens, int64_t widest_in, int64_t weight_numel, DType act, DType weight) {
  act_ = act;
  wdt_ = weight;
  if (tokens * widest_in > tokens_ * widest_in_ && settings_.activation.on())
    x_ = ops_.alloc(size_t(tokens * widest_in) * dtype_size(act));
  if (weight_numel > weight_numel_) {
    w_ = ops_.alloc(size_t(weight_numel) * dtype_size(weight));
    if (settings_.weight.kind == FakeQuantKind::Int4Weight) dw_ = ops_.alloc(size_t(weight_numel) * sizeof(float));
  }
  if (!amax_.data()) amax_ = ops_.alloc(256);
  tokens_ = std::max(tokens_, tokens);
  widest_in_ = std::max(widest_in_, widest_in);
  weight_numel_ = std::max(weight_numel_, weight_numel);
}

size_t QatState::device_bytes() const {
  return x_.bytes() + w_.bytes() + dw_.bytes() + amax_.bytes();
}

Tensor QatState::input(const Tensor& x) const {
  if (!settings_.activation.on()) return x;
  SOLTRAIN_CHECK(x.numel() <= tokens_ * widest_in_ && x.dtype == act_, "QAT: an input larger than planned");
  Tensor out = at(x_, x.dtype, x.shape);
  ops_.fake_quantize(out, x, settings_.activation, at(amax_, DType::F32, {1}));
  return out;
}

Tensor QatState::weight(const Tensor& w) const {
  SOLTRAIN_CHECK(w.numel() <= weight_numel_ && w.dtype == wdt_, "QAT: a weight larger than planned");
  Tensor out = at(w_, w.dtype, w.shape);
  ops_.fake_quantize(out, w, settings_.weight, at(amax_, DType::F32, {1}));
  return out;
}

void QatState::input_backward(Tensor dx, const Tensor& x) const {
  if (settings_.activation.kind == FakeQuantKind::Int8Token)
    ops_.fake_quantize_backward(dx, false, dx, x, settings_.activation);
}

Tensor QatState::weight_grad_target(Tensor grad) const {
  if (settings_.weight.kind != FakeQuantKind::Int4Weight) return grad;
  Tensor dw = at(dw_, DType::F32, grad.shape);
  ops_.zero(dw);
  return dw;
}

void QatState::weight_backward(Tensor grad, const Tensor& w) const {
  if (settings_.weight.kind != FakeQuantKind::Int4Weight) return;
  ops_.fake_quantize_backward(grad, true, at(dw_, DType::F32, grad.shape), w, settings_.weight);
}

}  // namespace soltrain
