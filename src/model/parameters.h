// ParameterStore: the model's trainable tensors by Hugging Face name: fp32 master values, fp32 gradients
// and the compute copy the forward/backward read (the master itself on CPU, bf16 on CUDA).
// Every parameter belongs to a group (a decoder layer, or the group of the embedding, final norm and LM
// head), and each group's tensors are one contiguous range of the flat buffers, laid out as
// [decayed (2-D) | the rest]: a group's gradients can be reduced or sharded as one range the moment the
// group's backward is done, and the optimizer runs over two ranges per group instead of one launch per
// tensor. Frozen parameters (a LoRA run's base weights) keep only the compute copy, in a buffer of their
// own: no master, no gradient, nothing for the optimizer. A frozen projection of a QLoRA base is held
// quantised (NF4 or FP8 blocks, kernels/quant.h) in a third buffer: `value` the codes, `scale` its scales.
// ZeRO-3 (train/zero3.h) shards the trainable buffers (and, over several ranks, the frozen base's bytes): the store
// then holds one slice per group and the data-parallel machinery points the parameters' tensors at wherever a
// group is whole for a while.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"

namespace soltrain {

// How the store orders a parameter's elements where that differs from its named (checkpoint) layout. With
// `experts` set: an expert adapter's B as PEFT names it, [parts·out, R·E] with expert e's column i at i·E + e
// (model/moe.h), stored as `parts` blocks of [E, out, R], one matrix per expert, the layout the grouped GEMMs
// read and add its gradient into (so no step rearranges it). upload, download and download_grad convert; the
// optimizer, clipping and the collectives are elementwise and never see the difference.
struct StoredOrder {
  int experts = 0, parts = 1;
  bool named() const { return experts == 0; }
};

struct Parameter {
  std::string name;  // HF name, e.g. model.layers.0.self_attn.q_proj.weight
  Shape shape;
  bool decay;           // weight decay applies (matrices and embeddings; not norms or biases)
  bool trainable;       // false: frozen, `master` and `grad` stay undefined
  int group;            // contiguous range of the flat buffers it lives in
  Tensor master;        // F32, what the optimizer updates and checkpoints hold
  Tensor value;         // activation dtype, what the model computes with (aliases master when that is F32)
  Tensor grad;          // F32
  int64_t offset = -1;  // element offset in the flat trainable buffers (-1: frozen)
  WeightFormat format = WeightFormat::Dense;  // quantised formats: frozen 2-D weights only
  Tensor scale;                               // the format's scales (see Weight)
  StoredOrder order;                          // master, value and grad in this order (shape stays the named one)
};

// A parameter's elements between its named layout and its stored order (the same pointer for both is refused).
void named_to_stored(const Parameter& p, const float* named, float* stored);
void stored_to_named(const Parameter& p, const float* stored, float* named);

// How allocate() keeps the trainable tensors: with gradients or without (a model ZeRO-3 will shard gets only its
// slices of them), and the masters in fp32, or in bf16 (`bf16_stochastic_round`, torchao's name: no fp32 copy at
// all, the optimizer rounds each update stochastically, kernels/stochastic_round.h; where the compute dtype is
// bf16 the master is the compute copy). A bool reads as `gradients` (the settings' older form).
// ZeRO-3's cut of a laid-out store for one rank (train/data_parallel.h makes it): per group the owned flat range
// and the slice length (keep_shards), and the frozen base's byte chunks (keep_frozen_shards; empty: whole).
struct StoreShards {
  int rank = 0;
  std::vector<std::pair<int64_t, int64_t>> owned;
  std::vector<int64_t> chunk, frozen_chunk;
};
class ParameterStore;
struct StoreOptions {
  bool gradients = true;
  DType masters = DType::F32;
  // ZeRO-3 loading by slices: allocate() cuts the laid-out store (for the compute dtype given) and allocates
  // only this rank's slices, as keep_shards and keep_frozen_shards would leave them, so the whole model never
  // exists on the rank; uploads then keep only the parts it owns (null: everything whole).
  std::function<StoreShards(const ParameterStore&, DType act)> shards;
  StoreOptions(bool g = true, DType m = DType::F32) : gradients(g), masters(m) {}  // NOLINT: a bool converts
};

// A contiguous range of trainable elements sharing a group and a decay setting.
struct ParamRange {
  int group;
  bool decay;
  int64_t offset, numel;
};

class ParameterStore {
 public:
  void add(const std::string& name, Shape shape, bool trainable, int group, WeightFormat format = WeightFormat::Dense,
           StoredOrder order = {});
  // Lays out the groups in order and allocates the flat buffers on the ops' device (zeroed). Without
  // `gradients` no gradient buffer is allocated: a model that ZeRO-3 will shard gets only its rank's slices
  // of them (keep_shards), so a full-size gradient buffer never exists there.
  void allocate(Ops& ops, StoreOptions options = {});
  DType master_dtype() const { return master_dtype_; }
  // The flat layout alone (offsets, groups, ranges), as allocate() makes it: for plans made without memory.
  void lay_out();
  // Refreshes the compute copy from the masters (after loading; the optimizer does it itself).
  void sync_values(Ops& ops);

  Parameter& at(const std::string& name);
  const Parameter& at(const std::string& name) const;
  Parameter* find(const std::string& name);
  std::vector<Parameter>& all() { return params_; }
  const std::vector<Parameter>& all() const { return params_; }
  // Trainable elements (what the optimizer and clipping see); frozen ones are counted apart.
  int64_t numel() const { return numel_; }
  int64_t decayed_numel() const { return decayed_numel_; }
  int64_t frozen_numel() const { return frozen_numel_; }
  // Device bytes of every weight's storage: masters, compute copies, frozen copies, quantised codes + scales.
  // (Frozen weights kept on the host, keep_frozen_on_host, are not device bytes: host_frozen_bytes.)
  size_t weight_bytes() const {
    return (masters_on_host_ ? 0 : masters_.bytes()) + values_.bytes() + frozen_.bytes() + quantised_.bytes() +
           frozen_slices_buf_.bytes();
  }
  // `offload_master`: the fp32 masters move into host memory the device copies from asynchronously (pinned on
  // CUDA), freeing 4 bytes per trainable parameter on the device; the compute copy stays on the device (on the
  // CPU the masters are the compute copy and move with them). Only the optimizer's streamed update
  // (train/optimizer_offload.cpp) writes them afterwards. With ZeRO-3's slices (keep_shards first) the slices move.
  void move_masters_to_host(Ops& ops);
  bool masters_on_host() const { return masters_on_host_; }
  size_t host_master_bytes() const { return masters_on_host_ ? masters_.bytes() : 0; }
  // `offload_grads`: the gradients of groups 0 .. layers-1 (the decoder layers, a prefix of the flat layout) move
  // into host memory (pinned on CUDA); the rest (the embedding, final norm and head's group, which the head's
  // backward may write during forward) stays on the device. Those layers' parameters' grad then points at the
  // host copy, their home, until bind_grads points a group at a device slot for its backward
  // (train/grad_offload.h binds one per layer and copies it home after). grads(r) and group_grads(g) are the
  // homes; all_grads() is refused (the gradients are no longer one buffer). Not with ZeRO-3's slices.
  void move_layer_grads_to_host(Ops& ops, int layers);
  bool grads_on_host(const ParamRange& r) const { return r.offset < host_grads_end_ && !layer_grads_bound_only_; }
  // `optimizer_in_backward`: the gradients of groups 0 .. layers-1 are not kept at all: a layer has gradients
  // only while bind_grads points its group at a device slot, for its backward and its update right after
  // (train/backward_update.h); grads(r) and group_grads(g) of such a group are that slot (refused while
  // unbound). The head's group keeps its buffer (made here when the store was allocated without gradients, as
  // optimizer_in_backward's is: the whole model's never exist). all_grads() is refused. Not with ZeRO-3's slices.
  void drop_layer_grads(Ops& ops, int layers);
  bool layer_grads_dropped() const { return layer_grads_bound_only_; }
  bool group_grads_on_host(int group) const { return group_begin(group) < host_grads_end_ && !layer_grads_bound_only_; }
  size_t host_grad_bytes() const { return host_grads_end_ > 0 ? grads_host_.bytes() : 0; }
  size_t quantised_bytes() const { return quantised_.bytes(); }
  int groups() const { return int(group_begin_.size()) - 1; }

  // `offload_weights`: before allocate(), asks that the dense frozen weights of these groups (some or all of
  // a LoRA base's decoder layers) live in host memory (pinned on CUDA) instead of on the device, each group's
  // one contiguous range (frozen_on_host). Their parameters' value is that host copy until bind_frozen points
  // it at a device copy (model/weight_stream.h streams them layer by layer); upload and download always use
  // the host copy. Quantised frozen weights cannot stream (a check).
  void keep_frozen_on_host(std::vector<int> groups) { frozen_host_groups_ = std::move(groups); }
  bool frozen_group_on_host(int group) const;
  // Counts uploads into host-held frozen weights: a device copy made before the count changed is stale.
  uint64_t frozen_host_version() const { return frozen_host_version_; }
  size_t host_frozen_bytes() const { return frozen_host_.bytes(); }
  // Group g's frozen weights in host memory, flat in the activation dtype (frozen_group_on_host(g)), and the
  // largest such group's element count (what a device copy of one needs).
  Tensor frozen_on_host(int group) const;
  int64_t max_frozen_host_group_numel() const;
  // Points group g's host-held frozen parameters' value into `base` (the group's flat layout, as
  // frozen_on_host), or back at their host copy when `base` is empty.
  void bind_frozen(int group, const Tensor& base);

  // The buffers allocate() makes for compute dtype `act` (it sizes them from this), without allocating: `bench
  // --plan-only` sizes a run from config.json alone. Device bytes exclude what keep_frozen_on_host moves there.
  struct PlannedBytes {
    size_t masters = 0, values = 0, grads = 0, frozen = 0, frozen_host = 0, quantised = 0;
    int64_t trainable = 0, frozen_elements = 0, largest_host_group = 0;       // elements
    size_t weights() const { return masters + values + frozen + quantised; }  // as weight_bytes()
  };
  PlannedBytes planned_bytes(DType act, DType masters = DType::F32) const;

  // Sets a parameter from fp32 host values (master and compute copy, or the frozen compute copy). In a sharded
  // store (ZeRO-3) a trainable parameter's values go to this rank's slices: only the part it owns is kept.
  void upload(Ops& ops, Parameter& p, const float* host);
  // ZeRO-3: the elements [first, first + count) of trainable `p` (in its stored order) this rank's slices hold
  // (count 0: none of them); the whole parameter in a store that is not sharded.
  std::pair<int64_t, int64_t> owned_part(const Parameter& p) const;
  // Sets exactly that part from fp32 host values host[0 .. count): masters and compute copy (a checkpoint read
  // by its owned byte ranges, model/checkpoint.h, so no rank reads or holds the whole model).
  void upload_owned(Ops& ops, Parameter& p, const float* host);
  // A quantised parameter as stored (a pre-quantised checkpoint): codes and scales in its own layout.
  void upload_quantised(Ops& ops, Parameter& p, const void* codes, const void* scale);
  // Reads a parameter back as fp32 (the master, or the frozen compute copy widened or dequantised).
  // `queued`: an fp32 device value's copy is queued into `host` (pinned: Ops::copy_to_host), not waited for.
  // A parameter in a stored order other than its named one is read synchronously (`queued` aside) and reordered.
  void download(Ops& ops, const Parameter& p, float* host, bool queued = false) const;
  // ZeRO-3 checkpoints stream: while a trainable parameter's master is unbound, download() first calls this with
  // its group, which binds that group's masters somewhere readable (train/zero3.h: gathered one group at a time).
  void set_master_source(std::function<void(int group)> source) { master_source_ = std::move(source); }
  // A trainable parameter's gradient as fp32 in its named layout (what `soltrain dump` writes).
  void download_grad(Ops& ops, const Parameter& p, float* host) const;

  // Every gradient, flat; the gradients of one group (contiguous); the (group, decay) ranges in order.
  Tensor all_grads() const;
  Tensor group_grads(int group) const;
  const std::vector<ParamRange>& ranges() const { return ranges_; }
  // Views of a range of the flat masters / compute values / gradients.
  Tensor masters(const ParamRange& r) const;
  Tensor values(const ParamRange& r) const;
  Tensor grads(const ParamRange& r) const;
  bool values_alias_masters() const { return !values_.data(); }
  int64_t group_begin(int group) const { return group_begin_[size_t(group)]; }
  int64_t group_numel(int group) const { return group_begin_[size_t(group) + 1] - group_begin_[size_t(group)]; }

  // ZeRO-3: keep only this rank's slice of each group: flat [owned[g].first, owned[g].second), held in a
  // slice `chunk[g]` elements long (zero padding after the owned part, so every rank's slice of a group has
  // one length for the collectives). Masters, compute copies and gradients all shrink to the slices (the
  // full buffers are freed), so a rank holds about 1/world of each. Afterwards masters(r) / values(r) /
  // grads(r) take owned ranges only (the sharded optimizer's), all_grads() is the slices' gradients, and every
  // trainable Parameter's master, value and grad is unbound (empty) until bind_*() points it somewhere.
  // Why here and not in train/: the store is what maps a flat range to its storage, so the optimizer and
  // clipping keep their one way of reading it whatever the stage.
  void keep_shards(Ops& ops, const std::vector<std::pair<int64_t, int64_t>>& owned, const std::vector<int64_t>& chunk);
  bool sharded() const { return !slices_.empty(); }

  // ZeRO-3 over a frozen base (a LoRA run's): the frozen weights each group keeps on the device (dense compute
  // copies, a QLoRA base's codes and scales) as one run of bytes, each tensor's storage at a 256-byte boundary as
  // allocate() laid it out, so a group gathered whole has the alignment it had resident (the GEMMs pick the same
  // algorithms: the same bits). Per group, its packed bytes (0 where nothing frozen is on the device; groups kept
  // on the host, keep_frozen_on_host, stream from there and are not packed).
  std::vector<int64_t> frozen_packed_bytes(DType act) const;
  // Keeps only this rank's slice of each group's packed bytes: [rank·chunk[g], (rank + 1)·chunk[g]) (zero padding
  // past the end), and frees the whole frozen buffers, so a rank holds about 1/world of the base. The packed
  // parameters' value (and scale) stay unbound until bind_frozen_packed points them into a gathered copy.
  void keep_frozen_shards(Ops& ops, int rank, const std::vector<int64_t>& chunk);
  // Whether the store holds exactly this cut (a store allocated by slices, StoreOptions::shards).
  bool holds_cut(const StoreShards& cut) const;
  bool frozen_sharded() const { return !frozen_slices_.empty(); }
  // Group g's slice (U8, chunk[g] bytes; empty when the group packs nothing).
  Tensor frozen_shard(int group) const;
  // Points group g's packed parameters into `bytes` (U8: the group's packed bytes gathered, at least
  // frozen_packed_bytes(act)[g] long), or unbinds them when it is empty.
  void bind_frozen_packed(int group, const Tensor& bytes);
  size_t frozen_shard_bytes() const { return frozen_slices_buf_.bytes(); }
  // Device bytes of the trainable buffers as allocated (the slices when sharded; values 0 where they are the
  // masters, on the CPU): what the memory plan and its test read.
  struct TrainableBytes {
    size_t masters, values, grads;
  };
  TrainableBytes trainable_bytes() const { return {masters_.bytes(), values_.bytes(), grads_.bytes()}; }
  // Group g's slice (chunk[g] elements) of the held masters, compute copies (the masters on the CPU), gradients.
  Tensor shard_masters(int group) const;
  Tensor shard_values(int group) const;
  Tensor shard_grads(int group) const;
  // Points group g's trainable parameters' value / grad / master into `base` (any device; the dtype of what
  // is bound), laid out as the group's flat range (element 0 is the group's first); an empty `base` unbinds.
  // The model reads Parameter::value and grad only, so a gathered copy of a layer is bound for its use.
  void bind_values(int group, const Tensor& base) { bind(group, base, &Parameter::value); }
  void bind_grads(int group, const Tensor& base) { bind(group, base, &Parameter::grad); }
  void bind_masters(int group, const Tensor& base) { bind(group, base, &Parameter::master); }

 private:
  std::vector<Parameter> params_;
  std::map<std::string, size_t> index_;
  int64_t numel_ = 0, decayed_numel_ = 0, frozen_numel_ = 0;
  std::vector<int64_t> group_begin_;  // element offset of each group, then the end
  std::vector<ParamRange> ranges_;
  Buffer masters_, values_, grads_;  // values_ stays empty when the activation dtype is F32
  Buffer frozen_;                    // frozen compute copies, activation dtype
  Buffer frozen_host_;               // keep_frozen_on_host: those groups' frozen compute copies, by group
  std::vector<int> frozen_host_groups_;
  uint64_t frozen_host_version_ = 0;
  // Per group: its element range [first, second) in frozen_host_ (empty when the group is not there).
  std::vector<std::pair<int64_t, int64_t>> frozen_host_range_;
  std::vector<int64_t> frozen_host_at_;  // per parameter: its element offset in frozen_host_ (-1: not there)
  bool on_host(const Parameter& p) const { return frozen_host_at_[size_t(&p - params_.data())] >= 0; }
  Tensor host_copy(const Parameter& p) const;  // a host-held frozen parameter's home
  Buffer quantised_;                           // frozen quantised weights: each one's codes, then its scales
  DType values_dtype_ = DType::F32;
  DType master_dtype_ = DType::F32;  // StoreOptions::masters
  bool masters_on_host_ = false;
  // The compute copy of `p` rounded on the host from fp32 `host` (masters in host memory: convert() reads
  // device tensors only); round to nearest even, as convert does.
  void round_value(Ops& ops, const Tensor& value, const float* host) const;
  bool gradients_ = true;  // allocate() made the flat gradient buffer (or keep_shards the slices')
  // drop_layer_grads: flat elements [0, host_grads_end_) have no home; each group's is what bind_grads bound
  bool layer_grads_bound_only_ = false;
  std::vector<Tensor> bound_grads_;  // per group (drop_layer_grads): the slot bound, or empty
  // move_layer_grads_to_host: flat elements [0, host_grads_end_) live in grads_host_, the rest in grads_ (from 0)
  Buffer grads_host_;
  int64_t host_grads_end_ = 0;
  Tensor grad_home(int64_t offset, int64_t numel) const;
  // ZeRO-3: per group the owned flat [begin, end) and where its slice starts in the held buffers.
  struct Slice {
    int64_t begin, end, at, chunk;
  };
  std::vector<Slice> slices_;
  // keep_frozen_shards: per group where its slice starts in frozen_slices_buf_ and its length (bytes); per
  // parameter its storage's byte offset in its group's packed bytes (-1: not packed).
  struct FrozenSlice {
    int64_t at = 0, chunk = 0;
  };
  std::vector<FrozenSlice> frozen_slices_;
  std::vector<int64_t> packed_at_;
  Buffer frozen_slices_buf_;
  int frozen_rank_ = 0;
  std::function<void(int group)> master_source_;
  std::vector<int64_t> packed_offsets(DType act, std::vector<int64_t>* group_bytes) const;
  bool packed(const Parameter& p) const { return !packed_at_.empty() && packed_at_[size_t(&p - params_.data())] >= 0; }
  int64_t storage_bytes(const Parameter& p) const;  // a frozen tensor's storage on the device, as allocated
  // The cuts: slices_ / held_ from the owned ranges, frozen_slices_ / packed_at_ from the byte chunks (each
  // returns the elements / bytes a rank holds), then the buffers are the caller's to make.
  int64_t cut_slices(const std::vector<std::pair<int64_t, int64_t>>& owned, const std::vector<int64_t>& chunk);
  int64_t cut_frozen(int rank, const std::vector<int64_t>& chunk);
  // A packed tensor's storage bytes (`span`, storage_bytes long): this rank's part of them into its slice.
  void store_packed(Ops& ops, const Parameter& p, const uint8_t* span);
  void upload_frozen_packed(Ops& ops, const Parameter& p, const float* host);
  void bind_storage(Parameter& p, char* base, Device device) const;  // value (and scale) over storage at `base`
  int64_t held_ = 0;                                                 // Σ chunk: the held buffers' length in elements
  int64_t held_offset(const ParamRange& r) const;                    // r's first element in the held buffers
  void bind(int group, const Tensor& base, Tensor Parameter::*member);
};

}  // namespace soltrain
