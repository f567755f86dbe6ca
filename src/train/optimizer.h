// AdamW over a ParameterStore (torch semantics), with global-norm gradient clipping folded into the update.
#pragma once
#include <filesystem>
#include <optional>
#include <vector>

#include "model/parameters.h"

namespace soltrain {

struct OptimizerConfig {
  float lr = 1e-5f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float max_grad_norm = 1.0f;  // <= 0 disables clipping
};

class AdamW {
 public:
  AdamW(ParameterStore& params, Ops& ops);
  // ZeRO-1/2: moments (and updates) for `shard` only, ranges of the flat buffers (data_parallel.h).
  AdamW(ParameterStore& params, Ops& ops, std::vector<ParamRange> shard);
  bool sharded() const { return shard_.has_value(); }
  // One update with learning rate `lr` (the schedule's value for this step), gradients read times
  // `grad_scale`, and times clipping's factor (torch's clip_grad_norm_, kernels/ops.h clip_factor) computed
  // on the device from `grad_sumsq` (F64 [1], Σg²) when given: nothing waits for the host between backward
  // and the update, and no pass scales the gradients (a separate one cost 10.6 ms of a 310 ms Qwen3-4B step).
  void step(const OptimizerConfig& cfg, float lr, float grad_scale = 1.0f, const Tensor* grad_sumsq = nullptr);
  int steps_done() const { return step_; }

  // The state as a safetensors file: fp32 `exp_avg.<name>` and `exp_avg_sq.<name>` per trainable parameter
  // and the step count in the metadata. load() also reads the first format (two flat tensors).
  // A sharded optimizer saves its shard: flat `exp_avg` / `exp_avg_sq` with the ranges they hold (offsets
  // into the flat buffers) and a fingerprint of that layout in the metadata.
  void save(const std::filesystem::path& file) const;
  void load(const std::filesystem::path& file);
  // Reads one full file or a set of shard files (any number of ranks) and keeps what this one holds.
  void load(const std::vector<std::filesystem::path>& files);

 private:
  ParameterStore& params_;
  Ops& ops_;
  Buffer m_, v_;  // laid out like the parameters' flat buffers, or the shard's ranges one after another
  std::optional<std::vector<ParamRange>> shard_;
  int step_ = 0;
};

}  // namespace soltrain
