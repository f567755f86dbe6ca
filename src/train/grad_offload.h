// `offload_grads` (Surogate's and llmq's name): the decoder layers' fp32 gradients live in host memory (pinned on
// CUDA), so a full fine-tune holds two layers' worth on the device instead of the whole model's (Qwen3-30B-A3B:
// 2 x 2.4 GiB instead of 114 GiB). Each layer's backward writes into a device slot bound as that layer's
// gradients (zeroed for an update's first pass, or filled with the host copy to accumulate onto), and once the
// layer is done the slot is copied home on the side stream while the next layer's backward runs in the other
// slot. The update's last pass also sums the squares for clipping there, before the copy; the optimizer then
// streams the host gradients through its staging slots (train/optimizer_offload.cpp). The embedding, final norm
// and head keep their gradients on the device (the fused head writes its gradient during forward).
// The values are the resident run's: the same kernels write the same sums, only in another place.
#pragma once
#include <cstdint>

#include "core/buffer.h"
#include "model/transformer.h"

namespace soltrain {

class GradOffload final : public LayerHooks {
 public:
  // Moves the model's layer gradients to host memory (ParameterStore::move_layer_grads_to_host) and makes the
  // two device slots.
  explicit GradOffload(Transformer& model);
  // The device bytes of the two slots (the largest layer's gradients each).
  size_t device_bytes() const { return slot_[0].bytes() + slot_[1].bytes(); }
  // Where the fp32 gradients of a store with `layers` decoder layers go, from its parameters alone (no layout,
  // nothing allocated: bench --plan-only, and the constructor sizes its slots from it): the layers' in host
  // memory, the head group's on the device, and the two slots of the widest layer there.
  struct Plan {
    size_t host = 0, head = 0, slot = 0;  // bytes; each slot is `slot`
    size_t device() const { return head + 2 * slot; }
  };
  static Plan plan(const ParameterStore& ps, int layers);

  // An update begins: its first backward pass starts each layer from zero rather than from the host copy.
  void begin_update();
  // The next backward pass is the update's last: it adds each layer's Σ g² into `sumsq` (F64 [1], zeroed by the
  // caller) before copying the layer home.
  void set_last_pass(const Tensor* sumsq) { sumsq_ = sumsq; }
  // After the update's passes: the copies home are done before anything on the main stream reads the host
  // gradients. An update whose micro-batches trained nothing zeroes them (as the resident run's zeroing does).
  void finish_update();

  void before_backward(int group) override;
  void grads_ready(int group) override;

 private:
  Transformer& model_;
  int layers_;
  Buffer slot_[2];
  uint64_t copied_home_[2] = {0, 0};  // per slot: the side stream's mark after its last copy home
  uint64_t filled_[2] = {0, 0};       // per slot: the upload stream's mark after it was filled from the host
  int passes_ = 0;                    // backward passes of this update so far
  const Tensor* sumsq_ = nullptr;
  Tensor slot_view(int group) const;
  void fill(int group);  // queues the host copy of `group` into its slot on the upload stream (accumulating passes)
};

}  // namespace soltrain
