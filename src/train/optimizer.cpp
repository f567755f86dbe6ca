#include "train/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace soltrain {

GradNorm grad_norm(Ops& ops, const ParameterStore& params, float max_norm) {
  const double norm = std::sqrt(ops.sum_squares(params.all_grads()));
  const double coef = max_norm > 0 ? double(max_norm) / (norm + 1e-6) : 1.0;
  return {norm, coef < 1.0 ? float(coef) : 1.0f};
}

AdamW::AdamW(ParameterStore& params, Ops& ops) : params_(params), ops_(ops) {
  m_ = ops.alloc(size_t(params.numel()) * 4);
  v_ = ops.alloc(size_t(params.numel()) * 4);
}

void AdamW::step(const OptimizerConfig& cfg, float lr, float grad_scale) {
  ++step_;
  float* m = static_cast<float*>(m_.data());
  float* v = static_cast<float*>(v_.data());
  const int64_t n_decay = params_.masters(true).numel();
  for (bool decayed : {true, false}) {
    Tensor master = params_.masters(decayed);
    if (master.numel() == 0) continue;
    const int64_t off = decayed ? 0 : n_decay;
    Tensor mt{m + off, DType::F32, master.shape, ops_.device()}, vt{v + off, DType::F32, master.shape, ops_.device()};
    const AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, decayed ? cfg.weight_decay : 0.0f, step_, grad_scale};
    Tensor copy = params_.values(decayed);
    ops_.adamw(master, params_.grads(decayed), mt, vt, p, params_.values_alias_masters() ? nullptr : &copy);
  }
}

void AdamW::save(const std::filesystem::path& file) const {
  const Shape shape{params_.numel()};
  std::vector<float> m(size_t(params_.numel())), v(m.size());
  ops_.copy(Tensor{m.data(), DType::F32, shape, Device::CPU}, Tensor{m_.data(), DType::F32, shape, ops_.device()});
  ops_.copy(Tensor{v.data(), DType::F32, shape, Device::CPU}, Tensor{v_.data(), DType::F32, shape, ops_.device()});
  write_safetensors(file,
                    {{"exp_avg", Tensor{m.data(), DType::F32, shape, Device::CPU}},
                     {"exp_avg_sq", Tensor{v.data(), DType::F32, shape, Device::CPU}}},
                    {{"step", std::to_string(step_)},
                     {"decayed_numel", std::to_string(params_.masters(true).numel())},
                     {"format", "soltrain-adamw"}});
}

void AdamW::load(const std::filesystem::path& file) {
  const SafetensorsFile f(file);
  const Shape shape{params_.numel()};
  auto meta = [&](const std::string& k) {
    const auto it = f.metadata().find(k);
    if (it == f.metadata().end()) user_error(file.string(), ": optimizer state has no '", k, "' in its metadata");
    return it->second;
  };
  if (meta("decayed_numel") != std::to_string(params_.masters(true).numel()))
    user_error(file.string(), ": optimizer state was saved for another model (parameter layout differs)");
  std::vector<float> host(size_t(params_.numel()));
  for (auto [name, buf] : {std::pair{"exp_avg", &m_}, std::pair{"exp_avg_sq", &v_}}) {
    read_as_f32(f.at(name), shape, host.data(), file.string() + ": " + name);
    ops_.copy(Tensor{buf->data(), DType::F32, shape, ops_.device()},
              Tensor{host.data(), DType::F32, shape, Device::CPU});
  }
  try {
    step_ = std::stoi(meta("step"));
  } catch (const std::exception&) {
    user_error(file.string(), ": optimizer step \"", meta("step"), "\" is not a number");
  }
}

}  // namespace soltrain
