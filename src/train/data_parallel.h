// Data parallel over a Communicator with ZeRO stages 0-3 (DeepSpeed's meaning). Every rank holds the whole
// model; a parameter group's elements [begin, begin + n) are split into `size` chunks of ceil(n / size), and
// rank r owns chunk r of every group. Stage 0: gradients all-reduced, every rank updates everything.
// Stage 1: gradients all-reduced, each rank updates (and keeps AdamW moments for) only what it owns, then
// the groups are all-gathered. Stage 2: each group's gradients are reduce-scattered as soon as backward
// finishes the group (LayerHooks::grads_ready of the update's last micro-batch), so a rank receives only
// the sums it owns; then as stage 1. Stage 3: the weights' compute copy, the masters and the gradients are
// sharded too, and a group is made whole only around its use (train/zero3.h). The reductions are queued on
// Ops::Stream::Side after Main's work.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/buffer.h"
#include "dist/communicator.h"
#include "model/transformer.h"
#include "train/optimizer.h"
#include "train/zero3.h"

namespace soltrain {

// Which elements of the flat trainable buffers a rank owns (and, under ZeRO-3, which bytes of the frozen base).
// With low-bit moments (train/optimizer.h) a group's chunk may be longer than ceil(numel / size): see
// make_shard_plan.
struct ShardPlan {
  struct Group {
    int64_t begin = 0, numel = 0, chunk = 0;  // chunk >= ceil(numel / size)
  };
  std::vector<Group> groups;
  std::vector<ParamRange> owned;  // ParameterStore::ranges() cut to the owned chunks, in order
  int rank = 0, size = 1;
  // ZeRO-3 over a frozen base on more than one rank: per group the bytes of each rank's slice of its packed frozen
  // weights (ParameterStore::frozen_packed_bytes), 0 where it packs none; empty: the base stays whole on every rank.
  std::vector<int64_t> frozen_chunk;
  // [begin, end) of group g owned by this rank (empty when the group is smaller than size chunks).
  std::pair<int64_t, int64_t> owned_span(int g) const;
  int64_t frozen_chunk_of(int g) const { return frozen_chunk.empty() ? 0 : frozen_chunk[size_t(g)]; }
};
// The frozen chunks of groups whose packed frozen weights take `packed` bytes each, over `size` ranks: an even
// split rounded up to 256 bytes (each slice starts aligned); none at all for one rank (nothing to share).
std::vector<int64_t> frozen_chunks(const std::vector<int64_t>& packed, int size);
// ZeRO-3's cut of a store as the plan makes it (its frozen chunks included): what Zero3 keeps of a loaded store.
StoreShards store_cut(const ShardPlan& plan);
// The cut of laid-out `ps` that DataParallel's ZeRO-3 makes for `rank` of `size` with the optimizer's `moments`
// and compute dtype `act`: a store allocated with it (StoreOptions::shards) is loaded by slices, the whole model
// never held on one rank, and Zero3 finds it already cut.
// `shard_frozen` false: the frozen base stays whole (a rank holding only its share of the experts' base weights,
// expert parallelism over LoRA: the ranks' frozen bytes are not one base, so they cannot be gathered as one).
StoreShards zero3_cut(const ParameterStore& ps, int rank, int size, Moments moments, DType act, bool shard_frozen);
// `store` cut so (StoreOptions::shards) for this rank of `comm`: how a ZeRO-3 run (sft, bench) loads its model.
StoreOptions sliced_for_zero3(StoreOptions store, const Communicator& comm, Moments moments, bool shard_frozen);
// `moments`: the optimizer's. Low-bit moments are blocks from each parameter's first element, so a cut inside
// a parameter that keeps them must fall on one of its block boundaries: then each rank's pieces hold exactly
// the single process's blocks (and their absmax), and the sharded update is its bits.
ShardPlan make_shard_plan(const ParameterStore& params, int rank, int size, Moments moments = Moments::F32);

class DataParallel final : public LayerHooks {
 public:
  // Stage 3 shards the model's parameters at once, unless the store was loaded by its slices already (zero3_cut).
  // `opt`: the optimizer's
  // settings (its moments decide the shard plan's cuts; offload_master the gathers' staging).
  DataParallel(Transformer& model, Communicator& comm, int zero_stage, const OptimizerConfig& opt = {});
  // Stages 1-2: the staging buffers' bytes the constructor allocates (for groups whose collectives cannot run
  // in place: every group when the masters live in host memory), given whether the communicator works in place.
  static size_t staging_bytes(const ShardPlan& plan, int zero_stage, bool comm_in_place, bool host_masters = false);
  int zero_stage() const { return stage_; }
  const ShardPlan& plan() const { return plan_; }
  Zero3* zero3() { return zero3_.get(); }  // stage 3's weights and gradients (null below it)
  const Zero3* zero3() const { return zero3_.get(); }

  // Before the update's last micro-batch with targets: its backward reduces each group as it finishes.
  // (Stage 3 reduces every micro-batch's gradients: it keeps no full gradient to accumulate in.)
  void arm() { armed_ = true; }
  // An update begins (TrainStep zeroed the gradients).
  void begin_update() {
    if (zero3_) zero3_->begin_update();
  }
  // Stage 3, for a micro-batch this rank skips (no targets): joins the collectives its pass would make.
  void idle_pass() {
    if (zero3_) zero3_->idle_pass();
  }
  // After the micro-batches: reduces the groups backward did not (a rank whose last micro-batches had no
  // targets), in the order backward would have, so every rank calls the same collectives. Main then waits.
  void finish_gradients();
  // Σg² of the reduced gradients (F64 [1], device), equal on every rank (stages 2-3: summed over the shards).
  void grad_sumsq(Tensor out);
  // Stages 1-2, after the sharded update: every rank gets every group's new weights from their owners.
  // Queued on Side group by group in forward's order and left in flight: the next forward waits for each
  // group's gather just before the group is used (before_forward / before_backward), so the gathers overlap
  // the next step's compute. Anything else that reads the weights calls settle() first. Stage 3: the
  // gathered copies are stale; each group is gathered again just before its next use.
  void gather_weights();
  // Main waits for every gather still in flight (before a checkpoint, an evaluation, the final save).
  // Stage 3 keeps no whole weights to wait for: writing or reading a checkpoint goes through zero3().
  void settle();
  // Σ loss over ranks into `sum` (F64 [1], device; in place).
  void all_reduce(Tensor t);
  // The largest over ranks, element by element (F32, device; in place): the FP8 amax histories.
  void all_reduce_max(Tensor t);

  void grads_ready(int group) override;
  void before_forward(int group) override { zero3_ ? zero3_->before_forward(group) : await_gather(group); }
  void before_backward(int group) override { zero3_ ? zero3_->before_backward(group) : await_gather(group); }

 private:
  static int64_t staged_chunk(const ShardPlan& plan, int zero_stage, bool comm_in_place, bool host_masters);
  void on_side_between(const std::function<void()>& collective);
  void reduce_group(int g);
  Tensor scratch(int64_t elements, int which);
  bool in_place(const ShardPlan::Group& gr) const;
  void gather_group(int g);
  void await_gather(int g);

  Transformer& model_;
  Communicator& comm_;
  Ops& ops_;
  int stage_;
  ShardPlan plan_;
  bool host_masters_ = false;  // offload_master: staging sized for gathering every group through it
  bool armed_ = false;
  std::vector<bool> reduced_;
  std::vector<uint64_t> gathered_;  // per group: the Side mark after its gather still awaited (0: none)
  Buffer stage_in_, stage_out_;     // staging for collectives not in place (size × the largest such chunk)
  std::unique_ptr<Zero3> zero3_;
};

}  // namespace soltrain
