// Early stopping on the validation loss, as transformers' EarlyStoppingCallback with metric_for_best_model "loss"
// (Axolotl's early_stopping_patience): an evaluation improves on the best so far when its loss is lower by more
// than early_stopping_threshold; `patience` evaluations in a row that do not stop the run. The best loss and its
// step are kept as the Trainer keeps best_metric (any lower loss, threshold or not), for load_best_model_at_end.
// The evaluation before the first update is not counted (the Trainer makes none).
#pragma once
#include <cmath>
#include <cstdint>

namespace soltrain {

// What a checkpoint keeps of it, so a resumed run stops where the uninterrupted one would.
struct BestEval {
  double loss = NAN;     // NaN: no evaluation yet
  int64_t step = 0;      // the update whose evaluation gave `loss`
  int without_gain = 0;  // evaluations since the last one that improved by more than the threshold
};

class EarlyStopping {
 public:
  // patience 0: never stops (the best is still tracked, for load_best_model_at_end).
  EarlyStopping(int patience, double threshold) : patience_(patience), threshold_(threshold) {}
  // After the evaluation at update `step` gave `loss` (NaN counts as no gain): whether to stop now.
  bool after_eval(int64_t step, double loss, BestEval& best) const;

 private:
  int patience_;
  double threshold_;
};

}  // namespace soltrain
