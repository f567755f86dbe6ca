#include "model/parameters.h"

namespace soltrain {

namespace {
// The decayed range or the rest of a flat buffer of `dtype` elements.
Tensor range(const Buffer& b, DType dtype, int64_t decay_numel, int64_t other_numel, bool decayed) {
  char* base = static_cast<char*>(b.data());
  return decayed ? Tensor{base, dtype, {decay_numel}, b.device()}
                 : Tensor{base + size_t(decay_numel) * dtype_size(dtype), dtype, {other_numel}, b.device()};
}
}  // namespace

void ParameterStore::add(const std::string& name, Shape shape) {
  SOLTRAIN_CHECK(!index_.count(name), "duplicate parameter ", name);
  const bool decay = shape.size() >= 2;
  (decay ? decay_numel_ : other_numel_) += shape_numel(shape);
  index_[name] = params_.size();
  params_.push_back(Parameter{name, std::move(shape), decay, {}, {}, {}});
}

void ParameterStore::allocate(Ops& ops) {
  const DType act = ops.activation_dtype();
  masters_ = ops.alloc(size_t(numel()) * 4);
  grads_ = ops.alloc(size_t(numel()) * 4);
  if (act != DType::F32) values_ = ops.alloc(size_t(numel()) * dtype_size(act));
  int64_t off[2] = {0, decay_numel_};  // [decayed, other]
  for (auto& p : params_) {
    int64_t& o = off[p.decay ? 0 : 1];
    p.master = Tensor{static_cast<float*>(masters_.data()) + o, DType::F32, p.shape, ops.device()};
    p.grad = Tensor{static_cast<float*>(grads_.data()) + o, DType::F32, p.shape, ops.device()};
    p.value = values_.data() ? Tensor{static_cast<char*>(values_.data()) + size_t(o) * dtype_size(act), act, p.shape,
                                      ops.device()}
                             : p.master;
    o += shape_numel(p.shape);
  }
}

void ParameterStore::sync_values(Ops& ops) {
  if (values_alias_masters()) return;
  for (bool d : {true, false})
    if (values(d).numel()) ops.convert(values(d), masters(d));
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

Tensor ParameterStore::all_grads() const { return Tensor{grads_.data(), DType::F32, {numel()}, grads_.device()}; }

Tensor ParameterStore::masters(bool decayed) const {
  return range(masters_, DType::F32, decay_numel_, other_numel_, decayed);
}

Tensor ParameterStore::values(bool decayed) const {
  if (values_alias_masters()) return masters(decayed);
  return range(values_, params_.empty() ? DType::F32 : params_[0].value.dtype, decay_numel_, other_numel_, decayed);
}

Tensor ParameterStore::grads(bool decayed) const {
  return range(grads_, DType::F32, decay_numel_, other_numel_, decayed);
}

}  // namespace soltrain
