#include "model/reference_weights.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace soltrain {

namespace {
constexpr size_t kAlign = 256;  // each copy starts where a GEMM may read it with vector loads
size_t aligned(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

ReferenceWeights::ReferenceWeights(Ops& ops, const ParameterStore& source) {
  size_t total = 0;
  for (const Parameter& p : source.all()) {
    SOLTRAIN_CHECK(p.format == WeightFormat::Dense && p.value.defined() && p.value.device == ops.device(),
                   "a reference copy takes dense weights on the device (", p.name, ")");
    total += aligned(p.value.bytes());
  }
  buffer_ = ops.alloc(std::max<size_t>(total, 1));
  char* at = static_cast<char*>(buffer_.data());
  for (const Parameter& p : source.all()) {
    values_.push_back(Tensor{at, p.value.dtype, p.value.shape, p.value.device});
    ops.copy(values_.back(), p.value);
    at += aligned(p.value.bytes());
  }
}

ReferenceWeights::Lend::Lend(ReferenceWeights& ref, ParameterStore& params) : params_(params) {
  std::vector<Parameter>& all = params.all();
  SOLTRAIN_CHECK(all.size() == ref.values_.size(), "reference weights for ", ref.values_.size(),
                 " parameters, lent to ", all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    SOLTRAIN_CHECK(all[i].value.dtype == ref.values_[i].dtype && all[i].value.shape == ref.values_[i].shape,
                   "reference weights: ", all[i].name, " differs in shape or dtype");
    own_.push_back(all[i].value.data);
    all[i].value.data = ref.values_[i].data;
  }
}

ReferenceWeights::Lend::~Lend() {
  std::vector<Parameter>& all = params_.all();
  for (size_t i = 0; i < own_.size(); ++i) all[i].value.data = own_[i];
}

}  // namespace soltrain
