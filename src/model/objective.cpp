#include "model/objective.h"

#include <limits>

namespace soltrain {

SftObjective::SftObjective(Ops& ops) : sum_(ops.alloc(sizeof(double))) {}

void SftObjective::begin_update(int64_t counted_tokens) {
  counted_ = counted_tokens;
  first_ = true;
}

void SftObjective::token_weights(Ops& ops, const ForwardOutputs&, Tensor weight) {
  // Rows whose target is -100 get no gradient whatever their weight (cross_entropy skips them).
  ops.fill(weight, counted_ ? 1.0f / float(counted_) : 0.0f);
}

void SftObjective::add_loss(Ops& ops, const ForwardOutputs& out) {
  ops.reduce_sum(loss_sum(), out.token_nll, /*squares=*/false, /*accumulate=*/!first_);
  first_ = false;
}

double SftObjective::read_loss(Ops& ops) const {
  if (counted_ == 0 || first_) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  ops.copy(Tensor{&s, DType::F64, {1}, Device::CPU}, loss_sum());
  return s / double(counted_);
}

}  // namespace soltrain
