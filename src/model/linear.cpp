#include "model/linear.h"

#include "kernels/dropout_mask.h"

namespace soltrain {

namespace {
// The gradient of a parameter, or null when it is frozen (the op then skips that output).
Tensor* grad(Parameter* p) {
  return p && p->trainable ? &p->grad : nullptr;
}
Tensor rows_of(const Tensor& flat, int64_t n, int64_t width) {
  return Tensor{flat.data, flat.dtype, {n, width}, flat.device};
}
}  // namespace

void Linear::forward(Ops& o, Tensor y, const Tensor& x, Tensor u, const LoraDropout& d, const LoraScratch& s) const {
  if (qat_ && qat_->active()) {  // (QAT trains the whole model: no adapters, no fp8 recipe)
    const Tensor xq = qat_->input(x);
    o.linear_forward(y, xq, Weight(qat_->weight(w_->value)), b_ ? &b_->value : nullptr);
    return;
  }
  if (fp8_ && Fp8Projection::usable(x.dim(0)))
    fp8_->forward(o, y, x, weight(), b_ ? &b_->value : nullptr);
  else
    o.linear_forward(y, x, weight(), b_ ? &b_->value : nullptr);
  if (!lora_a_ || d.off) return;
  Tensor xin = x;
  if (d.p > 0) {
    xin = rows_of(s.x, x.dim(0), x.dim(1));
    o.dropout_scale(xin, x, 1.0f, d.p, d.seed);
  }
  // The scale rides on the GEMM's alpha, and B's product accumulates straight into y (beta = 1): no pass
  // over [N, out] beyond the GEMMs.
  o.linear_forward(u, xin, lora_a_->value, nullptr, lora_scale_);
  o.linear_forward(y, u, lora_b_->value, nullptr, 1.0f, /*accumulate=*/true);
}

void Linear::backward(Ops& o, Tensor* dx, bool accumulate_dx, const Tensor& dy, const Tensor& x, const Tensor& u,
                      const LoraDropout& d, const LoraScratch& s) const {
  if (qat_ && qat_->active()) {  // forward's fake-quantised operands again, then their gradients' way back
    const Tensor xq = qat_->input(x);
    const Tensor wq = qat_->weight(w_->value);
    Tensor* gw = grad(w_);
    Tensor target = gw ? qat_->weight_grad_target(*gw) : Tensor{};
    o.linear_backward(dx, accumulate_dx, gw ? &target : nullptr, grad(b_), dy, xq, Weight(wq));
    if (dx) qat_->input_backward(*dx, x);
    if (gw) qat_->weight_backward(*gw, w_->value);
    return;
  }
  // A frozen base linear still passes the gradient on to its input, but computes no dW / db.
  if (fp8_ && Fp8Projection::usable(dy.dim(0))) {
    fp8_->backward(o, dx, accumulate_dx, grad(w_), dy, x, weight());
    if (grad(b_)) o.linear_backward(nullptr, false, nullptr, grad(b_), dy, x, weight());
  } else {
    o.linear_backward(dx, accumulate_dx, grad(w_), grad(b_), dy, x, weight());
  }
  if (!lora_a_) return;
  // g = scale·(dy·B) = d loss / d(x·Aᵀ), the scale on the GEMM's alpha (one rounding); dB += dyᵀ·u.
  Tensor g = s.g.rows(0, dy.dim(0));  // sized for a whole pass; a tile of tokens uses its first rows
  o.linear_backward(&g, false, grad(lora_b_), nullptr, dy, u, lora_b_->value, lora_scale_);
  if (d.p == 0) {
    o.linear_backward(dx, true, grad(lora_a_), nullptr, g, x, lora_a_->value);
    return;
  }
  // With dropout, regenerate forward's dropped input from the same seed, and drop the same gradient entries.
  Tensor xin = rows_of(s.x, x.dim(0), x.dim(1)), dxin = rows_of(s.dx, x.dim(0), x.dim(1));
  o.dropout_scale(xin, x, 1.0f, d.p, d.seed);
  o.linear_backward(&dxin, false, grad(lora_a_), nullptr, g, xin, lora_a_->value);
  o.dropout_scale(dxin, dxin, 1.0f, d.p, d.seed);
  o.add_inplace(*dx, dxin);
}

LoraDropout LoraPass::at(int64_t layer, LoraTarget t, int64_t first_row, int64_t width) const {
  if (adapters_off) return {0, 0, true};
  if (dropout == 0) return {};
  // Distinct streams per (seed, step, layer, projection); the mask hash mixes the bits further.
  const uint64_t s = seed * 0x9E3779B97F4A7C15ull + step * 0xD1B54A32D192ED03ull +
                     uint64_t(layer * kLoraTargets + int(t)) * 0xBF58476D1CE4E5B9ull;
  return {dropout, dropout_seed_at(s, uint64_t(first_row * width))};
}

}  // namespace soltrain
