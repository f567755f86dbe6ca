#include "model/parameters.h"

#include <algorithm>

namespace soltrain {

namespace {
Tensor flat(const Buffer& b, DType dtype, int64_t offset, int64_t numel) {
  return Tensor{static_cast<char*>(b.data()) + size_t(offset) * dtype_size(dtype), dtype, {numel}, b.device()};
}
}  // namespace

void ParameterStore::add(const std::string& name, Shape shape, bool trainable, int group) {
  SOLTRAIN_CHECK(!index_.count(name), "duplicate parameter ", name);
  SOLTRAIN_CHECK(group >= 0 && !masters_.data() && !frozen_.data(), "parameter ", name, " added after allocate()");
  const bool decay = shape.size() >= 2;
  index_[name] = params_.size();
  params_.push_back(Parameter{name, std::move(shape), decay, trainable, group, {}, {}, {}});
}

void ParameterStore::allocate(Ops& ops) {
  const DType act = ops.activation_dtype();
  values_dtype_ = act;
  int groups = 0;
  for (const auto& p : params_) groups = std::max(groups, p.group + 1);
  // Offsets: group by group, decayed tensors first, each in the order added.
  numel_ = decayed_numel_ = frozen_numel_ = 0;
  group_begin_.assign(1, 0);
  ranges_.clear();
  for (int g = 0; g < groups; ++g) {
    for (bool decay : {true, false}) {
      const int64_t begin = numel_;
      for (auto& p : params_)
        if (p.trainable && p.group == g && p.decay == decay) {
          p.offset = numel_;
          numel_ += shape_numel(p.shape);
        }
      if (numel_ > begin) ranges_.push_back({g, decay, begin, numel_ - begin});
      if (decay) decayed_numel_ += numel_ - begin;
    }
    group_begin_.push_back(numel_);
  }
  for (const auto& p : params_)
    if (!p.trainable) frozen_numel_ += shape_numel(p.shape);
  masters_ = ops.alloc(size_t(numel_) * 4);
  grads_ = ops.alloc(size_t(numel_) * 4);
  if (act != DType::F32) values_ = ops.alloc(size_t(numel_) * dtype_size(act));
  frozen_ = ops.alloc(size_t(frozen_numel_) * dtype_size(act));
  int64_t frozen_off = 0;
  for (auto& p : params_) {
    if (!p.trainable) {
      p.value = flat(frozen_, act, frozen_off, shape_numel(p.shape)).view(p.shape);
      frozen_off += shape_numel(p.shape);
      continue;
    }
    const int64_t n = shape_numel(p.shape);
    p.master = flat(masters_, DType::F32, p.offset, n).view(p.shape);
    p.grad = flat(grads_, DType::F32, p.offset, n).view(p.shape);
    p.value = values_.data() ? flat(values_, act, p.offset, n).view(p.shape) : p.master;
  }
}

void ParameterStore::sync_values(Ops& ops) {
  if (values_alias_masters()) return;
  for (const ParamRange& r : ranges_) ops.convert(values(r), masters(r));
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
  return flat(grads_, DType::F32, 0, numel_);
}

Tensor ParameterStore::group_grads(int group) const {
  SOLTRAIN_CHECK(group >= 0 && group < groups(), "no parameter group ", group);
  return flat(grads_, DType::F32, group_begin_[size_t(group)],
              group_begin_[size_t(group) + 1] - group_begin_[size_t(group)]);
}

Tensor ParameterStore::masters(const ParamRange& r) const {
  return flat(masters_, DType::F32, r.offset, r.numel);
}

Tensor ParameterStore::values(const ParamRange& r) const {
  if (values_alias_masters()) return masters(r);
  return flat(values_, values_dtype_, r.offset, r.numel);
}

Tensor ParameterStore::grads(const ParamRange& r) const {
  return flat(grads_, DType::F32, r.offset, r.numel);
}

}  // namespace soltrain
