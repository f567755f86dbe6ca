// The formulas are transformers' (optimization.py): _get_linear_schedule_with_warmup_lr_lambda,
// _get_cosine_schedule_with_warmup_lr_lambda (num_cycles 0.5) and _get_wsd_scheduler_lambda (cosine decay,
// min_lr_ratio 0), computed in double.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace soltrain {

ScheduleType parse_schedule_type(const std::string& s) {
  if (s == "constant") return ScheduleType::kConstant;
  if (s == "constant_with_warmup") return ScheduleType::kConstantWithWarmup;
  if (s == "linear") return ScheduleType::kLinear;
  if (s == "cosine") return ScheduleType::kCosine;
  if (s == "wsd" || s == "warmup_stable_decay") return ScheduleType::kWsd;
  user_error("lr_scheduler_type \"", s, "\": expected constant, constant_with_warmup, linear, cosine or wsd");
}

std::string to_string(ScheduleType t) {
  switch (t) {
    case ScheduleType::kConstant: return "constant";
    case ScheduleType::kConstantWithWarmup: return "constant_with_warmup";
    case ScheduleType::kLinear: return "linear";
    case ScheduleType::kCosine: return "cosine";
    case ScheduleType::kWsd: return "wsd";
  }
  return "?";
}

int64_t warmup_from_ratio(int64_t total_steps, double ratio) {
  return int64_t(std::ceil(double(total_steps) * ratio));
}

double lr_factor(const ScheduleConfig& s, int64_t step) {
  const double k = double(step), w = double(s.warmup_steps), total = double(s.total_steps);
  // HF's plain "constant" ignores warmup; every other schedule ramps linearly from 0.
  if (s.type == ScheduleType::kConstant) return 1.0;
  if (step < s.warmup_steps && s.quadratic_warmup && s.type == ScheduleType::kCosine)
    return (k / std::max(1.0, w)) * (k / std::max(1.0, w));
  if (step < s.warmup_steps) return k / std::max(1.0, w);
  switch (s.type) {
    case ScheduleType::kConstantWithWarmup: return 1.0;
    case ScheduleType::kLinear: return std::max(0.0, (total - k) / std::max(1.0, total - w));
    case ScheduleType::kCosine: {
      const double progress = (k - w) / std::max(1.0, total - w);
      const double scaling = std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress)));
      // Axolotl's get_cosine_schedule_with_min_lr (src/axolotl/utils/schedulers.py): the cosine between the
      // base lr and the floor.
      if (s.min_lr_ratio > 0 && !s.quadratic_warmup) return (1 - s.min_lr_ratio) * scaling + s.min_lr_ratio;
      return scaling;
    }
    case ScheduleType::kWsd: {
      // HF derives the stable length as total − warmup − decay when only the decay length is given.
      const int64_t decay = int64_t(std::ceil(total * s.decay_ratio));
      const int64_t stable = std::max<int64_t>(0, s.total_steps - s.warmup_steps - decay);
      if (step < s.warmup_steps + stable) return 1.0;
      if (step < s.warmup_steps + stable + decay) {
        const double progress = double(step - s.warmup_steps - stable) / std::max<double>(1.0, double(decay));
        return 0.5 * (1.0 + std::cos(std::numbers::pi * 2.0 * 0.5 * progress));
      }
      return 0.0;
    }
    default: return 1.0;
  }
}

}  // namespace soltrain
