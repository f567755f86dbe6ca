// AdamW over a ParameterStore (torch semantics), with global-norm gradient clipping folded into the update.
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "model/parameters.h"

namespace soltrain {

class SafetensorsFile;

// How AdamW keeps its moments: fp32, or 8-bit blockwise as bitsandbytes' AdamW8bit does (kernels/blockwise8.h;
// `optimizer: adamw_8bit`): 2.03 bytes per parameter instead of 8, for parameters of 4096 elements or more; or as
// torchao's AdamW8bit does (`adamw_torch_8bit`): the same maps, blocks and update, but only a parameter of whole
// 256-element blocks is quantised (torchao keeps the others in fp32); or 4-bit as torchao's AdamW4bit does
// (`adamw_torch_4bit`, kernels/blockwise4.h): 1.06 bytes per parameter, tensors of whole 128-element blocks only.
enum class Moments { F32, Blockwise8, Torchao8, Torchao4 };
inline bool low_bit(Moments m) {
  return m != Moments::F32;
}
// Whether a parameter of n elements keeps 8-bit moments under `m`.
bool quantised_moments(Moments m, int64_t n);
// Elements per scale block of a quantised moment under low-bit `m` (blocks start at each parameter's first element).
int64_t moment_block(Moments m);

// Offload (`offload_master`, `offload_optimizer`; Surogate's and llmq's names): the fp32 masters and/or the
// moments (fp32 or 8-bit) live in host memory (pinned on CUDA) instead of the device, and each update streams
// them through the device `chunk` elements at a time: copied up on the upload stream into one of two staging
// slots while the previous chunk is updated on the main stream, then written back on the side stream
// (train/optimizer_offload.cpp). The update itself is the same kernel on the same values, so results equal the
// resident run's bit for bit.
struct Offload {
  bool master = false, optimizer = false;
  // 16M elements: 64 MiB per fp32 tensor, ~1.2 ms at the 53 GB/s PCIe 5 rate Surogate measured, long enough
  // to hide a copy's fixed cost; two slots of master + m + v then hold 384 MiB of device memory. Tests lower
  // it to cut the tiny models into many chunks.
  int64_t chunk = int64_t(16) << 20;
  // `offload_grads`: the decoder layers' gradients live in host memory (train/grad_offload.h); each piece's come
  // up with its state (read only: nothing of them goes back)
  bool grads = false;
  bool any() const { return master || optimizer || grads; }
};

// `optimizer: muon` (Axolotl's MuonOptimizerFactory, torch.optim.Muon): Muon (kernels/ops.h MuonParams) on every
// trained 2-D matrix but the embedding, the LM head and a classifier's score head, which, with the 1-D parameters,
// AdamW updates (the run's lr, betas and eps). Muon's momentum lives in the exp_avg buffer; exp_avg_sq holds only
// the AdamW-updated parameters' second moments (4 bytes per Muon parameter saved: 15 GiB at Qwen3-4B), and the
// state file has no exp_avg_sq for a Muon matrix (torch.optim.Muon keeps only momentum_buffer).
struct MuonSettings {
  float momentum = 0.95f;
  int ns_steps = 5;
  // Surogate's optimizer: normuon (NorMuon): momentum without Nesterov's look-ahead, Polar Express's iteration, the
  // variance reduction (an EMA of each row's or column's mean square, factor beta2) and cautious weight decay (none
  // without it, as Surogate's kernel passes 0).
  bool normuon = false;
  float beta2 = 0.95f;
  bool cautious_wd = true;
};
// Whether Muon updates `p` (a trained 2-D matrix that is not an embedding or head).
bool updated_by_muon(const Parameter& p);

struct OptimizerConfig {
  float lr = 1e-5f;
  double beta1 = 0.9, beta2 = 0.999;  // doubles, as torch takes them: float(1 - 0.999) is not 1 - float(0.999)
  float eps = 1e-8f, weight_decay = 0.0f;
  float max_grad_norm = 1.0f;  // <= 0 disables clipping
  Moments moments = Moments::F32;
  Offload offload{};  // (a default member initializer: brace-initialised configs that stop earlier stay -Wextra clean)
  std::optional<MuonSettings> muon{};  // Muon on the hidden matrices, AdamW on the rest
  // `optimizer_in_backward`: each layer updated as its backward ends (train/backward_update.h); no clipping
  bool in_backward = false;
};

class AdamW {
 public:
  // With `offload.master` the store's masters move to host memory here (before the first update, after they
  // were loaded); with `offload.optimizer` the moments are made there.
  // With `muon` the state is Muon's and AdamW's (OptimizerConfig::muon; updates must then say muon).
  // `normuon` (with muon): NorMuon's, whose matrices also keep a variance EMA (MuonSettings::normuon).
  AdamW(ParameterStore& params, Ops& ops, Moments moments = Moments::F32, Offload offload = {}, bool muon = false,
        bool normuon = false);
  // ZeRO 1-3: moments (and updates) for `shard` only, ranges of the flat buffers (data_parallel.h). Low-bit
  // moments need the shard cut on their blocks inside a quantised parameter (make_shard_plan cuts so): each
  // rank's pieces then hold exactly the single process's blocks, and the update is its bits. `offload` (master,
  // optimizer; not grads) streams the shard's pieces as the whole update streams the model's: with ZeRO-3 the
  // masters that move to host memory are the rank's slices.
  AdamW(ParameterStore& params, Ops& ops, std::vector<ParamRange> shard, Moments moments = Moments::F32,
        Offload offload = {});
  bool sharded() const { return shard_.has_value(); }
  // What an AdamW over `ps` allocates, from the parameters' shapes alone: the constructor sizes its buffers from
  // this, and `bench --plan-only` sizes a run with it before anything is allocated.
  struct Plan {
    size_t m = 0, v = 0, mq = 0, vq = 0, mabs = 0, vabs = 0, maps = 0;  // bytes of each buffer
    int64_t chunk = 0;                                                  // offload: elements per staged piece
    size_t slot = 0;                                                    // offload: bytes of each staging slot
    int64_t muon_u = 0, muon_ns = 0;  // Muon: elements of the Nesterov input and of Newton–Schulz's scratch
    size_t muon_scratch = 0;          // their bytes and Σu²'s, on the device
    size_t moments() const { return m + v + mq + vq + mabs + vabs; }  // in host memory with offload_optimizer
    size_t device(bool host_moments) const { return (host_moments ? 0 : moments()) + maps + 2 * slot + muon_scratch; }
  };
  // `muon`: Muon's state (fp32, resident) with its scratch in that activation dtype; `normuon` NorMuon's.
  // `shard`: a sharded optimizer's (the ranges it owns; not Muon, no offloaded gradients).
  static Plan plan(const ParameterStore& ps, Moments moments, Offload offload, std::optional<DType> muon = std::nullopt,
                   bool normuon = false, const std::vector<ParamRange>* shard = nullptr);
  // One update with learning rate `lr` (the schedule's value for this step), gradients read times
  // `grad_scale`, and times clipping's factor (torch's clip_grad_norm_, kernels/ops.h clip_factor) computed
  // on the device from `grad_sumsq` (F64 [1], Σg²) when given: nothing waits for the host between backward
  // and the update, and no pass scales the gradients (a separate one cost 10.6 ms of a 310 ms Qwen3-4B step).
  void step(const OptimizerConfig& cfg, float lr, float grad_scale = 1.0f, const Tensor* grad_sumsq = nullptr);
  // The same update in parts (`optimizer_in_backward`, train/backward_update.h): begin_parts() counts it, then
  // step_part(g) updates group g's parameters alone, once per group, each as soon as its gradients are final
  // (a layer's from the slot bound for its backward). No clipping: the global norm is known only after the last.
  // Every group updated so gives the bits step() gives (the same kernel on the same values, per element).
  void begin_parts() { ++step_; }
  void step_part(const OptimizerConfig& cfg, float lr, int group);
  int steps_done() const { return step_; }
  const char* optimizer_name() const {
    return normuon_                        ? "normuon"
           : muon_                         ? "muon"
           : moments_ == Moments::Torchao8 ? "adamw_torch_8bit"
           : moments_ == Moments::Torchao4 ? "adamw_torch_4bit"
                                           : "adamw";
  }
  size_t state_bytes() const;        // the moments' device memory (with offload: the two staging slots)
  size_t host_state_bytes() const {  // the offloaded moments
    return offload_.optimizer ? m_.bytes() + v_.bytes() + mq_.bytes() + vq_.bytes() + mabs_.bytes() + vabs_.bytes() : 0;
  }

  // The state as a safetensors file: `exp_avg.<name>` and `exp_avg_sq.<name>` per trainable parameter (fp32,
  // or the 8-bit codes with `exp_avg.absmax.<name>` / `exp_avg_sq.absmax.<name>`: resumed bit for bit) and the
  // step count in the metadata. load() also reads the first format (two flat tensors).
  // A sharded optimizer saves its shard: flat `exp_avg` / `exp_avg_sq` with the ranges they hold (offsets
  // into the flat buffers) and a fingerprint of that layout in the metadata; with low-bit moments the pieces of
  // each parameter it holds, named as the whole file names them, with each piece's first element and length.
  void save(const std::filesystem::path& file) const;
  void load(const std::filesystem::path& file);
  // Reads one full file or a set of shard files (any number of ranks) and keeps what this one holds.
  void load(const std::vector<std::filesystem::path>& files);

 private:
  // load()'s low-bit form: files of codes and absmax per quantised moment, fp32 for the rest, and the step; a
  // whole file or any rank count's pieces, each slot filled from every piece that overlaps it.
  void load_low_bit(const std::vector<std::filesystem::path>& files);
  // load()'s sharded fp32 form: every file's ranges copied where they meet the shard (optimizer.cpp)
  void load_shard_fp32(const std::vector<std::filesystem::path>& files);
  // With low-bit moments, where each parameter's state lives (a sharded optimizer's: each piece it owns,
  // elements [at, at + numel) of the parameter, `at` on a block boundary): codes at `offset` bytes and absmax at
  // `block` floats into the low-bit buffers, or (parameters under 4096 elements) fp32 at `offset` floats into
  // m_ / v_.
  struct Slot {
    const Parameter* param;
    bool quantised;
    int64_t offset, block;
    int64_t at, numel;
  };
  ParamRange range(const Slot& s, int64_t at, int64_t numel) const;  // elements [at, at + numel) of the slot
  // Both constructors' state from the plan: fp32 moments (offload: the masters moved, pieces_ and the staging
  // slots), or make_low_bit_state's slots_, codes, absmax and maps.
  void make_state(const Plan& pl);
  void make_low_bit_state(const Plan& pl);
  Blockwise8 quantised(const Slot& s, bool second) const;
  Tensor fp32_moment(const Slot& s, bool second) const;
  void step_8bit(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq);
  // The update with masters and/or moments in host memory, streamed through stage_ (optimizer_offload.cpp):
  // stream_pieces runs pieces 0 .. count-1, each staged tensor's home copied to its place in a slot before
  // `update` and back after it; the two updates say what a piece stages and how it is updated.
  struct Staged {
    Tensor home, stage;
    bool back = true;  // written home after the update (a gradient is only read)
  };
  void stream_pieces(size_t count, const std::function<std::vector<Staged>(size_t)>& staged,
                     const std::function<void(size_t, const std::vector<Staged>&)>& update);
  void step_streamed(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq);
  // The update after the count: every group's, or (step_part) only_group_'s.
  void update(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq);
  int only_group_ = -1;
  // AdamWParams::sr_seed of a call whose first element is the store's flat `offset` (bf16 masters' rounding: each
  // element draws from (step, its offset), however the update is cut)
  uint64_t sr_seed(int64_t offset) const;
  bool updates(int group) const { return only_group_ < 0 || group == only_group_; }
  void step_streamed_8bit(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq);
  // Muon's update (cfg.muon): per parameter, Muon's three ops or AdamW; its scratch made on the first call.
  void step_muon(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq);
  Buffer muon_u_, muon_ns_, muon_sumsq_;  // the Nesterov input, Newton–Schulz's scratch, Σu² (F64)
  std::vector<bool> muon_param_;          // per parameter of the store (its order): Muon updates it
  // per parameter: where its exp_avg_sq starts in v_ (AdamW's only), or NorMuon's variance EMA of a matrix
  // [max(rows, cols)]
  std::vector<int64_t> muon_v_at_;
  bool muon_ = false;     // the state holds Muon's momentum (said in the file's metadata)
  bool normuon_ = false;  // ... and NorMuon's variance EMAs

  ParameterStore& params_;
  Ops& ops_;
  Moments moments_ = Moments::F32;
  // fp32: laid out like the parameters' flat buffers, or the shard's ranges one after another (8-bit: the
  // small parameters only)
  Buffer m_, v_;
  std::optional<std::vector<ParamRange>> shard_;
  std::vector<Slot> slots_;              // 8-bit only
  Buffer mq_, vq_, mabs_, vabs_, maps_;  // 8-bit codes, absmax per block, the two maps [2, 256]
  int step_ = 0;
  Offload offload_;
  int64_t chunk_ = 0;  // elements per staged chunk (offload only)
  // Offload: the update's pieces, each range (the shard's when sharded) cut into chunks of at most chunk_ (fixed
  // by the store's layout: cut once here, not every step), and where each one's moments start in m_ / v_ (the
  // flat offset, or the shard's local one). adamw() is elementwise, so any cut gives the resident update's bits.
  struct Piece {
    ParamRange range;
    int64_t moments_at;
  };
  std::vector<Piece> pieces_;
  // 8-bit offload: pieces of one slot (slots_[slot]) each, from its element `at`, whole blocks but the last.
  struct Piece8 {
    size_t slot;
    int64_t at, numel;
  };
  std::vector<Piece8> pieces8_;
  // offload: per slot [master chunk (offload_master) | m chunk | v chunk (offload_optimizer) | gradient chunk
  // (offload_grads)]
  Buffer stage_[2];
};

}  // namespace soltrain
