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

void ParameterStore::add(const std::string& name, Shape shape, bool trainable) {
  SOLTRAIN_CHECK(!index_.count(name), "duplicate parameter ", name);
  const bool decay = shape.size() >= 2;
  (!trainable ? frozen_numel_ : decay ? decay_numel_ : other_numel_) += shape_numel(shape);
  index_[name] = params_.size();
  params_.push_back(Parameter{name, std::move(shape), decay, trainable, {}, {}, {}});
}

void ParameterStore::allocate(Ops& ops) {
  const DType act = ops.activation_dtype();
  values_dtype_ = act;
  masters_ = ops.alloc(size_t(numel()) * 4);
  grads_ = ops.alloc(size_t(numel()) * 4);
  if (act != DType::F32) values_ = ops.alloc(size_t(numel()) * dtype_size(act));
  frozen_ = ops.alloc(size_t(frozen_numel_) * dtype_size(act));
  int64_t off[2] = {0, decay_numel_};  // [decayed, other]
  int64_t frozen_off = 0;
  for (auto& p : params_) {
    if (!p.trainable) {
      p.value =
          Tensor{static_cast<char*>(frozen_.data()) + size_t(frozen_off) * dtype_size(act), act, p.shape, ops.device()};
      frozen_off += shape_numel(p.shape);
      continue;
    }
    int64_t& o = off[p.decay ? 0 : 1];
    p.master = Tensor{static_cast<float*>(masters_.data()) + o, DType::F32, p.shape, ops.device()};
    p.grad = Tensor{static_cast<float*>(grads_.data()) + o, DType::F32, p.shape, ops.device()};
    p.value = values_.data()
                  ? Tensor{static_cast<char*>(values_.data()) + size_t(o) * dtype_size(act), act, p.shape, ops.device()}
                  : p.master;
    o += shape_numel(p.shape);
  }
}

void ParameterStore::sync_values(Ops& ops) {
  if (values_alias_masters()) return;
  for (bool d : {true, false})
    if (values(d).numel()) ops.convert(values(d), masters(d));
}

void ParameterStore::upload(Ops& ops, Parameter& p, const float* host) {
  const Tensor h{const_cast<float*>(host), DType::F32, p.shape, Device::CPU};
  if (p.trainable) {
    ops.copy(p.master, h);
    if (p.value.data != p.master.data) ops.convert(p.value, p.master);
  } else if (p.value.dtype == DType::F32) {
    ops.copy(p.value, h);
  } else {
    // Frozen weights have no fp32 home on the device: round on the host (to nearest even, as convert does).
    SOLTRAIN_CHECK(p.value.dtype == DType::BF16, "frozen ", p.name, " in ", dtype_name(p.value.dtype));
    std::vector<uint16_t> b(size_t(p.value.numel()));
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(host[i]);
    ops.copy(p.value, Tensor{b.data(), DType::BF16, p.shape, Device::CPU});
  }
}

void ParameterStore::download(Ops& ops, const Parameter& p, float* host) const {
  const Tensor& src = p.trainable ? p.master : p.value;
  if (src.dtype == DType::F32) return ops.copy(Tensor{host, DType::F32, p.shape, Device::CPU}, src);
  SOLTRAIN_CHECK(src.dtype == DType::BF16, "download ", p.name, " in ", dtype_name(src.dtype));
  std::vector<uint16_t> b(size_t(src.numel()));
  ops.copy(Tensor{b.data(), DType::BF16, p.shape, Device::CPU}, src);
  for (size_t i = 0; i < b.size(); ++i) host[i] = bf16_to_f32(b[i]);
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

Tensor ParameterStore::masters(bool decayed) const {
  return range(masters_, DType::F32, decay_numel_, other_numel_, decayed);
}

Tensor ParameterStore::values(bool decayed) const {
  if (values_alias_masters()) return masters(decayed);
  return range(values_, values_dtype_, decay_numel_, other_numel_, decayed);
}

Tensor ParameterStore::grads(bool decayed) const {
  return range(grads_, DType::F32, decay_numel_, other_numel_, decayed);
}

}  // namespace soltrain
