#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace soltrain {

AdamW::AdamW(ParameterStore& params, Ops& ops) : params_(params), ops_(ops) {
  m_ = ops.alloc(size_t(params.numel()) * 4);
  v_ = ops.alloc(size_t(params.numel()) * 4);
}

namespace {
int64_t total(const std::vector<ParamRange>& rs) {
  int64_t n = 0;
  for (const ParamRange& r : rs) n += r.numel;
  return n;
}
}  // namespace

AdamW::AdamW(ParameterStore& params, Ops& ops, std::vector<ParamRange> shard)
    : params_(params), ops_(ops), shard_(std::move(shard)) {
  const size_t n = size_t(std::max<int64_t>(1, total(*shard_)));
  m_ = ops.alloc(n * 4);
  v_ = ops.alloc(n * 4);
}

void AdamW::step(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  ++step_;
  int64_t local = 0;
  for (const ParamRange& r : shard_ ? *shard_ : params_.ranges()) {
    Tensor master = params_.masters(r);
    const int64_t at = shard_ ? local : r.offset;
    local += r.numel;
    Tensor mt{static_cast<float*>(m_.data()) + at, DType::F32, master.shape, ops_.device()};
    Tensor vt{static_cast<float*>(v_.data()) + at, DType::F32, master.shape, ops_.device()};
    AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, r.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    p.grad_sumsq = grad_sumsq;
    p.max_grad_norm = cfg.max_grad_norm;
    Tensor copy = params_.values(r);
    ops_.adamw(master, params_.grads(r), mt, vt, p, params_.values_alias_masters() ? nullptr : &copy);
  }
}

namespace {
constexpr const char* kFormat = "soltrain-adamw-2";             // moments per parameter name
constexpr const char* kShardFormat = "soltrain-adamw-shard-1";  // one rank's ranges of the flat moments
}  // namespace

// The flat layout a shard's offsets refer to: every trainable parameter's name, offset and size.
std::string layout_fingerprint(const ParameterStore& ps) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const Parameter& p : ps.all())
    if (p.trainable)
      for (char ch : cat(p.name, ":", p.offset, ":", shape_numel(p.shape), ";"))
        h = (h ^ uint8_t(ch)) * 1099511628211ull;
  return std::to_string(h);
}

void AdamW::save(const std::filesystem::path& file) const {
  if (shard_) {
    nlohmann::json ranges = nlohmann::json::array();
    for (const ParamRange& r : *shard_) ranges.push_back({r.offset, r.numel});
    const Shape shape{std::max<int64_t>(1, total(*shard_))};
    std::vector<StreamedTensor> tensors;
    for (auto [name, buf] : {std::pair{"exp_avg", &m_}, std::pair{"exp_avg_sq", &v_}})
      tensors.push_back({name, DType::F32, shape, [this, shape, buf](void* dst) {
                           ops_.copy(Tensor{dst, DType::F32, shape, Device::CPU},
                                     Tensor{buf->data(), DType::F32, shape, ops_.device()});
                         }});
    write_safetensors_streamed(file, tensors,
                               {{"step", std::to_string(step_)},
                                {"format", kShardFormat},
                                {"ranges", ranges.dump()},
                                {"numel", std::to_string(params_.numel())},
                                {"layout", layout_fingerprint(params_)}});
    return;
  }
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
  load(std::vector<std::filesystem::path>{file});
}

void AdamW::load(const std::vector<std::filesystem::path>& files) {
  SOLTRAIN_CHECK(!files.empty());
  std::vector<float> m(size_t(params_.numel())), v(m.size());
  std::string step_text;
  int64_t covered = 0;
  for (const std::filesystem::path& file : files) {
    const SafetensorsFile f(file);
    auto meta = [&](const std::string& k) {
      const auto it = f.metadata().find(k);
      if (it == f.metadata().end()) user_error(file.string(), ": optimizer state has no '", k, "' in its metadata");
      return it->second;
    };
    if (!step_text.empty() && meta("step") != step_text)
      user_error(file.string(), ": optimizer shard at step ", meta("step"), ", another at ", step_text);
    step_text = meta("step");
    covered += params_.numel();
    if (meta("format") == kShardFormat) {
      if (meta("numel") != std::to_string(params_.numel()) || meta("layout") != layout_fingerprint(params_))
        user_error(file.string(), ": optimizer shard was saved for another model (parameter layout differs)");
      covered -= params_.numel();
      std::vector<std::pair<int64_t, int64_t>> ranges;
      try {
        ranges = nlohmann::json::parse(meta("ranges")).get<std::vector<std::pair<int64_t, int64_t>>>();
      } catch (const nlohmann::json::exception&) {
        user_error(file.string(), ": malformed 'ranges' in its metadata");
      }
      int64_t n = 0;
      for (const auto& [off, len] : ranges) {
        if (off < 0 || len < 0 || off + len > params_.numel()) user_error(file.string(), ": range outside the model");
        n += len;
      }
      std::vector<float> fm(size_t(std::max<int64_t>(1, n))), fv(fm.size());
      read_as_f32(f.at("exp_avg"), Shape{int64_t(fm.size())}, fm.data(), file.string() + ": exp_avg");
      read_as_f32(f.at("exp_avg_sq"), Shape{int64_t(fv.size())}, fv.data(), file.string() + ": exp_avg_sq");
      int64_t local = 0;
      for (const auto& [off, len] : ranges) {
        std::copy_n(fm.begin() + local, len, m.begin() + off);
        std::copy_n(fv.begin() + local, len, v.begin() + off);
        local += len;
        covered += len;
      }
    } else if (meta("format") == kFormat) {
      for (const Parameter& p : params_.all())
        if (p.trainable)
          for (auto [prefix, host] : {std::pair{"exp_avg.", &m}, std::pair{"exp_avg_sq.", &v}})
            read_as_f32(f.at(prefix + p.name), p.shape, host->data() + p.offset,
                        file.string() + ": " + prefix + p.name);
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
  }
  if (covered != params_.numel())
    user_error(files[0].parent_path().string(), ": the optimizer shards hold ", covered, " of the model's ",
               params_.numel(), " moments (a shard file is missing or repeated)");
  if (shard_) {  // keep this rank's ranges
    int64_t local = 0;
    for (const ParamRange& r : *shard_) {
      const Shape s{r.numel};
      ops_.copy(Tensor{static_cast<float*>(m_.data()) + local, DType::F32, s, ops_.device()},
                Tensor{m.data() + r.offset, DType::F32, s, Device::CPU});
      ops_.copy(Tensor{static_cast<float*>(v_.data()) + local, DType::F32, s, ops_.device()},
                Tensor{v.data() + r.offset, DType::F32, s, Device::CPU});
      local += r.numel;
    }
  } else {
    const Shape shape{params_.numel()};
    ops_.copy(Tensor{m_.data(), DType::F32, shape, ops_.device()}, Tensor{m.data(), DType::F32, shape, Device::CPU});
    ops_.copy(Tensor{v_.data(), DType::F32, shape, ops_.device()}, Tensor{v.data(), DType::F32, shape, Device::CPU});
  }
  try {
    step_ = std::stoi(step_text);
  } catch (const std::exception&) {
    user_error(files[0].string(), ": optimizer step \"", step_text, "\" is not a number");
  }
}

}  // namespace soltrain
