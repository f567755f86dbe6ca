#include "train/early_stopping.h"

namespace soltrain {

bool EarlyStopping::after_eval(int64_t step, double loss, BestEval& best) const {
  // The callback compares against the best before this evaluation (the Trainer updates it after the callbacks).
  const bool first = std::isnan(best.loss);
  const bool gain = first || (loss < best.loss && std::fabs(loss - best.loss) > threshold_);
  best.without_gain = gain ? 0 : best.without_gain + 1;
  if (first ? !std::isnan(loss) : loss < best.loss) {
    best.loss = loss;
    best.step = step;
  }
  return patience_ > 0 && best.without_gain >= patience_;
}

}  // namespace soltrain
