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

size_t ReferenceWeights::bytes_for(const ParameterStore& source) {
  size_t total = 0;
  for (const Parameter& p : source.all()) total += aligned(p.value.bytes());
  return std::max<size_t>(total, 1);
}

std::string ReferenceWeights::mismatch(const ParameterStore& source, const ParameterStore& params) {
  if (source.all().size() != params.all().size())
    return cat(source.all().size(), " parameters against the model's ", params.all().size());
  for (size_t i = 0; i < params.all().size(); ++i) {
    const Parameter &s = source.all()[i], &p = params.all()[i];
    if (s.name != p.name || s.value.dtype != p.value.dtype || s.value.shape != p.value.shape)
      return cat(s.name, " ", shape_str(s.value.shape), " where the model has ", p.name, " ", shape_str(p.value.shape));
  }
  return {};
}

ReferenceWeights::ReferenceWeights(Ops& ops, const ParameterStore& source) {
  for (const Parameter& p : source.all())
    SOLTRAIN_CHECK(p.format == WeightFormat::Dense && p.value.defined() && p.value.device == ops.device(),
                   "a reference copy takes dense weights on the device (", p.name, ")");
  buffer_ = ops.alloc(bytes_for(source));
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
                   "reference weights: ", all[i].name, " differs in shape or dtype");  // mismatch() said so first
    own_.push_back(all[i].value.data);
    all[i].value.data = ref.values_[i].data;
  }
}

ReferenceWeights::Lend::~Lend() {
  std::vector<Parameter>& all = params_.all();
  for (size_t i = 0; i < own_.size(); ++i) all[i].value.data = own_[i];
}

}  // namespace soltrain
