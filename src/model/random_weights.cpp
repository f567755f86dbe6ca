#include "model/random_weights.h"

#include <algorithm>
#include <random>
#include <vector>

#include "model/config.h"
#include "model/lora.h"

namespace soltrain {

namespace {
// transformers' rule for what is not drawn: RMSNorm scales ones, biases zeros
bool fixed_value(const Parameter& p, float& value) {
  if (p.shape.size() != 1) return false;
  value = p.name.ends_with("norm.weight") ? 1.0f : 0.0f;
  return true;
}
}  // namespace

std::unique_ptr<Transformer> random_pretrained(const std::filesystem::path& dir, Ops& ops,
                                               std::optional<LoraConfig> lora, StoreOptions store, uint64_t seed) {
  ModelConfig config = load_model_config(dir);
  const auto range = config.raw.find("initializer_range");
  const float std_dev = range != config.raw.end() && range->is_number() ? range->get<float>() : 0.02f;
  auto model = std::make_unique<Transformer>(std::move(config), ops, std::move(lora), store);
  // One pool of 2^22 normals (16 MiB), tiled: drawing each of 30 billion weights would take minutes.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, std_dev);
  std::vector<float> pool(size_t(1) << 22), staging;
  for (float& x : pool) x = normal(rng);
  for (Parameter& p : model->params().all()) {
    if (is_lora_name(p.name)) continue;  // the adapters' own initialisation, as a run's
    staging.resize(size_t(shape_numel(p.shape)));
    if (float value; fixed_value(p, value)) {
      std::fill(staging.begin(), staging.end(), value);
    } else {
      size_t at = size_t(rng() % pool.size());
      for (size_t done = 0; done < staging.size();) {
        const size_t n = std::min(staging.size() - done, pool.size() - at);
        std::copy_n(pool.begin() + ptrdiff_t(at), n, staging.begin() + ptrdiff_t(done));
        done += n, at = 0;
      }
    }
    model->params().upload(ops, p, staging.data());
  }
  return model;
}

void init_weights(Transformer& model, uint64_t seed) {
  const ModelConfig& c = model.config();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, float(c.initializer_range));
  std::vector<float> staging;
  for (Parameter& p : model.params().all()) {
    if (is_lora_name(p.name)) continue;
    staging.resize(size_t(shape_numel(p.shape)));
    if (float value; fixed_value(p, value)) {
      std::fill(staging.begin(), staging.end(), value);
    } else {
      for (float& x : staging) x = normal(rng);
      if (p.name == "model.embed_tokens.weight" && c.padding_idx >= 0 && c.padding_idx < p.shape[0])
        std::fill_n(staging.begin() + ptrdiff_t(int64_t(c.padding_idx) * p.shape[1]), p.shape[1], 0.0f);
    }
    model.params().upload(model.ops(), p, staging.data());
  }
}

}  // namespace soltrain
