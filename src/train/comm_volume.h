// What one rank of a data-parallel run sends over the network per update, collective by collective, from the
// shard plan the run itself cuts (train/data_parallel.h) and the calls its stage makes (train/zero3.h for
// stage 3's gathers): what `bench --plan-only --gpus N --nodes M` prints, with the time those bytes take at a
// link's bandwidth. Ring collectives: an all-gather or a reduce-scatter of a group sends (N - 1) chunks per rank,
// an all-reduce of n elements 2 (N - 1) / N · n. Bytes sent equal bytes received.
#pragma once
#include <cstddef>
#include <cstdint>

#include "train/data_parallel.h"

namespace soltrain {

struct CommVolume {
  // Bytes one rank sends per update, by collective.
  double all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  int64_t all_gathers = 0, reduce_scatters = 0, all_reduces = 0;  // how many calls
  double total() const { return all_gather + reduce_scatter + all_reduce; }
};

// `head`: the embedding/final norm/LM head group (stage 3 keeps it gathered for a pass); `micro_batches` per
// update; `value_bytes`: the compute copy's element size (stage 3 gathers it; stages 1-2 gather fp32 masters).
// Stage 3 over a sharded frozen base (plan.frozen_chunk) gathers its bytes with each gather of their group.
// The two scalar all-reduces every update makes (the loss and, sharded, Σg²) are counted too.
CommVolume comm_volume(const ShardPlan& plan, int zero_stage, int head, int micro_batches, size_t value_bytes);

}  // namespace soltrain
