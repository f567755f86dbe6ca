#include "train/trainer.h"

#include <chrono>

#include "train/train_step.h"

namespace soltrain {

TrainHistory train_on_batch(Transformer& model, const HostBatch& batch, const OptimizerConfig& opt, int steps,
                            const std::function<void(const StepLog&)>& on_step) {
  model.plan(batch.rows, batch.seq_len);
  TrainStep step(model, opt);
  TrainHistory h;
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    step.run({&batch, 1}, opt.lr);
    h.losses.push_back(step.loss());
    h.grad_norms.push_back(step.grad_norm());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_step) on_step({s, h.losses.back(), h.grad_norms.back(), dt});
  }
  h.losses.push_back(model.step(batch, /*backward=*/false).loss);
  return h;
}

}  // namespace soltrain
