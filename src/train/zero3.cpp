#include "train/zero3.h"

#include <algorithm>

#include "core/error.h"
#include "train/data_parallel.h"

namespace soltrain {

namespace {
Buffer alloc_nonempty(Ops& ops, size_t bytes) {
  return bytes ? ops.alloc(bytes) : Buffer{};
}
}  // namespace

Zero3::Zero3(ParameterStore& ps, Ops& ops, Communicator& comm, const ShardPlan& plan, int head)
    : ps_(ps), ops_(ops), comm_(comm), plan_(plan), head_(head), whole_(comm.size() == 1 && comm.shards_in_place()) {
  const StoreShards cut = store_cut(plan);
  if (ps.sharded()) {  // loaded by its slices (zero3_cut): nothing whole to cut
    SOLTRAIN_CHECK(ps.holds_cut(cut), "the model was loaded by slices other than ZeRO-3's plan cuts");
  } else {
    ps.keep_shards(ops, cut.owned, cut.chunk);
    if (!cut.frozen_chunk.empty()) ps.keep_frozen_shards(ops, comm.rank(), cut.frozen_chunk);
  }
  const BufferElements e = buffer_elements(plan, head, whole_);
  for (int i = 0; i < 3; ++i) frozen_gathered_[i] = alloc_nonempty(ops, size_t(i < 2 ? e.frozen_layer : e.frozen_head));
  const size_t act = dtype_size(ps.shard_values(head).dtype);
  for (int i = 0; i < 2; ++i) {
    gathered_[i] = alloc_nonempty(ops, size_t(e.layer) * act);
    grads_[i] = alloc_nonempty(ops, size_t(e.layer) * 4);
  }
  gathered_[2] = alloc_nonempty(ops, size_t(e.head) * act);
  grads_[2] = alloc_nonempty(ops, size_t(e.head) * 4);
  reduced_part_ = alloc_nonempty(ops, size_t(e.part) * 4);
  for (const Buffer& b : grads_)  // cleared once here, then by each reduction that reads one (grads_ready)
    if (b.bytes()) ops.zero(Tensor{b.data(), DType::F32, {int64_t(b.bytes() / 4)}, b.device()});
  in_slice_.assign(plan.groups.size(), false);
  // The head group's gradients start in forward (the LM head's backward fused into its chunks): bound for good.
  if (!untrained(head)) ps.bind_grads(head, grad_scratch(head));
}

bool Zero3::untrained(int g) const {
  return plan_.groups[size_t(g)].numel == 0;  // (a LoRA run's embedding and head)
}

bool Zero3::empty(int g) const {
  return untrained(g) && plan_.frozen_chunk_of(g) == 0;
}

int Zero3::next(int g, bool forward) const {
  if (forward) return g == head_ ? 0 : g + 1 < head_ ? g + 1 : -1;
  return g == head_ ? head_ - 1 : g - 1;
}

Tensor Zero3::slot_tensor(int s, int64_t n) const {
  return Tensor{gathered_[s].data(), ps_.shard_values(head_).dtype, {n}, gathered_[s].device()};
}

Tensor Zero3::grad_scratch(int g) const {
  if (whole_) return ps_.shard_grads(g);
  const Buffer& b = grads_[g == head_ ? 2 : g % 2];
  return Tensor{b.data(), DType::F32, {plan_.groups[size_t(g)].chunk * comm_.size()}, b.device()};
}

Zero3::Slot& Zero3::gather(int g) {
  int s = 2;
  if (g != head_) {
    // Never the buffer of the layer in use; of the others the one needed longest ago.
    const bool busy0 = current_ >= 0 && slots_[0].group == current_;
    const bool busy1 = current_ >= 0 && slots_[1].group == current_;
    s = busy0 ? 1 : busy1 ? 0 : slots_[0].used <= slots_[1].used ? 0 : 1;
    if (const int held = slots_[s].group; held >= 0) {
      ps_.bind_values(held, Tensor{});
      if (plan_.frozen_chunk_of(held)) ps_.bind_frozen_packed(held, Tensor{});
    }
  }
  Slot& slot = slots_[s];
  const Tensor out = whole_ ? ps_.shard_values(g) : slot_tensor(s, plan_.groups[size_t(g)].chunk * comm_.size());
  const int64_t frozen = plan_.frozen_chunk_of(g);
  const Tensor frozen_out{frozen_gathered_[s].data(), DType::U8, {frozen * comm_.size()}, frozen_gathered_[s].device()};
  // Main's reads of what the buffer held, and the update that wrote the slices, are queued before this.
  ops_.wait(Ops::Stream::Side, Ops::Stream::Main);
  ops_.use_stream(Ops::Stream::Side);
  // rank r's slice at r·chunk: the group's flat layout (its packed frozen bytes), padded
  if (!untrained(g)) comm_.all_gather(out, ps_.shard_values(g));
  if (frozen) comm_.all_gather(frozen_out, ps_.frozen_shard(g));
  slot.ready = ops_.mark();
  ops_.use_stream(Ops::Stream::Main);
  slot.group = g;
  slot.awaited = false;
  if (!untrained(g)) ps_.bind_values(g, out);
  if (frozen) ps_.bind_frozen_packed(g, frozen_out);
  return slot;
}

void Zero3::ensure(int g) {
  if (empty(g)) return;
  Slot* s = nullptr;
  for (Slot& c : slots_)
    if (c.group == g) s = &c;
  if (!s) s = &gather(g);
  if (!s->awaited) {
    if (s->ready) ops_.wait_mark(s->ready);  // on Main: the weights are whole from here on
    s->awaited = true;
  }
  s->used = ++clock_;
  if (g != head_) current_ = g;
}

void Zero3::prefetch(int g) {
  if (g < 0 || empty(g)) return;
  for (const Slot& c : slots_)
    if (c.group == g) return;
  gather(g);
}

void Zero3::before_forward(int g) {
  ensure(g);
  prefetch(next(g, true));
  if (g == head_ && !untrained(g) && reduced_[2]) ops_.wait_mark(reduced_[2]);  // its scratch, read and cleared
}

void Zero3::before_backward(int g) {
  ensure(g);
  prefetch(next(g, false));
  if (g == head_ || untrained(g)) return;
  const int s = g % 2;  // backward alternates the two: one is reduced while the other fills
  if (grad_bound_[s] != g) {
    if (grad_bound_[s] >= 0) ps_.bind_grads(grad_bound_[s], Tensor{});
    ps_.bind_grads(g, grad_scratch(g));
    grad_bound_[s] = g;
  }
  if (reduced_[s]) ops_.wait_mark(reduced_[s]);  // its previous reduction has read and cleared it
}

void Zero3::grads_ready(int g) {
  if (untrained(g)) return;
  const int64_t chunk = plan_.groups[size_t(g)].chunk;
  const Tensor part{reduced_part_.data(), DType::F32, {chunk}, reduced_part_.device()};
  ops_.wait(Ops::Stream::Side, Ops::Stream::Main);  // backward has written the group's gradients
  ops_.use_stream(Ops::Stream::Side);
  const Tensor scratch = grad_scratch(g);
  if (whole_) {
    comm_.reduce_scatter_sum(scratch, scratch);  // in place; the slice keeps accumulating until the update
  } else if (in_slice_[size_t(g)]) {
    comm_.reduce_scatter_sum(part, scratch);
    ops_.add_inplace(ps_.shard_grads(g), part);  // later micro-batches accumulate in the slice
  } else {
    comm_.reduce_scatter_sum(ps_.shard_grads(g), scratch);  // the update's first: the slice is zero
    in_slice_[size_t(g)] = true;
  }
  if (!whole_) ops_.zero(scratch);  // ready for the next use, off the Main stream
  reduced_[g == head_ ? 2 : g % 2] = ops_.mark();
  ops_.use_stream(Ops::Stream::Main);
}

void Zero3::begin_update() {
  std::fill(in_slice_.begin(), in_slice_.end(), false);
}

void Zero3::idle_pass() {
  // Transformer::forward and backward's hook order (a repeated hook adds no collective).
  before_forward(head_);
  for (int l = 0; l < head_; ++l) before_forward(l);
  before_backward(head_);
  for (int l = head_ - 1; l >= 0; --l) {
    before_backward(l);
    grads_ready(l);
  }
  grads_ready(head_);
}

void Zero3::weights_changed() {
  // (a frozen base did not change, but its gathered copy goes with its slot: regathered with the group)
  for (Slot& s : slots_) {
    if (s.group >= 0) {
      ps_.bind_values(s.group, Tensor{});
      if (plan_.frozen_chunk_of(s.group)) ps_.bind_frozen_packed(s.group, Tensor{});
    }
    s = Slot{};
  }
  current_ = -1;
}

void Zero3::gather_masters(int g) {
  const bool lead = comm_.rank() == 0;
  // The gradient scratch is idle between updates (settled): the masters are gathered through it. With
  // offload_master the slices live in host memory, which collectives do not read: a rank's slice goes through
  // the reduced-part buffer (one chunk, idle here too).
  const Tensor all = grad_scratch(g);
  ops_.wait(Ops::Stream::Side, Ops::Stream::Main);
  ops_.use_stream(Ops::Stream::Side);
  Tensor mine = ps_.shard_masters(g);
  if (ps_.masters_on_host()) {
    const Tensor part{reduced_part_.data(), DType::F32, {mine.numel()}, reduced_part_.device()};
    ops_.copy(part, mine);
    mine = part;
  }
  comm_.all_gather(all, mine);
  ops_.use_stream(Ops::Stream::Main);
  ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
  if (lead) {
    if (streamed_ >= 0) ps_.bind_masters(streamed_, Tensor{});
    const Tensor host{host_group_.data(), DType::F32, {ps_.group_numel(g)}, Device::CPU};
    ops_.copy(host, all.flat_part(0, ps_.group_numel(g)));
    ps_.bind_masters(g, host);
    streamed_ = g;
  }
  ops_.zero(all);  // the scratch starts every use from zero
}

void Zero3::begin_masters() {
  SOLTRAIN_CHECK(comm_.rank() == 0, "begin_masters on rank ", comm_.rank());
  if (whole_) {  // the slices are the groups, in place: read as they are
    for (int g = 0; g < int(plan_.groups.size()); ++g)
      if (!untrained(g)) ps_.bind_masters(g, ps_.shard_masters(g));
    return;
  }
  int64_t largest = 1;
  for (int g = 0; g < int(plan_.groups.size()); ++g) largest = std::max(largest, ps_.group_numel(g));
  host_group_ = Buffer::host(size_t(largest) * 4);
  ps_.set_master_source([this](int g) {
    SOLTRAIN_CHECK(!untrained(g), "group ", g, " trains nothing: no masters to stream");
    (void)comm_.all_max_host(g);  // the others, in serve_masters, learn which group to gather
    gather_masters(g);
  });
}

void Zero3::serve_masters() {
  if (whole_) return;
  // Rank 0 announces a group (>= 0) or the end (-1); the others offer -1, so the maximum is rank 0's.
  for (int64_t g; (g = comm_.all_max_host(-1)) >= 0;) gather_masters(int(g));
}

void Zero3::end_masters() {
  ps_.set_master_source(nullptr);
  for (int g = 0; g < int(plan_.groups.size()); ++g)
    if (!untrained(g)) ps_.bind_masters(g, Tensor{});
  if (whole_) return;
  (void)comm_.all_max_host(-1);  // the others stop serving
  streamed_ = -1;
  host_group_ = Buffer{};
}

void Zero3::before_loading() {
  ops_.wait(Ops::Stream::Main, Ops::Stream::Side);  // no gather still reads the slices
  weights_changed();
}

Zero3::BufferElements Zero3::buffer_elements(const ShardPlan& plan, int head, bool whole) {
  BufferElements e;
  if (whole) return e;  // the slices serve as every buffer
  // Sized for the largest layer (all layers are alike) and for the head group, padded to whole chunks.
  for (int g = 0; g < int(plan.groups.size()); ++g) {
    const auto& gr = plan.groups[size_t(g)];
    if (g != head) e.layer = std::max(e.layer, gr.chunk * plan.size);
    e.part = std::max(e.part, gr.chunk);
  }
  e.head = plan.groups[size_t(head)].chunk * plan.size;
  for (int g = 0; g < int(plan.frozen_chunk.size()); ++g)
    if (g != head) e.frozen_layer = std::max(e.frozen_layer, plan.frozen_chunk[size_t(g)] * plan.size);
  e.frozen_head = plan.frozen_chunk_of(head) * plan.size;
  return e;
}

Zero3::Bytes Zero3::planned(const ShardPlan& plan, int head, size_t value_bytes, bool whole) {
  const BufferElements e = buffer_elements(plan, head, whole);
  Bytes b;
  for (const auto& g : plan.groups) b.held_elements += g.chunk, b.trainable_elements += g.numel;
  for (int64_t c : plan.frozen_chunk) b.frozen_held += size_t(c);
  b.frozen_gathered = size_t(2 * e.frozen_layer + e.frozen_head);
  b.gathered = size_t(2 * e.layer + e.head) * value_bytes + b.frozen_gathered;
  b.grad_scratch = size_t(2 * e.layer + e.head + e.part) * 4;
  return b;
}

Zero3::Bytes Zero3::bytes() const {
  Bytes b;
  b.held_elements = ps_.all_grads().numel();
  b.trainable_elements = ps_.numel();
  for (int i = 0; i < 3; ++i) {
    b.gathered += gathered_[i].bytes() + frozen_gathered_[i].bytes();
    b.frozen_gathered += frozen_gathered_[i].bytes();
    b.grad_scratch += grads_[i].bytes();
  }
  b.frozen_held = ps_.frozen_shard_bytes();
  b.grad_scratch += reduced_part_.bytes();
  return b;
}

}  // namespace soltrain
