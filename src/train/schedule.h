// Learning-rate schedules with the semantics of transformers' get_scheduler: the lr of optimizer update
// k (0-based) is base_lr × factor(k), so with warmup the first update runs at lr 0, as HF's does.
#pragma once
#include <cstdint>
#include <string>

namespace soltrain {

enum class ScheduleType { kConstant, kConstantWithWarmup, kLinear, kCosine, kWsd };
ScheduleType parse_schedule_type(const std::string& s);  // UserError listing the accepted names
std::string to_string(ScheduleType t);

struct ScheduleConfig {
  ScheduleType type = ScheduleType::kLinear;
  int64_t total_steps = 0, warmup_steps = 0;
  double decay_ratio = 0.1;  // wsd: the last decay_ratio × total_steps steps decay (cosine) to 0
  double min_lr_ratio = 0;   // cosine: decays to this fraction of the base lr (Axolotl's cosine_min_lr_ratio)
  // cosine: the warmup rises as (k / warmup)², the decay goes to 0 (Axolotl's
  // get_cosine_schedule_with_quadratic_warmup, which its lr_quadratic_warmup picks over a min_lr_ratio)
  bool quadratic_warmup = false;
};

// The multiplier of the base lr for update `step` (0-based), in [0, 1].
double lr_factor(const ScheduleConfig& s, int64_t step);

// HF's get_warmup_steps: ceil(total × ratio).
int64_t warmup_from_ratio(int64_t total_steps, double ratio);

}  // namespace soltrain
