#include "model/parameters.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"

namespace soltrain {

namespace {
// Where a quantised weight's codes and scales sit in the quantised buffer (each start 256-byte aligned, as
// the GEMMs and vector loads like).
struct QuantisedLayout {
  size_t codes, scales, scale_at, total;
};
size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}
Shape fp8_scale_shape(const Shape& s) {
  return {(s[0] + quant::kFp8Tile - 1) / quant::kFp8Tile, (s[1] + quant::kFp8Tile - 1) / quant::kFp8Tile};
}
// The scales' bytes (NF4's and NVFP4's are bytes, the others' floats).
size_t scale_bytes(const Parameter& p, const QuantisedLayout& l) {
  const bool byte_scales = p.format == WeightFormat::Nf4 || p.format == WeightFormat::Nvfp4;
  return byte_scales ? l.scales : 4 * l.scales;
}
QuantisedLayout quantised_layout(const Parameter& p) {
  const int64_t n = shape_numel(p.shape);
  QuantisedLayout l{};
  if (p.format == WeightFormat::Nf4) {
    const quant::Nf4Layout nf(n);
    l.codes = size_t(nf.data_bytes());
    l.scales = size_t(nf.scale_bytes());
  } else if (p.format == WeightFormat::Int8Row) {
    l.codes = size_t(n);
    l.scales = size_t(p.shape[0]);  // floats: each row's absmax
  } else if (p.format == WeightFormat::Nvfp4) {
    l.codes = size_t(n / 2);
    l.scales = size_t(quant::nvfp4_scale_bytes(p.shape[0], p.shape[1]));  // bytes
  } else {
    l.codes = size_t(n);
    l.scales = size_t(shape_numel(fp8_scale_shape(p.shape)));  // floats
  }
  l.scale_at = align256(l.codes);
  l.total = l.scale_at + align256(scale_bytes(p, l));
  return l;
}

// A weight quantised on the host (the CPU twin's arithmetic) into its codes and scales, laid out as stored.
void quantise_on_host(const Parameter& p, const float* host, uint8_t* codes, uint8_t* scale) {
  if (p.format == WeightFormat::Nf4)
    nf4_quantize(host, shape_numel(p.shape), codes, scale);
  else if (p.format == WeightFormat::Int8Row)
    int8_row_quantize(host, p.shape[0], p.shape[1], codes, reinterpret_cast<float*>(scale));
  else if (p.format == WeightFormat::Nvfp4)
    nvfp4_quantize(host, p.shape[0], p.shape[1], codes, scale);
  else
    fp8_block_quantize(host, p.shape[0], p.shape[1], codes, reinterpret_cast<float*>(scale));
}
// A frozen weight's elements rounded up to whole 256-byte units, on the host and the device alike: each then
// starts on such a boundary, so a layer streamed into a slot has the alignment it has when resident, and the
// GEMMs pick the same algorithm (same bits).
int64_t frozen_units(int64_t n, DType act) {
  const int64_t align = int64_t(256 / dtype_size(act));
  return (n + align - 1) / align * align;
}
// named [parts·out, R·E] (row part·out + o, column i·E + e) <-> stored [parts][E][out][R] (StoredOrder).
void reorder(const Parameter& p, const float* from, float* to, bool to_stored) {
  SOLTRAIN_CHECK(!p.order.named() && from != to, "reorder ", p.name, ": no stored order, or in place");
  const int64_t E = p.order.experts, parts = p.order.parts, out = p.shape[0] / parts, R = p.shape[1] / E;
  for (int64_t part = 0; part < parts; ++part)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < R; ++i) {
          const int64_t named = (part * out + o) * R * E + i * E + e, stored = ((part * E + e) * out + o) * R + i;
          if (to_stored)
            to[stored] = from[named];
          else
            to[named] = from[stored];
        }
}
Tensor flat(const Buffer& b, DType dtype, int64_t offset, int64_t numel) {
  return Tensor{static_cast<char*>(b.data()) + size_t(offset) * dtype_size(dtype), dtype, {numel}, b.device()};
}
}  // namespace

void named_to_stored(const Parameter& p, const float* named, float* stored) {
  reorder(p, named, stored, true);
}
void stored_to_named(const Parameter& p, const float* stored, float* named) {
  reorder(p, stored, named, false);
}

void ParameterStore::add(const std::string& name, Shape shape, bool trainable, int group, WeightFormat format,
                         StoredOrder order) {
  SOLTRAIN_CHECK(!index_.count(name), "duplicate parameter ", name);
  SOLTRAIN_CHECK(group >= 0 && !masters_.data() && !frozen_.data(), "parameter ", name, " added after allocate()");
  const bool decay = shape.size() >= 2;
  index_[name] = params_.size();
  SOLTRAIN_CHECK(format == WeightFormat::Dense || (!trainable && shape.size() == 2), "quantised ", name,
                 " must be a frozen matrix");
  params_.push_back(Parameter{name, std::move(shape), decay, trainable, group, {}, {}, {}});
  params_.back().format = format;
  const Shape& sh = params_.back().shape;
  SOLTRAIN_CHECK(order.named() || (trainable && sh.size() == 2 && order.parts > 0 && sh[0] % order.parts == 0 &&
                                   sh[1] % order.experts == 0),
                 "stored order of ", name, ": a trainable [parts·out, R·E] matrix");
  params_.back().order = order;
}

void ParameterStore::lay_out() {
  int groups = 0;
  for (const auto& p : params_) groups = std::max(groups, p.group + 1);
  // Offsets: group by group, decayed tensors first, each in the order added.
  numel_ = decayed_numel_ = 0;
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
}

void ParameterStore::allocate(Ops& ops, StoreOptions options) {
  const DType act = ops.activation_dtype();
  const bool gradients = options.gradients;
  SOLTRAIN_CHECK(options.masters == DType::F32 || options.masters == DType::BF16, "masters in ",
                 dtype_name(options.masters));
  gradients_ = gradients;
  master_dtype_ = options.masters;
  values_dtype_ = act;
  frozen_numel_ = 0;
  lay_out();
  const int groups = this->groups();
  // Frozen weights of the groups kept on the host (keep_frozen_on_host): group by group, in the order added.
  frozen_host_at_.assign(params_.size(), -1);
  frozen_host_range_.assign(size_t(groups), {0, 0});
  int64_t host_frozen = 0;
  for (int g = 0; g < groups; ++g) {
    if (std::find(frozen_host_groups_.begin(), frozen_host_groups_.end(), g) == frozen_host_groups_.end()) continue;
    const int64_t begin = host_frozen;
    for (size_t i = 0; i < params_.size(); ++i) {
      const Parameter& p = params_[i];
      if (p.trainable || p.group != g) continue;
      SOLTRAIN_CHECK(p.format == WeightFormat::Dense, "frozen ", p.name, " is quantised: it cannot stay on the host");
      frozen_host_at_[i] = host_frozen;
      host_frozen += frozen_units(shape_numel(p.shape), act);
    }
    frozen_host_range_[size_t(g)] = {begin, host_frozen};
  }
  const PlannedBytes b = planned_bytes(act, master_dtype_);  // the buffers' sizes, as bench --plan-only reports them
  frozen_numel_ = b.frozen_elements;
  if (options.shards) {  // ZeRO-3 by slices: only this rank's, nothing whole (keep_shards' and keep_frozen_shards')
    const StoreShards cut = options.shards(*this, act);
    const int64_t held = cut_slices(cut.owned, cut.chunk);
    masters_ = ops.alloc(size_t(held) * 4), grads_ = ops.alloc(size_t(held) * 4);  // zeroed: the padding stays 0
    if (act != master_dtype_) values_ = ops.alloc(size_t(held) * dtype_size(act));
    gradients_ = true;  // the slices'
    if (!cut.frozen_chunk.empty())
      frozen_slices_buf_ = ops.alloc(size_t(std::max<int64_t>(cut_frozen(cut.rank, cut.frozen_chunk), 1)));
  } else {
    masters_ = ops.alloc(b.masters);
    if (gradients) grads_ = ops.alloc(b.grads);
    if (act != master_dtype_) values_ = ops.alloc(b.values);
  }
  if (!frozen_sharded()) frozen_ = ops.alloc(b.frozen), quantised_ = ops.alloc(b.quantised);
  if (b.frozen_host > 0) frozen_host_ = ops.alloc_host(b.frozen_host);
  int64_t frozen_off = 0;
  size_t quantised_off = 0;
  for (auto& p : params_) {
    if (packed(p) || (p.trainable && sharded())) continue;  // unbound until a gather binds it
    if (!p.trainable && p.format != WeightFormat::Dense) {
      bind_storage(p, static_cast<char*>(quantised_.data()) + quantised_off, quantised_.device());
      quantised_off += quantised_layout(p).total;
      continue;
    }
    if (on_host(p)) {
      p.value = host_copy(p);
      continue;
    }
    if (!p.trainable) {
      bind_storage(p, static_cast<char*>(frozen_.data()) + size_t(frozen_off) * dtype_size(act), frozen_.device());
      frozen_off += frozen_units(shape_numel(p.shape), act);
      continue;
    }
    const int64_t n = shape_numel(p.shape);
    p.master = flat(masters_, master_dtype_, p.offset, n).view(p.shape);
    p.grad = gradients ? flat(grads_, DType::F32, p.offset, n).view(p.shape) : Tensor{};
    p.value = values_.data() ? flat(values_, act, p.offset, n).view(p.shape) : p.master;
  }
}

void ParameterStore::bind_storage(Parameter& p, char* base, Device device) const {
  if (p.format == WeightFormat::Dense) {
    p.value = Tensor{base, values_dtype_, p.shape, device};
    return;
  }
  const QuantisedLayout l = quantised_layout(p);
  const bool nf4 = p.format == WeightFormat::Nf4 || p.format == WeightFormat::Nvfp4,
             int8 = p.format == WeightFormat::Int8Row;  // (Nvfp4 is laid out as Nf4: codes and a byte blob)
  p.value = nf4    ? Tensor{base, DType::U8, {int64_t(l.codes)}, device}
            : int8 ? Tensor{base, DType::U8, p.shape, device}
                   : Tensor{base, DType::F8E4M3, p.shape, device};
  p.scale = nf4    ? Tensor{base + l.scale_at, DType::U8, {int64_t(l.scales)}, device}
            : int8 ? Tensor{base + l.scale_at, DType::F32, {p.shape[0]}, device}
                   : Tensor{base + l.scale_at, DType::F32, fp8_scale_shape(p.shape), device};
}

void ParameterStore::move_masters_to_host(Ops& ops) {
  SOLTRAIN_CHECK(!masters_on_host_, "move_masters_to_host twice");
  SOLTRAIN_CHECK(master_dtype_ == DType::F32, "offload_master with bf16 masters (they are the compute weights)");
  const int64_t n = sharded() ? held_ : numel_;  // (ZeRO-3: the rank's slices)
  Buffer host = ops.alloc_host(size_t(std::max<int64_t>(n, 1)) * 4);
  if (n > 0) ops.copy(flat(host, DType::F32, 0, n), flat(masters_, DType::F32, 0, n));
  masters_ = std::move(host);
  masters_on_host_ = true;
  if (sharded()) return;  // (its parameters are bound only while a group is whole)
  for (auto& p : params_) {
    if (!p.trainable) continue;
    p.master = flat(masters_, DType::F32, p.offset, shape_numel(p.shape)).view(p.shape);
    if (values_alias_masters()) p.value = p.master;
  }
}

void ParameterStore::move_layer_grads_to_host(Ops& ops, int layers) {
  SOLTRAIN_CHECK(gradients_ && !sharded() && host_grads_end_ == 0 && layers >= 1 && layers < groups(),
                 "move_layer_grads_to_host: a whole gradient buffer, once, and a group left on the device");
  const int64_t split = group_begin(layers);
  Buffer host = ops.alloc_host(size_t(std::max<int64_t>(split, 1)) * 4);
  Buffer rest = ops.alloc(size_t(std::max<int64_t>(numel_ - split, 1)) * 4);
  if (split > 0) ops.copy(flat(host, DType::F32, 0, split), flat(grads_, DType::F32, 0, split));
  if (numel_ > split)
    ops.copy(flat(rest, DType::F32, 0, numel_ - split), flat(grads_, DType::F32, split, numel_ - split));
  grads_host_ = std::move(host);
  grads_ = std::move(rest);
  host_grads_end_ = split;
  for (Parameter& p : params_)
    if (p.trainable) p.grad = grad_home(p.offset, shape_numel(p.shape)).view(p.shape);
}

void ParameterStore::drop_layer_grads(Ops& ops, int layers) {
  SOLTRAIN_CHECK(!sharded() && host_grads_end_ == 0 && layers >= 1 && layers < groups(),
                 "drop_layer_grads: an unsharded store, once, and a group left on the device");
  const int64_t split = group_begin(layers);
  // (a store allocated without gradients, as optimizer_in_backward's is, never holds the whole model's: only
  // the head's group's are made here, zeroed)
  Buffer rest = ops.alloc(size_t(std::max<int64_t>(numel_ - split, 1)) * 4);
  if (gradients_ && numel_ > split)
    ops.copy(flat(rest, DType::F32, 0, numel_ - split), flat(grads_, DType::F32, split, numel_ - split));
  gradients_ = true;
  grads_ = std::move(rest);
  host_grads_end_ = split;
  layer_grads_bound_only_ = true;
  bound_grads_.assign(size_t(groups()), Tensor{});
  for (Parameter& p : params_)
    if (p.trainable) p.grad = p.offset >= split ? grad_home(p.offset, shape_numel(p.shape)).view(p.shape) : Tensor{};
}

Tensor ParameterStore::grad_home(int64_t offset, int64_t numel) const {
  if (offset >= host_grads_end_) return flat(grads_, DType::F32, offset - host_grads_end_, numel);
  if (layer_grads_bound_only_) {  // the group's slot while bound (drop_layer_grads)
    const int g = int(std::upper_bound(group_begin_.begin(), group_begin_.end(), offset) - group_begin_.begin()) - 1;
    const Tensor& base = bound_grads_.at(size_t(g));
    SOLTRAIN_CHECK(base.data && offset + numel <= group_begin(g + 1), "gradient range [", offset, ", ", offset + numel,
                   ") of group ", g, " read while no slot is bound to it");
    return Tensor{static_cast<float*>(base.data) + (offset - group_begin(g)), DType::F32, {numel}, base.device};
  }
  SOLTRAIN_CHECK(offset + numel <= host_grads_end_, "gradient range [", offset, ", ", offset + numel,
                 ") straddles host and device memory");
  return flat(grads_host_, DType::F32, offset, numel);
}

void ParameterStore::round_value(Ops& ops, const Tensor& value, const float* host) const {
  SOLTRAIN_CHECK(value.dtype == DType::BF16, "compute copy in ", dtype_name(value.dtype));
  std::vector<uint16_t> b(size_t(value.numel()));
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(host[i]);
  ops.copy(value, Tensor{b.data(), DType::BF16, value.shape, Device::CPU});
}

void ParameterStore::sync_values(Ops& ops) {
  // (a sharded store's compute copy is written with its masters: upload_owned, the sharded update)
  SOLTRAIN_CHECK(!sharded(), "sync_values on a sharded store");
  if (values_alias_masters()) return;
  if (masters_on_host_) {
    for (const ParamRange& r : ranges_) round_value(ops, values(r), static_cast<const float*>(masters(r).data));
    return;
  }
  for (const ParamRange& r : ranges_) ops.convert(values(r), masters(r));
}
void ParameterStore::upload(Ops& ops, Parameter& p, const float* host) {
  std::vector<float> stored;
  if (!p.order.named()) {
    stored.resize(size_t(shape_numel(p.shape)));
    named_to_stored(p, host, stored.data());
    host = stored.data();
  }
  if (p.trainable && sharded()) return upload_owned(ops, p, host + owned_part(p).first);
  const Tensor h{const_cast<float*>(host), DType::F32, p.shape, Device::CPU};
  if (packed(p)) return upload_frozen_packed(ops, p, host);  // (ZeRO-3's slices of a frozen base)
  if (p.format != WeightFormat::Dense) {
    // Quantised on the host (the CPU twin's arithmetic), then copied up as stored.
    const QuantisedLayout l = quantised_layout(p);
    std::vector<uint8_t> codes(l.codes), scale(scale_bytes(p, l));
    quantise_on_host(p, host, codes.data(), scale.data());
    return upload_quantised(ops, p, codes.data(), scale.data());
  }
  if (p.trainable && p.master.dtype == DType::BF16) {  // bf16 masters: rounded to nearest on the host, as .to()
    round_value(ops, p.master, host);
    if (p.value.data && p.value.data != p.master.data) ops.convert(p.value, p.master);
    return;
  }
  if (p.trainable) {
    ops.copy(p.master, h);
    // (ZeRO-3 loads into masters bound on the host with the compute copy unbound: its owner re-derives it.)
    if (p.value.data && p.value.data != p.master.data) {
      if (masters_on_host_)
        round_value(ops, p.value, host);
      else
        ops.convert(p.value, p.master);
    }
  } else {
    if (on_host(p)) ++frozen_host_version_;                    // a device copy of its layer is stale now (WeightStream)
    const Tensor value = on_host(p) ? host_copy(p) : p.value;  // (a streamed weight's home, wherever it is bound)
    if (value.dtype == DType::F32) return ops.copy(value, h);
    // Frozen weights have no fp32 home on the device: round on the host (to nearest even, as convert does).
    SOLTRAIN_CHECK(value.dtype == DType::BF16, "frozen ", p.name, " in ", dtype_name(value.dtype));
    std::vector<uint16_t> b(size_t(value.numel()));
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(host[i]);
    ops.copy(value, Tensor{b.data(), DType::BF16, p.shape, Device::CPU});
  }
}

std::pair<int64_t, int64_t> ParameterStore::owned_part(const Parameter& p) const {
  const int64_t n = shape_numel(p.shape);
  if (!sharded()) return {0, n};
  SOLTRAIN_CHECK(p.trainable, p.name, " is frozen: it has no slices");
  const Slice& s = slices_.at(size_t(p.group));
  const int64_t lo = std::max(s.begin, p.offset), hi = std::min(s.end, p.offset + n);
  return hi > lo ? std::pair{lo - p.offset, hi - lo} : std::pair{int64_t(0), int64_t(0)};
}

void ParameterStore::upload_owned(Ops& ops, Parameter& p, const float* host) {
  const auto [first, count] = owned_part(p);
  if (count == 0) return;
  if (!sharded()) return upload(ops, p, host);
  SOLTRAIN_CHECK(master_dtype_ == DType::F32, "ZeRO-3's slices of bf16 masters");
  const ParamRange r{p.group, p.decay, p.offset + first, count};
  const Tensor h{const_cast<float*>(host), DType::F32, {count}, Device::CPU};
  ops.copy(masters(r), h);
  if (values_alias_masters()) return;
  if (masters_on_host_)
    round_value(ops, values(r), host);
  else
    ops.convert(values(r), masters(r));
}

void ParameterStore::upload_quantised(Ops& ops, Parameter& p, const void* codes, const void* scale) {
  SOLTRAIN_CHECK(p.format != WeightFormat::Dense, p.name, " is not quantised");
  if (packed(p)) {  // its storage assembled on the host as allocate() lays it out, this rank's bytes kept
    const QuantisedLayout l = quantised_layout(p);
    std::vector<uint8_t> span(l.total, 0);
    std::memcpy(span.data(), codes, l.codes);
    std::memcpy(span.data() + l.scale_at, scale, scale_bytes(p, l));
    return store_packed(ops, p, span.data());
  }
  ops.copy(p.value, Tensor{const_cast<void*>(codes), p.value.dtype, p.value.shape, Device::CPU});
  ops.copy(p.scale, Tensor{const_cast<void*>(scale), p.scale.dtype, p.scale.shape, Device::CPU});
}

void ParameterStore::download(Ops& ops, const Parameter& p, float* host, bool queued) const {
  SOLTRAIN_CHECK(p.trainable || p.value.data || on_host(p), "frozen ", p.name,
                 " is sharded (ZeRO-3) and not gathered now: read it from the model's folder");
  if (p.trainable && !p.master.data && master_source_) master_source_(p.group);
  SOLTRAIN_CHECK(!p.trainable || p.master.data, p.name, " has no master bound (ZeRO-3: nothing streams it)");
  if (!p.order.named()) {
    std::vector<float> stored(size_t(shape_numel(p.shape)));
    Parameter as_stored = p;
    as_stored.order = {};
    download(ops, as_stored, stored.data());
    return stored_to_named(p, stored.data(), host);
  }
  if (p.format != WeightFormat::Dense) {
    std::vector<uint8_t> codes(size_t(p.value.bytes())), scale(size_t(p.scale.bytes()));
    ops.copy(Tensor{codes.data(), p.value.dtype, p.value.shape, Device::CPU}, p.value);
    ops.copy(Tensor{scale.data(), p.scale.dtype, p.scale.shape, Device::CPU}, p.scale);
    if (p.format == WeightFormat::Nf4) return nf4_dequantize(codes.data(), scale.data(), shape_numel(p.shape), host);
    if (p.format == WeightFormat::Int8Row)
      return int8_row_dequantize(codes.data(), reinterpret_cast<const float*>(scale.data()), p.shape[0], p.shape[1],
                                 host);
    if (p.format == WeightFormat::Nvfp4)
      return nvfp4_dequantize(codes.data(), scale.data(), p.shape[0], p.shape[1], host);
    return fp8_block_dequantize(codes.data(), reinterpret_cast<const float*>(scale.data()), p.shape[0], p.shape[1],
                                host);
  }
  const Tensor src = p.trainable ? p.master : on_host(p) ? host_copy(p) : p.value;
  if (src.dtype == DType::F32) return ops.copy_to_host(Tensor{host, DType::F32, p.shape, Device::CPU}, src, queued);
  SOLTRAIN_CHECK(src.dtype == DType::BF16, "download ", p.name, " in ", dtype_name(src.dtype));
  std::vector<uint16_t> b(size_t(src.numel()));
  ops.copy(Tensor{b.data(), DType::BF16, p.shape, Device::CPU}, src);
  for (size_t i = 0; i < b.size(); ++i) host[i] = bf16_to_f32(b[i]);
}

void ParameterStore::download_grad(Ops& ops, const Parameter& p, float* host) const {
  SOLTRAIN_CHECK(p.trainable && p.grad.data, "the gradient of ", p.name, ": not trainable, or not bound");
  std::vector<float> stored(p.order.named() ? 0 : size_t(shape_numel(p.shape)));
  ops.copy(Tensor{p.order.named() ? host : stored.data(), DType::F32, p.shape, Device::CPU}, p.grad);
  if (!p.order.named()) stored_to_named(p, stored.data(), host);
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
  SOLTRAIN_CHECK(gradients_, "the model was made without gradients (for ZeRO-3, which allocates their slices)");
  SOLTRAIN_CHECK(host_grads_end_ == 0, "all_grads() with the layers' gradients in host memory or not kept");
  return flat(grads_, DType::F32, 0, sharded() ? held_ : numel_);
}

Tensor ParameterStore::group_grads(int group) const {
  SOLTRAIN_CHECK(group >= 0 && group < groups(), "no parameter group ", group);
  SOLTRAIN_CHECK(!sharded(), "group_grads() of a sharded store: its groups are whole only while bound");
  SOLTRAIN_CHECK(gradients_, "the model was made without gradients");
  return grad_home(group_begin(group), group_numel(group));
}

int64_t ParameterStore::held_offset(const ParamRange& r) const {
  if (!sharded()) return r.offset;
  const Slice& s = slices_.at(size_t(r.group));
  SOLTRAIN_CHECK(r.offset >= s.begin && r.offset + r.numel <= s.end, "range [", r.offset, ", ", r.offset + r.numel,
                 ") of group ", r.group, " is not this rank's [", s.begin, ", ", s.end, ")");
  return s.at + (r.offset - s.begin);
}

Tensor ParameterStore::masters(const ParamRange& r) const {
  return flat(masters_, master_dtype_, held_offset(r), r.numel);
}

Tensor ParameterStore::values(const ParamRange& r) const {
  if (values_alias_masters()) return masters(r);
  return flat(values_, values_dtype_, held_offset(r), r.numel);
}

Tensor ParameterStore::grads(const ParamRange& r) const {
  SOLTRAIN_CHECK(gradients_, "the model was made without gradients");
  if (sharded()) return flat(grads_, DType::F32, held_offset(r), r.numel);
  return grad_home(r.offset, r.numel);
}

int64_t ParameterStore::cut_slices(const std::vector<std::pair<int64_t, int64_t>>& owned,
                                   const std::vector<int64_t>& chunk) {
  SOLTRAIN_CHECK(!sharded() && host_grads_end_ == 0 && int(owned.size()) == groups() && int(chunk.size()) == groups(),
                 "keep_shards");
  SOLTRAIN_CHECK(master_dtype_ == DType::F32, "ZeRO-3's slices of bf16 masters are not built");
  std::vector<Slice> slices;
  int64_t held = 0;
  for (int g = 0; g < groups(); ++g) {
    const auto [b, e] = owned[size_t(g)];
    SOLTRAIN_CHECK(group_begin(g) <= b && b <= e && e <= group_begin(g + 1) && e - b <= chunk[size_t(g)],
                   "shard of group ", g);
    slices.push_back({b, e, held, chunk[size_t(g)]});
    held += chunk[size_t(g)];
  }
  slices_ = std::move(slices);
  held_ = held;
  return held;
}

void ParameterStore::keep_shards(Ops& ops, const std::vector<std::pair<int64_t, int64_t>>& owned,
                                 const std::vector<int64_t>& chunk) {
  const int64_t held = cut_slices(owned, chunk);
  const DType act = values_dtype_;
  Buffer m = ops.alloc(size_t(held) * 4), gr = ops.alloc(size_t(held) * 4);  // zeroed: the padding stays 0
  Buffer v = values_.data() ? ops.alloc(size_t(held) * dtype_size(act)) : Buffer{};
  for (const Slice& s : slices_) {
    if (s.end == s.begin) continue;
    const int64_t n = s.end - s.begin;
    ops.copy(flat(m, DType::F32, s.at, n), flat(masters_, DType::F32, s.begin, n));
    if (v.data()) ops.copy(flat(v, act, s.at, n), flat(values_, act, s.begin, n));  // the compute copy as it is
  }
  masters_ = std::move(m);
  grads_ = std::move(gr);
  values_ = std::move(v);
  gradients_ = true;  // the slices'
  for (Parameter& p : params_)
    if (p.trainable) p.master = p.value = p.grad = Tensor{};
}

Tensor ParameterStore::shard_masters(int group) const {
  const Slice& s = slices_.at(size_t(group));
  return flat(masters_, DType::F32, s.at, s.chunk);
}

Tensor ParameterStore::shard_values(int group) const {
  if (values_alias_masters()) return shard_masters(group);
  const Slice& s = slices_.at(size_t(group));
  return flat(values_, values_dtype_, s.at, s.chunk);
}

Tensor ParameterStore::shard_grads(int group) const {
  const Slice& s = slices_.at(size_t(group));
  return flat(grads_, DType::F32, s.at, s.chunk);
}

ParameterStore::PlannedBytes ParameterStore::planned_bytes(DType act, DType masters) const {
  // Frozen weights in whole 256-byte units (frozen_units), quantised ones by their layout.
  PlannedBytes b;
  std::map<int, int64_t> host_groups;
  for (const Parameter& p : params_) {
    const int64_t n = shape_numel(p.shape);
    if (p.trainable) {
      b.trainable += n;
      continue;
    }
    b.frozen_elements += n;
    const bool host =
        std::find(frozen_host_groups_.begin(), frozen_host_groups_.end(), p.group) != frozen_host_groups_.end();
    if (host)
      host_groups[p.group] += frozen_units(n, act);
    else if (p.format == WeightFormat::Dense)
      b.frozen += size_t(frozen_units(n, act)) * dtype_size(act);
    else
      b.quantised += quantised_layout(p).total;
  }
  for (const auto& [g, n] : host_groups) {
    b.frozen_host += size_t(n) * dtype_size(act);
    b.largest_host_group = std::max(b.largest_host_group, n);
  }
  b.masters = size_t(b.trainable) * dtype_size(masters);
  b.grads = size_t(b.trainable) * 4;
  b.values = act == masters ? 0 : size_t(b.trainable) * dtype_size(act);  // (none where the master is the copy)
  return b;
}

std::vector<int64_t> ParameterStore::packed_offsets(DType act, std::vector<int64_t>* group_bytes) const {
  // Each frozen tensor on the device takes its storage as allocate() lays it out (whole 256-byte units), in the
  // order added within its group.
  group_bytes->assign(size_t(groups()), 0);
  std::vector<int64_t> at(params_.size(), -1);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    if (p.trainable ||
        std::find(frozen_host_groups_.begin(), frozen_host_groups_.end(), p.group) != frozen_host_groups_.end())
      continue;
    int64_t& end = (*group_bytes)[size_t(p.group)];
    at[i] = end;
    end += p.format == WeightFormat::Dense ? frozen_units(shape_numel(p.shape), act) * int64_t(dtype_size(act))
                                           : int64_t(quantised_layout(p).total);
  }
  return at;
}

std::vector<int64_t> ParameterStore::frozen_packed_bytes(DType act) const {
  std::vector<int64_t> bytes;
  packed_offsets(act, &bytes);
  return bytes;
}

int64_t ParameterStore::storage_bytes(const Parameter& p) const {
  return p.format == WeightFormat::Dense
             ? frozen_units(shape_numel(p.shape), values_dtype_) * int64_t(dtype_size(values_dtype_))
             : int64_t(quantised_layout(p).total);
}

int64_t ParameterStore::cut_frozen(int rank, const std::vector<int64_t>& chunk) {
  SOLTRAIN_CHECK(!frozen_sharded() && int(chunk.size()) == groups(), "keep_frozen_shards");
  std::vector<int64_t> bytes;
  packed_at_ = packed_offsets(values_dtype_, &bytes);
  frozen_rank_ = rank;
  int64_t held = 0;
  for (int g = 0; g < groups(); ++g) {
    const int64_t c = chunk[size_t(g)];
    SOLTRAIN_CHECK(c >= 0 && (bytes[size_t(g)] == 0 || c > 0), "frozen chunk of group ", g);
    frozen_slices_.push_back({held, c});
    held += c;
  }
  return held;
}

void ParameterStore::keep_frozen_shards(Ops& ops, int rank, const std::vector<int64_t>& chunk) {
  frozen_slices_buf_ = ops.alloc(size_t(std::max<int64_t>(cut_frozen(rank, chunk), 1)));  // zeroed: padding 0
  for (Parameter& p : params_) {
    if (!packed(p)) continue;
    // The part of this tensor's storage [at, at + n) inside the rank's slice [lo, lo + chunk) of its group,
    // copied where it lies (the whole buffers are freed below).
    const FrozenSlice& f = frozen_slices_[size_t(p.group)];
    const int64_t at = packed_at_[size_t(&p - params_.data())], lo = int64_t(rank) * f.chunk, n = storage_bytes(p);
    const int64_t from = std::max(at, lo), to = std::min(at + n, lo + f.chunk);
    if (to > from)
      ops.copy(flat(frozen_slices_buf_, DType::U8, f.at + (from - lo), to - from),
               Tensor{static_cast<char*>(p.value.data) + (from - at), DType::U8, {to - from}, p.value.device});
  }
  frozen_ = Buffer{};  // (every frozen tensor on the device was packed)
  quantised_ = Buffer{};
  for (Parameter& p : params_)
    if (packed(p)) p.value = p.scale = Tensor{};
}

void ParameterStore::store_packed(Ops& ops, const Parameter& p, const uint8_t* span) {
  const FrozenSlice& f = frozen_slices_[size_t(p.group)];
  const int64_t at = packed_at_[size_t(&p - params_.data())], lo = int64_t(frozen_rank_) * f.chunk;
  const int64_t from = std::max(at, lo), to = std::min(at + storage_bytes(p), lo + f.chunk);
  if (to > from)
    ops.copy(flat(frozen_slices_buf_, DType::U8, f.at + (from - lo), to - from),
             Tensor{const_cast<uint8_t*>(span) + (from - at), DType::U8, {to - from}, Device::CPU});
}

void ParameterStore::upload_frozen_packed(Ops& ops, const Parameter& p, const float* host) {
  // The tensor's storage as allocate() would hold it (the compute dtype, rounded to nearest even, or the format's
  // codes and scales), then this rank's bytes of it.
  std::vector<uint8_t> span(size_t(storage_bytes(p)), 0);
  const size_t n = size_t(shape_numel(p.shape));
  if (p.format != WeightFormat::Dense) {
    const QuantisedLayout l = quantised_layout(p);
    quantise_on_host(p, host, span.data(), span.data() + l.scale_at);
  } else if (values_dtype_ == DType::F32) {
    std::memcpy(span.data(), host, n * 4);
  } else {
    SOLTRAIN_CHECK(values_dtype_ == DType::BF16, "frozen ", p.name, " in ", dtype_name(values_dtype_));
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = f32_to_bf16(host[i]);
      std::memcpy(span.data() + 2 * i, &b, 2);
    }
  }
  store_packed(ops, p, span.data());
}

bool ParameterStore::holds_cut(const StoreShards& cut) const {
  if (int(cut.owned.size()) != groups() || int(slices_.size()) != groups()) return false;
  for (int g = 0; g < groups(); ++g) {
    const Slice& s = slices_[size_t(g)];
    if (s.begin != cut.owned[size_t(g)].first || s.end != cut.owned[size_t(g)].second ||
        s.chunk != cut.chunk[size_t(g)])
      return false;
  }
  if (cut.frozen_chunk.empty()) return !frozen_sharded();
  if (int(frozen_slices_.size()) != groups() || frozen_rank_ != cut.rank) return false;
  for (int g = 0; g < groups(); ++g)
    if (frozen_slices_[size_t(g)].chunk != cut.frozen_chunk[size_t(g)]) return false;
  return true;
}

Tensor ParameterStore::frozen_shard(int group) const {
  const FrozenSlice& f = frozen_slices_.at(size_t(group));
  return flat(frozen_slices_buf_, DType::U8, f.at, f.chunk);
}

void ParameterStore::bind_frozen_packed(int group, const Tensor& bytes) {
  SOLTRAIN_CHECK(frozen_sharded() && (!bytes.data || bytes.dtype == DType::U8), "bind_frozen_packed");
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    if (p.group != group || !packed(p)) continue;
    if (!bytes.data) {
      p.value = p.scale = Tensor{};
      continue;
    }
    SOLTRAIN_CHECK(packed_at_[i] + storage_bytes(p) <= bytes.numel(), "binding frozen group ", group, " to ",
                   bytes.numel(), " bytes");
    bind_storage(p, static_cast<char*>(bytes.data) + packed_at_[i], bytes.device);
  }
}

Tensor ParameterStore::host_copy(const Parameter& p) const {
  const int64_t at = frozen_host_at_[size_t(&p - params_.data())];
  return flat(frozen_host_, values_dtype_, at, shape_numel(p.shape)).view(p.shape);
}

bool ParameterStore::frozen_group_on_host(int group) const {
  return group >= 0 && group < int(frozen_host_range_.size()) &&
         frozen_host_range_[size_t(group)].second > frozen_host_range_[size_t(group)].first;
}

Tensor ParameterStore::frozen_on_host(int group) const {
  SOLTRAIN_CHECK(frozen_group_on_host(group), "group ", group, " is not in host memory");
  const auto [b, e] = frozen_host_range_[size_t(group)];
  return flat(frozen_host_, values_dtype_, b, e - b);
}

int64_t ParameterStore::max_frozen_host_group_numel() const {
  int64_t m = 0;
  for (const auto& [b, e] : frozen_host_range_) m = std::max(m, e - b);
  return m;
}

void ParameterStore::bind_frozen(int group, const Tensor& base) {
  const Tensor home = frozen_on_host(group);
  SOLTRAIN_CHECK(!base.data || (base.numel() >= home.numel() && base.dtype == home.dtype), "binding frozen group ",
                 group, " to ", base.numel(), " elements");
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    if (p.group != group || frozen_host_at_[i] < 0) continue;
    if (!base.data) {
      p.value = host_copy(p);
      continue;
    }
    const size_t at = size_t(frozen_host_at_[i] - frozen_host_range_[size_t(group)].first) * dtype_size(base.dtype);
    p.value = Tensor{static_cast<char*>(base.data) + at, base.dtype, p.shape, base.device};
  }
}

void ParameterStore::bind(int group, const Tensor& base, Tensor Parameter::*member) {
  SOLTRAIN_CHECK(!base.data || base.numel() >= group_numel(group), "binding group ", group, " to ", base.numel(),
                 " elements");
  if (member == &Parameter::grad && layer_grads_bound_only_ && group_begin(group) < host_grads_end_)
    bound_grads_.at(size_t(group)) = base;
  for (Parameter& p : params_) {
    if (!p.trainable || p.group != group) continue;
    if (!base.data) {
      p.*member = Tensor{};
      continue;
    }
    const size_t at = size_t(p.offset - group_begin(group)) * dtype_size(base.dtype);
    p.*member = Tensor{static_cast<char*>(base.data) + at, base.dtype, p.shape, base.device};
  }
}

}  // namespace soltrain
