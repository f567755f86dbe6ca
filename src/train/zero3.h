// ZeRO stage 3's weights and gradients (train/data_parallel.h runs it): every rank keeps only its slice of
// each parameter group (ParameterStore::keep_shards: masters, compute copy, gradients), and a group is made
// whole just for its use. Before a layer's forward, and again before its backward (recompute included), its
// compute copy is all-gathered into one of two layer buffers and bound to the parameters (Parameter::value),
// while the next layer in that pass's order is gathered into the other one (prefetch); a buffer is reused
// only after Main's reads of the layer it held. The group of the embedding, final norm and LM head has a
// buffer of its own: it is read at both ends of forward (the embedding, then the norm and head) and of
// backward (the head and norm, then the embedding's gradient), so it stays gathered for the pass.
// Each micro-batch's gradients of a group land in a scratch buffer the size of the group (two for the
// layers, alternating, so one is reduced while backward fills the other; one for the head group, whose
// gradients start in forward's fused LM-head pass), are reduce-scattered as soon as they are final, and the
// rank's own part goes to its gradient slice: no rank ever holds a full-size gradient buffer. The first
// micro-batch of an update reduces straight into the slice; later ones into a part that is added to it.
// A scratch is cleared on Side right after its reduction read it, so clearing costs backward nothing.
// When a rank's slice is the whole group (world size 1) and the communicator works in place, the slices
// are the buffers: a group is gathered onto its own compute copy and backward accumulates straight into
// its gradient slice, over the micro-batches as the single process does, and every collective runs in
// place (NCCL then moves nothing). The hooks, streams, marks and collectives are the same calls; what the
// copies cost at world size 1 was an artefact of one rank (run 32: -10.9% on Qwen3-4B), and the step
// is the single process's bitwise.
// A frozen base (LoRA, QLoRA) on more than one rank is sharded the same way (ShardPlan::frozen_chunk): each rank
// keeps its slice of every group's packed frozen bytes (ParameterStore::keep_frozen_shards: bf16 values, or NF4 /
// FP8 codes with their scales, gathered in the format they are stored in), and a group's gather brings them
// whole into a frozen buffer beside its slot's, bound for the same span. Frozen weights have no gradients, so a
// group with nothing trainable (a LoRA run's embedding and head) is gathered and never reduced.
// All of it is queued on Ops::Stream::Side and ordered with marks; the CPU runs it all at once.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "dist/communicator.h"
#include "model/parameters.h"

namespace soltrain {

struct ShardPlan;

class Zero3 {
 public:
  // Shards `ps` (the loaded model whole) by `plan`, or takes it as loaded by those slices (ParameterStore's
  // StoreOptions::shards with zero3_cut); `head` is the embedding/head group.
  Zero3(ParameterStore& ps, Ops& ops, Communicator& comm, const ShardPlan& plan, int head);

  // The LayerHooks of a pass, in the model's order (transformer.h).
  void before_forward(int g);
  void before_backward(int g);
  void grads_ready(int g);
  // An update begins (its gradient slices were zeroed): each group's first reduction writes its slice.
  void begin_update();
  // The collectives of one micro-batch's forward and backward, with zero gradients: a rank whose micro-batch
  // has no targets (and so runs no pass) still joins every gather and reduction the others make.
  void idle_pass();
  // After the optimizer wrote the slices: every gathered copy is stale (the next use gathers again).
  void weights_changed();

  // Checkpoints and the final model, streamed: no rank ever holds the whole model. Rank 0's writers read each
  // trainable parameter through ParameterStore::download, which asks for its group (set_master_source): rank 0
  // announces the group to the others (a host max-reduction every rank joins), every rank takes part in its
  // gather, and rank 0 keeps it in a one-group host buffer bound as that group's masters until another is asked
  // for. The other ranks serve those gathers (serve_masters) until rank 0 ends the service (end_masters).
  // Alone (world size 1, in place) the slices are the groups: they are bound as they are, nothing is gathered.
  void begin_masters();  // rank 0
  void serve_masters();  // every other rank, while rank 0 writes
  void end_masters();    // rank 0, once its writers are done
  // Loading a checkpoint: the readers write each rank's own parts into its slices (ParameterStore::upload and
  // upload_owned; model/checkpoint.h reads only those bytes), so no rank holds the whole model. Call this first:
  // no gather still reads the slices, and every gathered copy is stale.
  void before_loading();

  // Bytes this rank holds persistently (slices) and as per-pass buffers, for the memory plan and tests.
  struct Bytes {
    int64_t held_elements = 0, trainable_elements = 0;  // Σ slices vs the model's trainable elements
    size_t gathered = 0, grad_scratch = 0;  // the gather buffers (frozen ones too); gradient scratch + reduce staging
    size_t frozen_held = 0, frozen_gathered = 0;  // the frozen base's slices and its gather buffers (0: not sharded)
  };
  Bytes bytes() const;
  // The per-pass buffers' elements (one layer buffer, the head group's, a reduced part) as the constructor
  // allocates them for `plan` (`whole`: one rank in place, none), and their bytes with compute copies of
  // `value_bytes` each: what `bench --plan-only` prints before anything is allocated.
  struct BufferElements {
    int64_t layer = 0, head = 0, part = 0;
    int64_t frozen_layer = 0, frozen_head = 0;  // bytes: a layer's and the head group's packed frozen weights, gathered
  };
  static BufferElements buffer_elements(const ShardPlan& plan, int head, bool whole);
  static Bytes planned(const ShardPlan& plan, int head, size_t value_bytes, bool whole);

 private:
  struct Slot {
    int group = -1;       // the group it holds (-1: none, or stale)
    uint64_t ready = 0;   // Side mark after its gather
    bool awaited = true;  // Main has waited for `ready`
    uint64_t used = 0;    // when it was last needed (picks which to reuse)
  };
  bool untrained(int g) const;          // nothing of group g trains: no gradients to reduce
  bool empty(int g) const;              // nothing of group g to gather either
  int next(int g, bool forward) const;  // the group after g in a pass's order (-1: none)
  void ensure(int g);                   // g's weights whole and bound, Main ordered after their gather
  void prefetch(int g);                 // g's gather queued (into a buffer not holding the current group)
  Slot& gather(int g);
  Tensor slot_tensor(int s, int64_t n) const;
  Tensor grad_scratch(int g) const;  // where group g's gradients of one micro-batch land (whole_: its slice)
  void gather_masters(int g);        // every rank: group g's masters whole; rank 0 keeps them in host_group_

  ParameterStore& ps_;
  Ops& ops_;
  Communicator& comm_;
  const ShardPlan& plan_;
  int head_, current_ = -1;
  bool whole_;  // world size 1 in place: the slices are the gather and gradient buffers (see above)
  uint64_t clock_ = 0;
  Slot slots_[3];  // two for the layers, the third for the head group
  Buffer gathered_[3];
  Buffer frozen_gathered_[3];        // the frozen base's bytes of the group each slot holds (a sharded base only)
  Buffer grads_[3];                  // scratch: layers g % 2, then the head group's
  uint64_t reduced_[3] = {0, 0, 0};  // Side mark after the last reduction that read each scratch
  int grad_bound_[2] = {-1, -1};     // the layer whose gradients each layer scratch holds
  Buffer reduced_part_;              // one rank's part of a reduce-scatter (the largest chunk)
  std::vector<bool> in_slice_;       // a group's reduced gradients of this update are in its slice
  Buffer host_group_;                // rank 0's one group of masters while a checkpoint is written
  int streamed_ = -1;                // the group bound there (-1: none)
};

}  // namespace soltrain
