#include "train/trainer.h"

#include <chrono>

namespace soltrain {

TrainHistory train_on_batch(Transformer& model, const HostBatch& batch, const OptimizerConfig& opt, int steps,
                            const std::function<void(const StepLog&)>& on_step) {
  Ops& ops = model.ops();
  model.plan(batch.rows, batch.seq_len);
  AdamW adamw(model.params(), ops);
  TrainHistory h;
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    ops.zero(model.params().all_grads());
    const StepResult r = model.step(batch, /*backward=*/true);
    const GradNorm g = grad_norm(ops, model.params(), opt.max_grad_norm);
    const double norm = g.norm;
    adamw.step(opt, opt.lr, g.clip_scale);
    h.losses.push_back(r.loss);
    h.grad_norms.push_back(norm);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_step) on_step({s, r.loss, norm, dt});
  }
  h.losses.push_back(model.step(batch, /*backward=*/false).loss);
  return h;
}

}  // namespace soltrain
