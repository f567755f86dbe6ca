#include "train/data_parallel.h"

#include <algorithm>

#include "core/error.h"

namespace soltrain {

std::pair<int64_t, int64_t> ShardPlan::owned_span(int g) const {
  const Group& gr = groups[size_t(g)];
  const int64_t b = std::min(gr.numel, int64_t(rank) * gr.chunk), e = std::min(gr.numel, b + gr.chunk);
  return {gr.begin + b, gr.begin + e};
}

namespace {
// Group g's chunk: the smallest from ceil(n / size) on whose cuts r·chunk (0 < r < size, inside the group) each
// fall outside the parameters keeping low-bit moments or on one of their block boundaries. Real models' such
// parameters start on block boundaries of the group (their sizes are multiples of 256), so that is ceil(n / size)
// rounded up to a block; where a few thousand candidates find none (odd shapes), one rank holds the group whole
// (correct, unbalanced).
int64_t block_aligned_chunk(const ParameterStore& params, int g, int size, Moments moments) {
  const int64_t begin = params.group_begin(g), n = params.group_numel(g), even = (n + size - 1) / size;
  if (!low_bit(moments) || size == 1) return even;
  const int64_t b = moment_block(moments);
  std::vector<std::pair<int64_t, int64_t>> blocked;  // [first, end) of each such parameter, from the group's start
  for (const Parameter& p : params.all())
    if (p.trainable && p.group == g && quantised_moments(moments, shape_numel(p.shape)))
      blocked.push_back({p.offset - begin, p.offset - begin + shape_numel(p.shape)});
  std::sort(blocked.begin(), blocked.end());
  auto cut_ok = [&](int64_t x) {
    auto it = std::upper_bound(blocked.begin(), blocked.end(), std::pair{x, INT64_MAX});
    if (it == blocked.begin()) return true;
    --it;  // the last parameter starting at or before x
    return x >= it->second || (x - it->first) % b == 0;
  };
  for (int64_t chunk = even; chunk < even + 64 * b && chunk < n; ++chunk) {
    bool ok = true;
    for (int64_t r = 1; r < size && ok && r * chunk < n; ++r) ok = cut_ok(r * chunk);
    if (ok) return chunk;
  }
  return n;
}
}  // namespace

ShardPlan make_shard_plan(const ParameterStore& params, int rank, int size, Moments moments) {
  ShardPlan p;
  p.rank = rank;
  p.size = size;
  for (int g = 0; g < params.groups(); ++g)
    p.groups.push_back({params.group_begin(g), params.group_numel(g), block_aligned_chunk(params, g, size, moments)});
  for (const ParamRange& r : params.ranges()) {
    const auto [b, e] = p.owned_span(r.group);
    const int64_t lo = std::max(b, r.offset), hi = std::min(e, r.offset + r.numel);
    if (hi > lo) p.owned.push_back({r.group, r.decay, lo, hi - lo});
  }
  return p;
}

std::vector<int64_t> frozen_chunks(const std::vector<int64_t>& packed, int size) {
  if (size <= 1 || std::all_of(packed.begin(), packed.end(), [](int64_t b) { return b == 0; })) return {};
  std::vector<int64_t> chunk;
  for (int64_t b : packed) chunk.push_back(((b + size - 1) / size + 255) / 256 * 256);
  return chunk;
}

StoreShards store_cut(const ShardPlan& plan) {
  StoreShards cut;
  cut.rank = plan.rank;
  for (int g = 0; g < int(plan.groups.size()); ++g) {
    cut.owned.push_back(plan.owned_span(g));
    cut.chunk.push_back(plan.groups[size_t(g)].chunk);
  }
  cut.frozen_chunk = plan.frozen_chunk;
  return cut;
}

StoreShards zero3_cut(const ParameterStore& ps, int rank, int size, Moments moments, DType act, bool shard_frozen) {
  ShardPlan plan = make_shard_plan(ps, rank, size, moments);
  if (shard_frozen) plan.frozen_chunk = frozen_chunks(ps.frozen_packed_bytes(act), size);  // (as DataParallel cuts)
  return store_cut(plan);
}

StoreOptions sliced_for_zero3(StoreOptions store, const Communicator& comm, Moments moments, bool shard_frozen) {
  const int rank = comm.rank(), size = comm.size();
  store.shards = [rank, size, moments, shard_frozen](const ParameterStore& ps, DType act) {
    return zero3_cut(ps, rank, size, moments, act, shard_frozen);
  };
  return store;
}

namespace {
// A group's collectives can run on its own buffer: the communicator allows it and the ranks' slices tile the
// group exactly (no padding).
bool group_in_place(const ShardPlan::Group& gr, int size, bool comm_in_place) {
  return comm_in_place && gr.chunk * size == gr.numel;
}
}  // namespace

DataParallel::DataParallel(Transformer& model, Communicator& comm, int zero_stage, const OptimizerConfig& opt)
    : model_(model), comm_(comm), ops_(model.ops()), stage_(zero_stage), host_masters_(opt.offload.master) {
  SOLTRAIN_CHECK(zero_stage >= 0 && zero_stage <= 3, "ZeRO stage ", zero_stage);
  plan_ = make_shard_plan(model.params(), comm.rank(), comm.size(), opt.moments);
  reduced_.assign(plan_.groups.size(), false);
  gathered_.assign(plan_.groups.size(), 0);
  if (stage_ == 3) {  // its own buffers, never staged
    // The frozen base is sharded unless the ranks hold different parts of it (expert parallelism's shares of
    // the experts); a store loaded by slices was cut by the same rule (zero3_cut), and Zero3 checks it is.
    const ParameterStore& ps = model.params();
    if (ps.sharded() ? ps.frozen_sharded() : model.config().moe.held_count == 0)
      plan_.frozen_chunk = frozen_chunks(ps.frozen_packed_bytes(ops_.activation_dtype()), comm.size());
    zero3_ = std::make_unique<Zero3>(model.params(), ops_, comm, plan_, model.head_group());
    return;
  }
  if (const size_t chunk = size_t(staged_chunk(plan_, stage_, comm.shards_in_place(), host_masters_))) {
    stage_in_ = ops_.alloc(chunk * size_t(comm.size()) * 4);
    stage_out_ = ops_.alloc(chunk * 4);  // one rank's chunk
  }
}

// Staging only for the groups whose collectives cannot run in place (padded chunks, a communicator that needs
// separate buffers, or masters in host memory, which collectives do not read): with an in-place communicator,
// evenly divisible groups and masters on the device none.
int64_t DataParallel::staged_chunk(const ShardPlan& plan, int zero_stage, bool comm_in_place, bool host_masters) {
  if (zero_stage != 1 && zero_stage != 2) return 0;
  int64_t chunk = 0;
  for (const auto& g : plan.groups)
    if (g.numel > 0 && (host_masters || !group_in_place(g, plan.size, comm_in_place))) chunk = std::max(chunk, g.chunk);
  return chunk;
}

size_t DataParallel::staging_bytes(const ShardPlan& plan, int zero_stage, bool comm_in_place, bool host_masters) {
  // size chunks in, one out
  return size_t(staged_chunk(plan, zero_stage, comm_in_place, host_masters)) * size_t(plan.size + 1) * 4;
}

// The gradients' reductions may run in place whatever holds the masters; the gathers of host-held masters not.
bool DataParallel::in_place(const ShardPlan::Group& gr) const {
  return group_in_place(gr, comm_.size(), comm_.shards_in_place());
}

Tensor DataParallel::scratch(int64_t elements, int which) {
  const Buffer& b = which == 0 ? stage_in_ : stage_out_;
  return Tensor{b.data(), DType::F32, {elements}, b.device()};
}

void DataParallel::grads_ready(int group) {
  if (zero3_) return zero3_->grads_ready(group);
  if (armed_ && !reduced_[size_t(group)]) reduce_group(group);
}

void DataParallel::reduce_group(int g) {
  reduced_[size_t(g)] = true;
  const ShardPlan::Group& gr = plan_.groups[size_t(g)];
  if (gr.numel == 0) return;                        // nothing trains in it (a LoRA run's embedding and head)
  ops_.wait(Ops::Stream::Side, Ops::Stream::Main);  // backward has written the group's gradients
  ops_.use_stream(Ops::Stream::Side);
  const Tensor grads = model_.params().group_grads(g);
  if (stage_ < 2) {
    comm_.all_reduce_sum(grads);
  } else if (in_place(gr)) {
    // Straight from the gradients into this rank's own slice of them: no staging copy either way.
    comm_.reduce_scatter_sum(grads.flat_part(int64_t(comm_.rank()) * gr.chunk, gr.chunk), grads);
  } else {
    const int64_t padded = gr.chunk * comm_.size();
    const Tensor in = scratch(padded, 0), out = scratch(gr.chunk, 1);
    ops_.copy(in.flat_part(0, gr.numel), grads);
    if (padded > gr.numel) ops_.zero(in.flat_part(gr.numel, padded - gr.numel));
    comm_.reduce_scatter_sum(out, in);
    const auto [b, e] = plan_.owned_span(g);
    if (e > b) ops_.copy(grads.flat_part(b - gr.begin, e - b), out.flat_part(0, e - b));
  }
  ops_.use_stream(Ops::Stream::Main);
}

void DataParallel::finish_gradients() {
  if (zero3_) {  // every micro-batch's pass (or idle_pass) has reduced every group
    ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
    armed_ = false;
    return;
  }
  // Backward's order: the decoder layers from the last, then the group of embedding, norm and head.
  const int head = int(plan_.groups.size()) - 1;
  for (int g = head - 1; g >= 0; --g)
    if (!reduced_[size_t(g)]) reduce_group(g);
  if (!reduced_[size_t(head)]) reduce_group(head);
  ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
  armed_ = false;
  std::fill(reduced_.begin(), reduced_.end(), false);
}

void DataParallel::grad_sumsq(Tensor out) {
  const ParameterStore& ps = model_.params();
  // Every rank holds every summed gradient below stage 2; alone, a rank owns them all: one reduction over
  // the whole buffer, in the single process's order (so one rank trains bitwise as no data parallel does;
  // stage 3's slices of one rank are the flat layout itself, unpadded).
  if (stage_ < 2 || comm_.size() == 1) {
    ops_.reduce_sum(out, ps.all_grads(), /*squares=*/true, /*accumulate=*/false);
    return;
  }
  ops_.zero(out);
  for (int g = 0; g < int(plan_.groups.size()); ++g) {
    const auto [b, e] = plan_.owned_span(g);
    if (e > b) ops_.reduce_sum(out, ps.grads(ParamRange{g, false, b, e - b}), true, /*accumulate=*/true);
  }
  all_reduce(out);
}

// A collective on Side between Main's work before and after it (both wait for it).
void DataParallel::on_side_between(const std::function<void()>& collective) {
  ops_.wait(Ops::Stream::Side, Ops::Stream::Main);
  ops_.use_stream(Ops::Stream::Side);
  collective();
  ops_.use_stream(Ops::Stream::Main);
  ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
}

void DataParallel::all_reduce(Tensor t) {
  on_side_between([&] { comm_.all_reduce_sum(t); });
}

void DataParallel::all_reduce_max(Tensor t) {
  on_side_between([&] { comm_.all_reduce_max(t); });
}

void DataParallel::gather_weights() {
  if (stage_ == 0) return;
  if (zero3_) return zero3_->weights_changed();     // each group is gathered when next used
  ops_.wait(Ops::Stream::Side, Ops::Stream::Main);  // the update has written the owned masters
  ops_.use_stream(Ops::Stream::Side);
  // Forward's order: the embedding's group first, then the layers from the first.
  const int head = int(plan_.groups.size()) - 1;
  gather_group(head);
  for (int g = 0; g < head; ++g) gather_group(g);
  ops_.use_stream(Ops::Stream::Main);
}

void DataParallel::await_gather(int g) {
  uint64_t& m = gathered_[size_t(g)];
  if (m == 0) return;
  ops_.wait_mark(m);  // on the current stream (Main): the group's weights are whole from here on
  m = 0;
}

void DataParallel::settle() {
  if (zero3_) return ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
  if (std::none_of(gathered_.begin(), gathered_.end(), [](uint64_t m) { return m != 0; })) return;
  ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
  std::fill(gathered_.begin(), gathered_.end(), 0);
}

void DataParallel::gather_group(int g) {
  ParameterStore& ps = model_.params();
  const ShardPlan::Group& gr = plan_.groups[size_t(g)];
  if (gr.numel == 0) return;
  const ParamRange whole{g, false, gr.begin, gr.numel};
  const Tensor masters = ps.masters(whole);
  // (masters in host memory, offload_master: through the staging, which the constructor sized for them)
  SOLTRAIN_CHECK(!ps.masters_on_host() || host_masters_, "host-held masters without the staging to gather them");
  if (in_place(gr) && !ps.masters_on_host()) {  // this rank's slice gathered in place
    comm_.all_gather(masters, masters.flat_part(int64_t(comm_.rank()) * gr.chunk, gr.chunk));
    // The update wrote this rank's compute copy itself: only the other ranks' slices need converting.
    const auto [b, e] = plan_.owned_span(g);
    for (const auto& [lo, hi] : {std::pair{gr.begin, b}, std::pair{e, gr.begin + gr.numel}})
      if (hi > lo && !ps.values_alias_masters()) {
        const ParamRange part{g, false, lo, hi - lo};
        ops_.convert(ps.values(part), ps.masters(part));
      }
  } else {
    const auto [b, e] = plan_.owned_span(g);
    const Tensor mine = scratch(gr.chunk, 1), all = scratch(gr.chunk * comm_.size(), 0);
    if (e > b) ops_.copy(mine.flat_part(0, e - b), masters.flat_part(b - gr.begin, e - b));
    if (e - b < gr.chunk) ops_.zero(mine.flat_part(e - b, gr.chunk - (e - b)));
    comm_.all_gather(all, mine);
    ops_.copy(masters, all.flat_part(0, gr.numel));  // (into host memory with offload_master)
    if (!ps.values_alias_masters()) ops_.convert(ps.values(whole), all.flat_part(0, gr.numel));
  }
  gathered_[size_t(g)] = ops_.mark();  // taken on Side, after the group's gather
}

}  // namespace soltrain
