#include "model/parameters.h"

namespace soltrain {

void ParameterStore::add(const std::string& name, Shape shape) {
  SOLTRAIN_CHECK(!index_.count(name), "duplicate parameter ", name);
  const bool decay = shape.size() >= 2;
  (decay ? decay_numel_ : other_numel_) += shape_numel(shape);
  index_[name] = params_.size();
  params_.push_back(Parameter{name, std::move(shape), decay, {}, {}});
}

void ParameterStore::allocate(Ops& ops) {
  values_ = ops.alloc(size_t(numel()) * 4);
  grads_ = ops.alloc(size_t(numel()) * 4);
  int64_t off[2] = {0, decay_numel_};  // [decayed, other]
  for (auto& p : params_) {
    int64_t& o = off[p.decay ? 0 : 1];
    p.value = Tensor{static_cast<float*>(values_.data()) + o, DType::F32, p.shape, ops.device()};
    p.grad = Tensor{static_cast<float*>(grads_.data()) + o, DType::F32, p.shape, ops.device()};
    o += shape_numel(p.shape);
  }
}

Parameter* ParameterStore::find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

Parameter& ParameterStore::at(const std::string& name) {
  Parameter* p = find(name);
  SOLTRAIN_CHECK(p, "no parameter ", name);
  return *p;
}

const Parameter& ParameterStore::at(const std::string& name) const {
  return const_cast<ParameterStore*>(this)->at(name);
}

Tensor ParameterStore::all_grads() const {
  return Tensor{grads_.data(), DType::F32, {numel()}, grads_.device()};
}

Tensor ParameterStore::values(bool decayed) const {
  float* base = static_cast<float*>(values_.data());
  return decayed ? Tensor{base, DType::F32, {decay_numel_}, values_.device()}
                 : Tensor{base + decay_numel_, DType::F32, {other_numel_}, values_.device()};
}

Tensor ParameterStore::grads(bool decayed) const {
  float* base = static_cast<float*>(grads_.data());
  return decayed ? Tensor{base, DType::F32, {decay_numel_}, grads_.device()}
                 : Tensor{base + decay_numel_, DType::F32, {other_numel_}, grads_.device()};
}

}  // namespace soltrain
