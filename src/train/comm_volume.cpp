#include "train/comm_volume.h"

#include <algorithm>

namespace soltrain {

CommVolume comm_volume(const ShardPlan& plan, int zero_stage, int head, int micro_batches, size_t value_bytes) {
  CommVolume v;
  const double n = plan.size, others = n - 1;
  auto gather = [&](double chunk_bytes, int times) {
    v.all_gather += others * chunk_bytes * times;
    v.all_gathers += times;
  };
  auto scatter = [&](const ShardPlan::Group& g, int times) {
    v.reduce_scatter += others * double(g.chunk) * 4 * times;
    v.reduce_scatters += times;
  };
  auto reduce = [&](double elements, size_t bytes) {
    v.all_reduce += 2 * others / n * elements * double(bytes);
    ++v.all_reduces;
  };
  const int layers = int(plan.groups.size()) - 1;
  for (int g = 0; g <= layers; ++g) {
    const ShardPlan::Group& gr = plan.groups[size_t(g)];
    const bool trained = gr.numel > 0;  // (nothing trains in a LoRA run's embedding and head)
    const int64_t frozen = plan.frozen_chunk_of(g);
    if (trained && zero_stage < 2) reduce(double(gr.numel), 4);  // the last micro-batch's gradients
    if (trained && zero_stage == 2) scatter(gr, 1);
    if (trained && (zero_stage == 1 || zero_stage == 2)) gather(double(gr.chunk) * 4, 1);  // the updated fp32 masters
    if (zero_stage != 3 || (!trained && frozen == 0)) continue;
    if (trained) scatter(gr, micro_batches);  // every micro-batch's gradients
    // The head group is gathered once, kept for the update's passes. Forward gathers every layer the first pass;
    // after it two layer buffers hold the last two layers, so backward gathers the others, and every later pass
    // finds the two its predecessor left (Zero3's slots). A sharded frozen base's bytes go with each gather.
    const int again = g < layers - 2 ? 1 : 0, first_again = g < 2 ? 0 : 1;
    const int times = g == head ? 1 : 1 + again + (micro_batches - 1) * (first_again + again);
    if (trained) gather(double(gr.chunk) * double(value_bytes), times);
    if (frozen) gather(double(frozen), times);
  }
  reduce(1, 8);                       // the loss sum (F64)
  if (zero_stage >= 2) reduce(1, 8);  // Σg² over the shards
  return v;
}

}  // namespace soltrain
