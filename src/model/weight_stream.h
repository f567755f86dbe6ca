// `offload_weights`: a frozen LoRA base's decoder layers live in pinned host memory
// (ParameterStore::keep_frozen_on_host) and pass through two device slots, a layer at a time, so the device
// holds two layers of the base instead of all of them (Qwen3-8B: 0.72 GiB instead of 14.1 GiB; the
// embedding, final norm and LM head stay resident). Some layers may stay resident too
// (`offload_weights_resident_layers`): the streamed ones are then spread evenly over the depth, so each copy
// overlaps the compute of the resident layers before it. The Transformer calls this where its layer hooks
// fire: before a layer's weights are first read in forward, and before its backward (recompute included).
// A call for a streamed layer makes sure it is in a slot, Main ordered after its copy; every call queues the
// copy of the next streamed layer the pass reads into the other slot on Ops::Stream::Upload, where it overlaps
// compute (and offload_activations' downloads on Side). A slot is refilled only once Main has queued every
// read of what it held (Upload waits for Main first), and never while it holds the layer in use. The pass
// orders are forward 0 .. L-1 and backward L-1 .. 0, so the two streamed layers a pass ends with are the two
// the next one starts with: they are not copied again.
// Results are the resident run's, bit for bit: the same values are read. On the CPU the copies run as they
// are called (marks are 0), the same code in program order.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"
#include "model/parameters.h"

namespace soltrain {

class WeightStream {
 public:
  // Streams the groups among 0 .. layers-1 that `ps` holds on the host (keep_frozen_on_host, allocated).
  WeightStream(ParameterStore& ps, Ops& ops, int layers);
  // Which of `layers` decoder layers stream when `resident` of them stay on the device: the others, spread
  // evenly over the depth (all of them when resident is 0). UserError when resident leaves none to stream.
  static std::vector<int> streamed_layers(int layers, int resident);
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  // Group g's weights are about to be read by forward / by backward (g == layers: the resident head group,
  // whose call starts a pass).
  void before_forward(int g);
  void before_backward(int g);

  size_t device_bytes() const { return 2 * slot_bytes_; }  // the two slots
  int64_t copies() const { return copies_; }               // layer copies queued so far (tests read it)
  int streamed() const { return int(streamed_.size()); }

 private:
  struct Slot {
    Buffer buffer;
    int group = -1;       // the layer it holds (-1: none)
    uint64_t ready = 0;   // Upload's mark after its copy
    bool awaited = true;  // Main has waited for `ready`
    uint64_t used = 0;    // when it was last needed (the other one is refilled)
  };
  void start_pass();
  void ensure(int g);    // g in a slot, bound, Main ordered after its copy
  void prefetch(int g);  // g's copy queued unless a slot holds it (-1: nothing)
  Slot& fill(int g);
  int next_streamed(int g, bool forward) const;  // the first streamed layer after g in a pass's order (-1: none)

  ParameterStore& ps_;
  Ops& ops_;
  int layers_;
  std::vector<int> streamed_;  // the streamed layers, ascending
  std::vector<bool> is_streamed_;
  size_t slot_bytes_ = 0;
  Slot slots_[2];
  int current_ = -1;  // the streamed layer being read now (-1: a resident one)
  uint64_t clock_ = 0;
  int64_t copies_ = 0;
  uint64_t version_ = 0;  // ParameterStore::frozen_host_version() when the slots were last valid
};

}  // namespace soltrain
