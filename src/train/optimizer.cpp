#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace soltrain {

AdamW::AdamW(ParameterStore& params, Ops& ops) : params_(params), ops_(ops) {
  m_ = ops.alloc(size_t(params.numel()) * 4);
  v_ = ops.alloc(size_t(params.numel()) * 4);
}

void AdamW::step(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  ++step_;
  for (const ParamRange& r : params_.ranges()) {
    Tensor master = params_.masters(r);
    Tensor mt{static_cast<float*>(m_.data()) + r.offset, DType::F32, master.shape, ops_.device()};
    Tensor vt{static_cast<float*>(v_.data()) + r.offset, DType::F32, master.shape, ops_.device()};
    AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, r.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    p.grad_sumsq = grad_sumsq;
    p.max_grad_norm = cfg.max_grad_norm;
    Tensor copy = params_.values(r);
    ops_.adamw(master, params_.grads(r), mt, vt, p, params_.values_alias_masters() ? nullptr : &copy);
  }
}

namespace {
constexpr const char* kFormat = "soltrain-adamw-2";  // moments per parameter name
}  // namespace

void AdamW::save(const std::filesystem::path& file) const {
  // Named per parameter, so the file does not depend on how the flat buffers are laid out; each tensor is
  // fetched from the device as the file is written (the moments are never all in host memory).
  std::vector<StreamedTensor> tensors;
  for (const Parameter& p : params_.all())
    if (p.trainable)
      for (auto [prefix, buf] : {std::pair{"exp_avg.", &m_}, std::pair{"exp_avg_sq.", &v_}})
        tensors.push_back(
            {prefix + p.name, DType::F32, p.shape, [this, &p, buf](void* dst) {
               const Tensor src{static_cast<float*>(buf->data()) + p.offset, DType::F32, p.shape, ops_.device()};
               ops_.copy(Tensor{dst, DType::F32, p.shape, Device::CPU}, src);
             }});
  write_safetensors_streamed(file, tensors, {{"step", std::to_string(step_)}, {"format", kFormat}});
}

void AdamW::load(const std::filesystem::path& file) {
  const SafetensorsFile f(file);
  auto meta = [&](const std::string& k) {
    const auto it = f.metadata().find(k);
    if (it == f.metadata().end()) user_error(file.string(), ": optimizer state has no '", k, "' in its metadata");
    return it->second;
  };
  std::vector<float> m(size_t(params_.numel())), v(m.size());
  if (meta("format") == kFormat) {
    for (const Parameter& p : params_.all())
      if (p.trainable)
        for (auto [prefix, host] : {std::pair{"exp_avg.", &m}, std::pair{"exp_avg_sq.", &v}})
          read_as_f32(f.at(prefix + p.name), p.shape, host->data() + p.offset, file.string() + ": " + prefix + p.name);
  } else {
    // The first format: two flat tensors laid out [every decayed parameter | the rest], each in model order.
    if (meta("decayed_numel") != std::to_string(params_.decayed_numel()))
      user_error(file.string(), ": optimizer state was saved for another model (parameter layout differs)");
    const Shape flat{params_.numel()};
    std::vector<float> fm(m.size()), fv(m.size());
    read_as_f32(f.at("exp_avg"), flat, fm.data(), file.string() + ": exp_avg");
    read_as_f32(f.at("exp_avg_sq"), flat, fv.data(), file.string() + ": exp_avg_sq");
    int64_t off[2] = {0, params_.decayed_numel()};
    for (const Parameter& p : params_.all()) {
      if (!p.trainable) continue;
      int64_t& o = off[p.decay ? 0 : 1];
      const int64_t n = shape_numel(p.shape);
      std::copy_n(fm.begin() + o, n, m.begin() + p.offset);
      std::copy_n(fv.begin() + o, n, v.begin() + p.offset);
      o += n;
    }
  }
  const Shape shape{params_.numel()};
  ops_.copy(Tensor{m_.data(), DType::F32, shape, ops_.device()}, Tensor{m.data(), DType::F32, shape, Device::CPU});
  ops_.copy(Tensor{v_.data(), DType::F32, shape, ops_.device()}, Tensor{v.data(), DType::F32, shape, Device::CPU});
  try {
    step_ = std::stoi(meta("step"));
  } catch (const std::exception&) {
    user_error(file.string(), ": optimizer step \"", meta("step"), "\" is not a number");
  }
}

}  // namespace soltrain
