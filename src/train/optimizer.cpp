#include "train/optimizer.h"

#include <cmath>

namespace soltrain {

double clip_grad_norm(Ops& ops, ParameterStore& params, float max_norm) {
  const double norm = std::sqrt(ops.sum_squares(params.all_grads()));
  if (max_norm > 0) {
    const double coef = double(max_norm) / (norm + 1e-6);
    if (coef < 1.0) ops.scale(params.all_grads(), float(coef));
  }
  return norm;
}

AdamW::AdamW(ParameterStore& params, Ops& ops) : params_(params), ops_(ops) {
  m_ = ops.alloc(size_t(params.numel()) * 4);
  v_ = ops.alloc(size_t(params.numel()) * 4);
}

void AdamW::step(const OptimizerConfig& cfg, float lr) {
  ++step_;
  float* m = static_cast<float*>(m_.data());
  float* v = static_cast<float*>(v_.data());
  const int64_t n_decay = params_.masters(true).numel();
  for (bool decayed : {true, false}) {
    Tensor master = params_.masters(decayed);
    if (master.numel() == 0) continue;
    const int64_t off = decayed ? 0 : n_decay;
    Tensor mt{m + off, DType::F32, master.shape, ops_.device()}, vt{v + off, DType::F32, master.shape, ops_.device()};
    const AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, decayed ? cfg.weight_decay : 0.0f, step_};
    Tensor copy = params_.values(decayed);
    ops_.adamw(master, params_.grads(decayed), mt, vt, p, params_.values_alias_masters() ? nullptr : &copy);
  }
}

}  // namespace soltrain
