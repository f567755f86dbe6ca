// `soltrain bench` and `soltrain bench-attention`: timing of whole training steps on random tokens, and of
// the attention kernels alone. Each prints one JSON line for bench/run_bench.py to tabulate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "cli/commands.h"
#include "cli/config_schema.h"
#include "cli/device_option.h"
#include "cli/launch_workers.h"
#include "core/error.h"
#include "dist/launch.h"
#include "model/activation_plan.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/random_weights.h"
#include "train/background_save.h"
#include "train/comm_volume.h"
#include "train/data_parallel.h"
#include "train/mfu.h"
#include "train/optimizer_settings.h"
#include "train/run_builder.h"
#include "train/train_step.h"
#include "train/zero3.h"

namespace soltrain {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TrainConfig bench_model_settings(int lora_rank, const std::string& qlora, const char* command) {
  if (lora_rank <= 0 && qlora != "none")
    user_error(command, ": --qlora ", qlora, " needs --lora-rank (a quantised base is frozen)");
  TrainConfig c;
  c.seed = 1;
  c.lora.enabled = lora_rank > 0;
  c.lora.rank = lora_rank;
  c.lora.alpha = 2.0 * lora_rank;
  c.lora.dropout = 0.0;
  if (qlora != "none")
    c.lora.base = qlora == "nf4"     ? WeightFormat::Nf4
                  : qlora == "int8"  ? WeightFormat::Int8Row
                  : qlora == "nvfp4" ? WeightFormat::Nvfp4
                                     : WeightFormat::Fp8Block;
  c.lora.base_key = "--qlora";
  return c;
}

namespace {
struct BenchOpts {
  std::string model, device = "cuda";
  int batch = 8, seq = 2048, steps = 10, warmup = 3, lora_rank = 0, data_parallel = -1, gpus = 1, accumulation = 1;
  int resident_layers = 0;
  int64_t token_tile = 0;
  bool plan_only = false, offload_activations = false, offload_weights = false, profile = true, random_weights = false;
  bool optimizer_in_backward = false, bf16_stochastic_round = false;
  std::string recompute = "none", residual_dtype = "auto", optimizer = "adamw", qlora = "none", recipe = "bf16";
  std::string attention_backward = "split";
  std::string offload = "none";
  std::string fp8_scaling = "delayed";
  // --plan-only over a cluster: the --gpus ranks on this many nodes, the links' bandwidths (GB/s a GPU sends
  // in a ring: NCCL's bus bandwidth) and the compute rate the step time is estimated from
  int nodes = 1;
  std::string intra_node = "nvlink";
  double nvlink_gbs = 360, pcie_gbs = 50, ib_gbs = 45, tflops = 989, mfu = 0.4;
  // Checkpoints during the timed steps (their cost on the step time): every save_steps, written as training
  // writes them (background: from a host snapshot by a writer thread; direct: before the next step).
  int save_steps = 0;
  std::string save_mode = "background", save_dir = "/tmp/soltrain-bench-checkpoints";
};

// bench's --offload: where AdamW's fp32 masters and moments, and the layers' gradients, live.
Offload bench_offload(const BenchOpts& o) {
  Offload offload;
  offload.master = o.offload == "master" || o.offload == "both" || o.offload == "all";
  offload.optimizer = o.offload == "optimizer" || o.offload == "both" || o.offload == "all";
  offload.grads = o.offload == "grads" || o.offload == "all";
  return offload;
}

// bench's run as a training config (the settings it times), so its adapters, model settings and optimizer are
// made by the run builder as every run's are (train/run_builder.h). LoRA: all seven projections, alpha 2r, no
// dropout; its base quantised (--qlora) or streamed (--offload-weights) as asked. One line and exit 2 for a flag
// that needs another.
TrainConfig bench_config(const BenchOpts& o) {
  if (o.lora_rank <= 0 && o.offload_weights)
    user_error("bench --offload-weights needs --lora-rank (it streams a frozen base)");
  if (o.resident_layers > 0 && !o.offload_weights)
    user_error("bench --offload-weights-resident-layers needs --offload-weights");
  TrainConfig c = bench_model_settings(o.lora_rank, o.qlora, "bench");
  c.sequence_len = o.seq;
  c.offload_weights = o.offload_weights;  // (a quantised base and fp8-hybrid are refused where they meet it)
  c.offload_weights_resident_layers = o.resident_layers;
  c.residual_dtype = parse_residual_dtype(o.residual_dtype, "--residual-dtype");
  c.attention_backward = parse_attention_backward(o.attention_backward, "--attention-backward");
  c.token_tile = o.token_tile;
  c.offload_activations = o.offload_activations;  // (plan() refuses it without --recompute full)
  c.recompute = parse_recompute(o.recompute, "--recompute");
  c.fp8_hybrid = o.recipe == "fp8-hybrid";
  c.fp8.delayed = o.fp8_scaling == "delayed";
  c.learning_rate = 1e-5;
  c.adamw_beta2 = 0.95;
  c.weight_decay = 0.1;
  // the config key's names and meanings (cli/config_schema.h); Muon as its config rule allows it
  if (!set_optimizer(c, o.optimizer))
    user_error("bench --optimizer ", o.optimizer, ": ", optimizer_refusal(o.optimizer));
  c.offload = bench_offload(o);
  if (o.optimizer_in_backward) {  // (as the config rule asks: no clipping)
    c.optimizer_in_backward = true;
    c.max_grad_norm = 0;
  }
  c.bf16_stochastic_round = o.bf16_stochastic_round;
  // what training refuses, in its words (bench's own flags stand for the keys the rule reads)
  TrainConfig as_trained = c;
  as_trained.gradient_accumulation_steps = o.accumulation;
  as_trained.zero_stage = std::max(0, o.data_parallel);
  as_trained.gpus = o.gpus;
  for (const SettingRefusal& r : optimizer_setting_refusals(as_trained)) user_error("bench: ", r.text);
  return c;
}

// --plan-only: the activation plan the run would allocate (Transformer::plan's list), one JSON line.
// The device memory the plan's totals count.
struct PlannedTotals {
  double weights = 0, grads = 0, optimizer = 0;  // GiB
};

// Data parallel (--data-parallel, --gpus): what rank 0 (the largest share) holds, with NCCL (or MPI on the CPU),
// both in place: the run's own sizing (make_shard_plan, DataParallel::staging_bytes, Zero3::planned). Updates `t`.
nlohmann::json data_parallel_plan(const BenchOpts& o, const ModelConfig& c, ParameterStore& ps,
                                  const ParameterStore::PlannedBytes& w, const AdamW::Plan& opt,
                                  const ActivationPlan& p, DType act, size_t slots, const Offload& offload,
                                  PlannedTotals& t) {
  const double gib = double(size_t(1) << 30);
  const bool host_moments = offload.optimizer;
  const int world = o.gpus, zero = std::max(0, o.data_parallel);
  OptimizerConfig opt_cfg;
  opt_cfg.moments = bench_config(o).moments;
  opt_cfg.offload = offload;
  if (const char* why = sharded_update_refusal(opt_cfg, zero))
    user_error("bench --offload ", o.offload, " with --data-parallel ", zero, " is not built yet (", why, ")");
  ps.lay_out();
  ShardPlan sp = make_shard_plan(ps, 0, world, opt_cfg.moments);
  if (zero == 3) sp.frozen_chunk = frozen_chunks(ps.frozen_packed_bytes(act), world);  // (as DataParallel cuts it)
  size_t masters = w.masters, values = w.values, grad_bytes = w.grads, gathered = 0, scratch = 0, peak = 0;
  size_t frozen = w.frozen + w.quantised;  // the base on the device: whole, or this rank's slices of it
  size_t moments = zero >= 1
                       ? AdamW::plan(ps, opt_cfg.moments, offload, std::nullopt, false, &sp.owned).device(host_moments)
                       : opt.device(host_moments);
  const size_t staging = DataParallel::staging_bytes(sp, zero, /*comm_in_place=*/true, offload.master);
  if (offload.master) masters = 0;  // (in host memory)
  if (zero == 3) {
    const Zero3::Bytes z = Zero3::planned(sp, c.num_layers, dtype_size(act), /*whole=*/world == 1);
    grad_bytes = size_t(z.held_elements) * 4;
    masters = offload.master ? 0 : grad_bytes;
    values = act == DType::F32 ? 0 : size_t(z.held_elements) * dtype_size(act);  // (the CPU's are the masters)
    gathered = z.gathered, scratch = z.grad_scratch;
    if (!sp.frozen_chunk.empty()) frozen = z.frozen_held;
    // The load's peak: each rank allocates its slices alone and reads only their bytes (StoreOptions::shards),
    // so loading holds the slices (masters on the device until offload_master moves them), the frozen base's
    // slices and offload_weights' slots, all of which the steady plan holds too: the run's peak is that plan.
    peak = size_t(z.held_elements) * 4 + values + grad_bytes + frozen + slots;
  }
  t.weights = double(w.weights() - w.masters - w.values - w.frozen - w.quantised + masters + values + frozen +
                     gathered + slots) /
              gib;
  t.grads = double(grad_bytes + scratch + staging) / gib;
  t.optimizer = double(moments) / gib;
  // What rank 0 sends per update (the shard plan's collectives), over the slowest link its rings cross, next to
  // its compute at the given rate: the step takes the longer of the two when the collectives hide behind compute
  // (the side stream's design), their sum when nothing overlaps.
  const CommVolume v = comm_volume(sp, zero, int(c.num_layers), o.accumulation, dtype_size(act));
  const bool across = o.nodes > 1;
  const double intra = o.intra_node == "pcie" ? o.pcie_gbs : o.nvlink_gbs;
  const double link = across ? std::min(o.ib_gbs, intra) : intra;
  const double tokens = double(o.batch) * o.seq * o.accumulation;
  const bool lora = o.lora_rank > 0;
  // (recompute full runs each layer's forward again: 2N more per token over 6N, or over LoRA's 4N)
  const double recompute = o.recompute == "full" ? (lora ? 6.0 / 4.0 : 8.0 / 6.0) : 1.0;
  const double compute_ms =
      model_flops_per_token(c, o.seq, lora) * recompute * tokens / (o.tflops * 1e12 * o.mfu) * 1e3;
  const double comm_ms = v.total() / (link * 1e9) * 1e3;
  const nlohmann::json communication{{"nodes", o.nodes},
                                     {"link", across ? "infiniband" : o.intra_node},
                                     {"link_gb_per_s", link},
                                     {"all_gather_gib", v.all_gather / gib},
                                     {"reduce_scatter_gib", v.reduce_scatter / gib},
                                     {"all_reduce_gib", v.all_reduce / gib},
                                     {"collectives", v.all_gathers + v.reduce_scatters + v.all_reduces},
                                     {"comm_ms", comm_ms},
                                     {"compute_ms", compute_ms},  // at tflops x mfu
                                     {"step_ms", std::max(comm_ms, compute_ms)},
                                     {"step_ms_serial", comm_ms + compute_ms},
                                     {"tokens_per_s", double(world) * tokens / std::max(comm_ms, compute_ms) * 1e3}};
  return {{"ranks", world},
          {"zero_stage", zero},
          {"master_bytes", masters},
          {"value_bytes", values},
          {"grad_bytes", grad_bytes},
          {"moment_bytes", moments},
          {"gather_bytes", gathered},  // (a sharded frozen base's gather buffers too)
          {"frozen_bytes", frozen},    // the frozen base held on the device: its slices under ZeRO-3
          {"grad_scratch_bytes", scratch},
          {"staging_bytes", staging},
          {"load_peak_gib", double(peak) / gib},  // ZeRO-3: what a rank holds when its slices are loaded
          {"communication", communication}};      // per update, rank 0
}

int print_activation_plan(const BenchOpts& o) {
  const ModelConfig c = load_model_config(o.model);
  const TrainConfig bench = bench_config(o);
  const std::optional<LoraConfig> lora = lora_config(bench, "bench");
  const DType act = o.device == "cuda" ? DType::BF16 : DType::F32;
  ActivationSettings s{o.batch,
                       o.seq,
                       bench.recompute,
                       act,
                       residual_dtype_for(act, bench.residual_dtype, lora.has_value()),
                       lora ? &*lora : nullptr,
                       bench.token_tile,
                       head_chunk_bytes_for(act, !lora),  // bench's LoRA freezes the head
                       bench.offload_activations};
  if (o.offload_activations && s.recompute != Recompute::Full)
    user_error("bench --offload-activations needs --recompute full (it offloads the layer-input checkpoints)");
  const ActivationPlan p = plan_activations(c, s);
  const double gib = double(size_t(1) << 30);
  nlohmann::json buffers = nlohmann::json::array();
  size_t checkpoints = 0;
  for (const PlannedBuffer* b : p.largest()) {
    if (b->checkpoint) checkpoints += b->total_bytes();
    buffers.push_back({{"name", b->name},
                       {"shape", b->shape},
                       {"gib", double(b->bytes()) / gib},
                       {"copies", b->copies},
                       {"host_copies", b->host_copies},
                       {"checkpoint", b->checkpoint}});
  }
  // The weights, gradients and optimizer state the run would hold (ParameterStore::planned_bytes, as allocate()
  // lays them out), so one line says whether a run fits; the CUDA context and cuBLAS workspace are not counted.
  ParameterStore ps;
  add_model_parameters(ps, c, lora);
  const ParameterStore::PlannedBytes w = ps.planned_bytes(act, store_options(bench).masters);
  const Offload offload = bench.offload;
  const bool host_master = offload.master, host_moments = offload.optimizer;
  const AdamW::Plan opt =
      AdamW::plan(ps, bench.moments, offload, bench.muon ? std::optional(act) : std::nullopt, bench.normuon);
  const size_t slots = 2 * size_t(w.largest_host_group) * dtype_size(act);
  double weights = double(w.weights() - (host_master ? w.masters : 0) + slots) / gib;
  double optimizer = double(opt.device(host_moments)) / gib, grads = double(w.grads) / gib, host_grads = 0;
  if (offload.grads || bench.optimizer_in_backward) {  // the head's group stays; the layers' use two slots
    const GradOffload::Plan g = GradOffload::plan(ps, int(c.num_layers));  // (train/grad_offload.h, backward_update.h)
    host_grads = offload.grads ? double(g.host) / gib : 0.0;
    grads = double(g.device()) / gib;
  }
  // recipe fp8-hybrid: the projections' FP8 W and Wᵀ copies (2 bytes a weight), their scaling state and the casts'
  // scratch, as the run's Fp8Recipe allocates them
  double fp8 = 0;
  if (bench.fp8_hybrid) {
    if (c.moe_layers() > 0) user_error(moe_refusal(c, MoeUnsupported::Fp8Recipe));
    fp8 =
        double(Fp8Recipe::planned(Transformer::fp8_projection_shapes(c, bench.fp8), bench.fp8, int64_t(o.batch) * o.seq)
                   .total()) /
        gib;
  }
  PlannedTotals t{weights, grads, optimizer};
  const nlohmann::json parallel =
      o.data_parallel >= 0 || o.gpus > 1 ? data_parallel_plan(o, c, ps, w, opt, p, act, slots, offload, t) : nullptr;
  weights = t.weights, grads = t.grads, optimizer = t.optimizer;
  nlohmann::json r{{"engine", "soltrain"},
                   {"plan_only", true},
                   {"batch", o.batch},
                   {"seq", o.seq},
                   {"recompute", o.recompute},
                   {"lora_rank", o.lora_rank},
                   {"token_tile", p.tile},
                   {"head_chunk", p.head_chunk},
                   {"offload_activations", o.offload_activations},
                   {"activation_gib", double(p.total_bytes()) / gib},
                   {"checkpoint_gib", double(checkpoints) / gib},  // on the device (the ring, when offloaded)
                   {"checkpoint_host_gib", double(p.host_bytes()) / gib},
                   {"largest_activations", describe_largest(p, 4)},
                   {"offload_weights", o.offload_weights},
                   {"weight_gib", weights},  // masters (unless offloaded), compute copies, frozen base, its slots
                   {"weight_host_gib", double(w.frozen_host + (host_master ? w.masters : 0)) / gib},
                   {"weight_slots_gib", double(slots) / gib},
                   {"grad_gib", grads},
                   {"optimizer_gib", optimizer},
                   {"fp8_gib", fp8},  // recipe fp8-hybrid's FP8 weight copies, scaling state and cast scratch
                   {"optimizer_host_gib", host_moments ? double(opt.moments()) / gib : 0.0},
                   {"grad_host_gib", host_grads},
                   {"total_gib", double(p.total_bytes()) / gib + weights + grads + optimizer + fp8},
                   {"data_parallel", parallel},  // per rank (null: one process)
                   {"buffers", buffers}};
  std::cout << r.dump() << std::endl;
  return 0;
}
}  // namespace

namespace {
// bench's rows: random token ids (each rank its own), every next token a target.
HostBatch random_rows(const BenchOpts& o, int vocab, int rank) {
  HostBatch batch{o.batch, o.seq, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937 rng(1234u + unsigned(rank));
  for (int i = 0; i < o.batch * o.seq; ++i) batch.input_ids.push_back(int32_t(rng() % uint32_t(vocab)));
  batch.targets = batch.input_ids;
  std::rotate(batch.targets.begin(), batch.targets.begin() + 1, batch.targets.end());
  return batch;
}

// The timed run: the trainer's own step path over random rows, steps back to back; one JSON line of the
// median step, throughput, memory and the per-op profile.
int run_bench(const BenchOpts& o) {
  if (o.gpus % o.nodes != 0)
    user_error("bench --nodes ", o.nodes, " needs --gpus a multiple of it (got --gpus ", o.gpus, ")");
  if (o.plan_only) return print_activation_plan(o);
  if (o.nodes > 1) user_error("bench --nodes plans a cluster run: use it with --plan-only (a run uses this node)");
  const LaunchEnv env = read_launch_env();
  const Device device = o.device == "cuda" ? Device::CUDA : Device::CPU;  // the flag admits only these two
  if (o.gpus > 1 && env.kind == LaunchEnv::Kind::Single) return launch_workers(o.gpus, device);
  select_local_device(env, device);
  auto ops = make_ops(o.device);
  const bool parallel = env.world_size > 1 || o.data_parallel >= 0;
  std::unique_ptr<Communicator> comm;
  if (parallel) {
    // Alone with --data-parallel: NCCL (or MPI on the CPU) at world size 1, the path's own cost.
    comm = make_communicator(env, *ops, env.world_size > 1 ? "" : ops->device() == Device::CUDA ? "nccl" : "mpi");
    if (comm->size() > 1) set_error_prefix(cat("rank ", comm->rank(), ": "));
  }
  const int zero_stage = std::max(0, o.data_parallel), rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  // (bench's checkpoints are one process's: over ranks, or ZeRO-3's streamed saves, `soltrain sft` writes them)
  if (o.save_steps > 0 && (world > 1 || zero_stage == 3))
    user_error("bench --save-steps times one process's checkpoints: not with ", world > 1 ? "several ranks" : "",
               world > 1 && zero_stage == 3 ? " or " : "", zero_stage == 3 ? "--data-parallel 3" : "",
               " (soltrain sft writes those)");
  const TrainConfig bench = bench_config(o);
  const std::optional<LoraConfig> lora = lora_config(bench, "bench");
  // A speed run of FP8 on the CPU's emulation would time nothing real.
  if (o.recipe == "fp8-hybrid" && ops->device() != Device::CUDA)
    user_error(
        "bench --recipe fp8-hybrid times FP8 GEMMs: it needs an NVIDIA GPU of compute capability 8.9 or newer "
        "(the CPU only emulates them, for tests)");
  // (ZeRO-3 allocates and loads only this rank's slices, as training does)
  const bool gradients = !(comm && zero_stage == 3);
  StoreOptions store = store_options(bench, gradients);
  if (comm && zero_stage == 3) store = sliced_for_zero3(store, *comm, bench.moments, /*shard_frozen=*/true);
  auto model = o.random_weights ? random_pretrained(o.model, *ops, lora, store, uint64_t(bench.seed))
                                : load_pretrained(o.model, *ops, lora, store);
  const HostBatch batch = random_rows(o, model->config().vocab_size, rank);
  configure_model(*model, bench, *ops, o.batch);
  if (bench.offload.any() && (o.data_parallel >= 1 || world > 1))
    user_error("bench --offload ", o.offload, ": one process without ZeRO only (as training)");
  const OptimizerConfig cfg = optimizer_config(bench);
  // the trainer's own step path; counted_all: every rank's targets (each rank's rows count the same)
  TrainStep train_step = comm ? TrainStep(*model, cfg, *comm, zero_stage) : TrainStep(*model, cfg);
  const std::vector<HostBatch> micro(size_t(o.accumulation), batch);  // the same rows each micro-batch
  const int64_t counted_all = int64_t(o.batch) * o.seq * world * o.accumulation;
  // Each step timed from the end of the previous one's work on the main stream to the end of its own:
  // steps run back to back as in training, so work a step leaves in flight on the side stream (data
  // parallel's weight gathers, overlapped with the next forward) counts where it delays the next step.
  std::vector<double> times;
  SnapshotPool snapshots([&ops](size_t n) { return ops->alloc_host(n); });
  BackgroundSave writer;
  if (o.save_steps > 0 && o.save_mode == "background")  // as training does: the pinned pool filled before step 1
    snapshot_checkpoint(std::filesystem::path(o.save_dir) / "checkpoint-warmup", bench, *model, train_step.optimizer(),
                        TrainerState{}, &snapshots);
  std::vector<double> save_times;  // each checkpoint's time on the training thread
  ops->synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    train_step.run(micro, cfg.lr, counted_all);
    // A checkpoint after this step (none after the last: its write would fall outside the timed steps).
    if (o.save_steps > 0 && s >= o.warmup && (s + 1 - o.warmup) % o.save_steps == 0 && s + 1 < o.warmup + o.steps) {
      train_step.settle();
      const auto ts = std::chrono::steady_clock::now();
      const TrainerState state{s + 1, o.warmup + o.steps, {}, bench.seed};
      const std::filesystem::path dir = std::filesystem::path(o.save_dir) / cat("checkpoint-", s + 1);
      writer.wait();
      if (o.save_mode == "background")
        writer.start(snapshot_checkpoint(dir, bench, *model, train_step.optimizer(), state, &snapshots), s + 1);
      else
        save_checkpoint(dir, bench, *model, train_step.optimizer(), state);
      save_times.push_back(seconds_since(ts));
    }
    ops->host_wait(ops->mark());
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    t0 = t1;
  }
  writer.wait();
  ops->synchronize();
  const double loss = train_step.loss();
  // One more step with per-op device timing, for the breakdown (the profiled step is not in step_s).
  std::map<std::string, double> profile;
  if (o.profile) {
    ops->enable_profiling(true);
    train_step.run(micro, cfg.lr, counted_all);
    profile = ops->collect_profile();
    ops->enable_profiling(false);
  }
  const double step = median(times), tokens = double(o.batch) * o.seq * world * o.accumulation;
  const double memory = ops->memory_used_gib();
  if (rank != 0) return 0;  // rank 0 speaks for all (its step time is the job's: every step ends in collectives)
  nlohmann::json r{
      {"engine", "soltrain"},
      {"trainable_params", model->params().numel()},
      {"lora_rank", o.lora_rank},
      {"qlora", o.qlora},
      {"weight_gib", double(model->params().weight_bytes()) / double(1u << 30)},
      {"recompute", o.recompute},
      {"recipe", o.recipe == "bf16" ? o.recipe : o.recipe + " " + o.fp8_scaling},
      {"optimizer", o.optimizer},
      {"offload", o.offload},
      {"optimizer_in_backward", o.optimizer_in_backward},
      {"bf16_stochastic_round", o.bf16_stochastic_round},
      {"data_parallel", o.data_parallel},
      {"gpus", world},
      {"residual_dtype", model->residual_dtype() == DType::F32 ? "fp32" : "bf16"},
      {"attention_backward", attention_backward_name(ops->attention_backward_form())},
      {"batch", o.batch},
      {"gradient_accumulation", o.accumulation},
      {"seq", o.seq},
      {"step_s", step},
      {"mean_step_s", std::accumulate(times.begin(), times.end(), 0.0) / double(times.size())},
      {"saves", save_times.size()},
      {"save_mode", o.save_mode},
      {"save_s", std::accumulate(save_times.begin(), save_times.end(), 0.0)},
      {"save_s_each", save_times},
      {"tokens_per_s", tokens / step},
      {"memory_gib", memory},
      {"optimizer_gib", double(train_step.optimizer().state_bytes()) / double(1u << 30)},
      {"offload_activations", o.offload_activations},
      {"activation_gib", double(model->activation_bytes()) / double(1u << 30)},
      {"checkpoint_host_gib", double(model->checkpoint_host_bytes()) / double(1u << 30)},
      {"offload_weights", o.offload_weights},
      {"streamed_layers", model->weight_stream() ? model->weight_stream()->streamed() : 0},
      {"weight_host_gib",
       double(model->params().host_frozen_bytes() + model->params().host_master_bytes()) / double(1u << 30)},
      {"weight_slots_gib",
       double(model->weight_stream() ? model->weight_stream()->device_bytes() : 0) / double(1u << 30)},
      {"token_tile", model->activation_plan().tile},
      {"largest_activations", describe_largest(model->activation_plan(), 4)},
      {"loss", loss},
      {"profile_ms", profile}};
  std::cout << r.dump() << std::endl;
  return 0;
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  using Opts = BenchOpts;
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("bench", "time full training steps (AdamW) on random tokens");
  c->add_option("--recompute", o->recompute, "activation recompute: none, elementwise, selective or full")
      ->check(CLI::IsMember({"none", "elementwise", "selective", "full"}))
      ->capture_default_str();
  c->add_option("--attention-backward", o->attention_backward,
                "how attention's backward forms dQ on Hopper: split, ordered (both bitwise repeatable) or atomic "
                "(the setting attention_backward; SOLTRAIN_ATTENTION_BACKWARD wins over it)")
      ->check(CLI::IsMember({"split", "ordered", "atomic"}))
      ->capture_default_str();
  c->add_option("--residual-dtype", o->residual_dtype,
                "the residual stream's dtype on the GPU: auto (fp32 with LoRA, else bf16), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  c->add_option("--optimizer", o->optimizer,
                "the config's optimizer names: adamw (fp32 moments), adamw_8bit (bitsandbytes' 8-bit blockwise), "
                "adamw_torch_8bit / adamw_torch_4bit (torchao's), muon or normuon")
      ->capture_default_str();
  c->add_option("--offload", o->offload,
                "fp32 state in host memory, streamed through the GPU each update: none, optimizer (the AdamW "
                "moments: offload_optimizer), master (offload_master), both, grads (the decoder layers' gradients: "
                "offload_grads) or all three")
      ->check(CLI::IsMember({"none", "optimizer", "master", "both", "grads", "all"}))
      ->capture_default_str();
  c->add_flag("--bf16-stochastic-round", o->bf16_stochastic_round,
              "the trained weights in bf16 only, updates rounded stochastically (bf16_stochastic_round)");
  c->add_flag("--optimizer-in-backward", o->optimizer_in_backward,
              "each layer updated as its backward ends (optimizer_in_backward): no whole-model gradients, no "
              "clipping");
  c->add_option("--data-parallel", o->data_parallel,
                "run the step through the data-parallel path at this ZeRO stage (0-3) with a communicator of one "
                "rank (NCCL on the GPU): what its collectives, events and hooks cost")
      ->check(CLI::Range(0, 3));
  c->add_option("--gpus", o->gpus,
                "data parallel over N worker processes, one per GPU (NCCL; ZeRO stage from --data-parallel, 0 "
                "by default); each rank steps its own --batch-size rows and rank 0 prints tokens/s of all")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  c->add_option("--lora-rank", o->lora_rank, "LoRA on all seven projections with this rank (alpha 2r); 0 = full")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--qlora", o->qlora,
                "hold the frozen base of a LoRA run quantised: nf4 (bitsandbytes' NF4, double quantised), fp8 "
                "(E4M3, 128x128 blocks) or int8 (LLM.int8's rows, load_in_8bit); needs --lora-rank")
      ->check(CLI::IsMember({"none", "nf4", "fp8", "int8", "nvfp4"}))
      ->capture_default_str();
  c->add_option("--recipe", o->recipe, "bf16, or fp8-hybrid (the projections' GEMMs in FP8: needs a GPU of sm_89+)")
      ->check(CLI::IsMember({"bf16", "fp8-hybrid"}))
      ->capture_default_str();
  c->add_option("--fp8-scaling", o->fp8_scaling, "fp8-hybrid's activation/gradient scales: delayed or current")
      ->check(CLI::IsMember({"delayed", "current"}))
      ->capture_default_str();
  c->add_option("--token-tile", o->token_tile, "the MLP's token tile for long sequences (0 = automatic)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_flag("--offload-activations", o->offload_activations,
              "offload_activations: with --recompute full, the layer-input checkpoints in pinned host memory, a "
              "ring of two on the GPU (copied out in forward, prefetched a layer ahead in backward)");
  c->add_flag("--offload-weights", o->offload_weights,
              "offload_weights: with --lora-rank, the frozen base's decoder layers in pinned host memory, streamed "
              "through two layer slots on the GPU (each copied in while the layer before it computes)");
  c->add_option("--offload-weights-resident-layers", o->resident_layers,
                "with --offload-weights: keep this many of the base's layers on the GPU (the streamed ones spread "
                "evenly between them)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_flag("!--no-profile", o->profile,
              "skip the extra step timed op by op (its breakdown, profile_ms): a 256k-token step takes minutes");
  c->add_flag("--plan-only", o->plan_only,
              "print the activation plan (every buffer, largest first) from config.json alone and exit: no "
              "weights are loaded, no device is needed (a 500k-token plan on any machine); with --gpus N and "
              "--data-parallel Z, what each rank holds");
  c->add_option("--nodes", o->nodes,
                "with --plan-only: the --gpus ranks spread over this many nodes (their rings cross InfiniBand)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  c->add_option("--intra-node", o->intra_node, "with --plan-only: the link between a node's GPUs, nvlink or pcie")
      ->check(CLI::IsMember({"nvlink", "pcie"}))
      ->capture_default_str();
  // (the figures the step time is planned from: GB/s a GPU moves in a ring, and its compute rate)
  for (const auto& [flag, value, what] :
       {std::tuple{"--nvlink-gbs", &o->nvlink_gbs, "NVLink's GB/s per GPU in a ring (H100 NVLink4)"},
        std::tuple{"--pcie-gbs", &o->pcie_gbs, "PCIe's GB/s per GPU in a ring (PCIe 5 x16)"},
        std::tuple{"--ib-gbs", &o->ib_gbs, "InfiniBand's GB/s per GPU in a ring (one NDR 400 port)"},
        std::tuple{"--tflops", &o->tflops, "the GPU's dense bf16 TFLOP/s (H100/H200 SXM)"}})
    c->add_option(flag, *value, std::string("with --plan-only: ") + what)
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
  c->add_option("--mfu", o->mfu, "with --plan-only: the share of --tflops the step's FLOPs run at")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  c->add_flag("--random-weights", o->random_weights,
              "base weights drawn as transformers initialises them instead of read: the model folder needs only "
              "config.json (a 61 GB model timed without its checkpoint on the disk)");
  c->add_option("--model", o->model, "Hugging Face model folder")->required();
  c->add_option("--batch-size", o->batch)->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--seq-len", o->seq)->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--steps", o->steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--gradient-accumulation", o->accumulation,
                "micro-batches per update (each step: that many forward + backward passes, then one update; "
                "tokens/s counts them all)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--warmup", o->warmup)->check(CLI::NonNegativeNumber)->capture_default_str();
  c->add_option("--save-steps", o->save_steps,
                "a checkpoint every N timed steps, into --save-dir (mean_step_s then shows its cost)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--save-mode", o->save_mode, "background (host snapshot, writer thread) or direct")
      ->check(CLI::IsMember({"background", "direct"}))
      ->capture_default_str();
  c->add_option("--save-dir", o->save_dir, "where --save-steps writes its checkpoints")->capture_default_str();
  add_device_option(c, o->device);
  return [o]() { return run_bench(*o); };
}

// Device tensors for the kernel benchmarks (bench-attention, bench-grouped-gemm), alive as long as this is;
// random ones are normal(0, scale), filled through an fp32 staging copy.
class BenchTensors {
 public:
  explicit BenchTensors(Ops& ops) : ops_(ops) {}
  Tensor empty(Shape s, DType t) {
    held_.push_back(std::make_unique<Buffer>(ops_.alloc(size_t(shape_numel(s)) * dtype_size(t))));
    return Tensor{held_.back()->data(), t, std::move(s), ops_.device()};
  }
  Tensor zeros(Shape s, DType t) {
    Tensor x = empty(std::move(s), t);
    ops_.zero(x);
    return x;
  }
  Tensor randn(Shape s, DType t, float scale, std::mt19937& rng) {
    Tensor x = empty(std::move(s), t);
    std::vector<float> h(size_t(x.numel()));
    std::normal_distribution<float> nd(0.0f, scale);
    for (float& v : h) v = nd(rng);
    const Tensor host{h.data(), DType::F32, x.shape, Device::CPU};
    if (t == DType::F32) {
      ops_.copy(x, host);
    } else {
      const Tensor staged = empty(x.shape, DType::F32);
      ops_.copy(staged, host);
      ops_.convert(x, staged);
    }
    return x;
  }

 private:
  Ops& ops_;
  std::vector<std::unique_ptr<Buffer>> held_;
};

std::function<int()> add_bench_attention_command(CLI::App& app) {
  struct Opts {
    int batch = 8, heads = 16, kv_heads = 8, seq = 2048, head_dim = 128, iters = 20;
    std::string device = "cuda";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("bench-attention", "time causal flash attention forward and backward");
  c->add_option("--batch", o->batch)->capture_default_str();
  c->add_option("--heads", o->heads)->capture_default_str();
  c->add_option("--kv-heads", o->kv_heads)->capture_default_str();
  c->add_option("--seq-len", o->seq)->capture_default_str();
  c->add_option("--head-dim", o->head_dim)->capture_default_str();
  c->add_option("--iters", o->iters)->capture_default_str();
  add_device_option(c, o->device);
  return [o]() {
    auto ops = make_ops(o->device);
    const int64_t N = int64_t(o->batch) * o->seq, H = o->heads, Hkv = o->kv_heads, hd = o->head_dim;
    const DType dt = ops->activation_dtype();
    BenchTensors make(*ops);
    std::mt19937 rng(7);
    const Tensor q = make.randn({N, H, hd}, dt, 1, rng), k = make.randn({N, Hkv, hd}, dt, 1, rng),
                 v = make.randn({N, Hkv, hd}, dt, 1, rng), dout = make.randn({N, H, hd}, dt, 1, rng);
    Tensor out = make.empty({N, H, hd}, dt), dq = make.empty({N, H, hd}, dt), dk = make.empty({N, Hkv, hd}, dt),
           dv = make.empty({N, Hkv, hd}, dt), lse = make.empty({H, N}, DType::F32);
    std::vector<int32_t> cu(static_cast<size_t>(o->batch) + 1), pos(static_cast<size_t>(N));
    for (int b = 0; b <= o->batch; ++b) cu[size_t(b)] = b * o->seq;
    for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = int32_t(n % o->seq);
    const Tensor tcu = make.empty({int64_t(cu.size())}, DType::I32);
    const Tensor tpos = make.empty({N}, DType::I32);
    ops->copy(tcu, Tensor{cu.data(), DType::I32, tcu.shape, Device::CPU});
    ops->copy(tpos, Tensor{pos.data(), DType::I32, tpos.shape, Device::CPU});
    const SeqLayout seq{tcu, tpos, o->seq};
    const float scale = 1.0f / std::sqrt(float(hd));
    // Each call timed twice: by device events around the op (the CUDA backend's per-op profile: what
    // METHOD.md asks for, and what fwd_ms / bwd_ms report where the backend has them) and by the host clock
    // around the synchronised call (fwd_host_ms / bwd_host_ms; all the CPU backend has).
    std::vector<double> fwd, bwd, fwd_host, bwd_host;
    ops->enable_profiling(true);
    for (int i = 0; i < o->iters + 3; ++i) {
      ops->synchronize();
      auto t0 = std::chrono::steady_clock::now();
      ops->attention_forward(out, lse, q, k, v, seq, scale);
      ops->synchronize();
      const double f = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      ops->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seq, scale);
      ops->synchronize();
      const double b = seconds_since(t0);
      const std::map<std::string, double> device = ops->collect_profile();  // this iteration's, in ms
      if (i < 3) continue;
      const auto at = [&](const char* op, double host) {
        const auto it = device.find(op);
        return it != device.end() && it->second > 0 ? it->second * 1e-3 : host;
      };
      fwd_host.push_back(f), bwd_host.push_back(b);
      fwd.push_back(at("attention_forward", f)), bwd.push_back(at("attention_backward", b));
    }
    ops->enable_profiling(false);
    // causal: half of the 4·B·H·T²·hd forward FLOPs; backward 2.5x forward (the FlashAttention convention)
    const double flops = 4.0 * o->batch * H * double(o->seq) * o->seq * hd / 2;
    nlohmann::json r{{"engine", "soltrain"},
                     {"batch", o->batch},
                     {"heads", H},
                     {"kv_heads", Hkv},
                     {"seq", o->seq},
                     {"head_dim", hd},
                     {"fwd_ms", median(fwd) * 1e3},
                     {"bwd_ms", median(bwd) * 1e3},
                     {"fwd_host_ms", median(fwd_host) * 1e3},
                     {"bwd_host_ms", median(bwd_host) * 1e3},
                     {"fwd_tflops", flops / median(fwd) / 1e12},
                     {"bwd_tflops", 2.5 * flops / median(bwd) / 1e12}};
    std::cout << r.dump() << std::endl;
    return 0;
  };
}

// The experts' grouped GEMM (kernels/cuda/grouped_gemm.cu) on one MoE layer's shapes, next to the two ways
// without it: one dense GEMM of the same rows and FLOPs (its ceiling: all rows against one weight), and cuBLASLt
// run once per expert on host-known counts (a launch per expert, and a host sync to learn the counts). Routing is
// random top-k over the experts, optionally skewed (--skew s: expert e drawn with weight 1/(e+1)^s).
std::function<int()> add_bench_grouped_gemm_command(CLI::App& app) {
  struct Opts {
    int tokens = 4096, experts = 128, top_k = 8, hidden = 2048, width = 768, iters = 20;
    double skew = 0;
    std::string device = "cuda";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("bench-grouped-gemm", "time the experts' grouped GEMMs (one MoE projection)");
  c->add_option("--tokens", o->tokens)->capture_default_str();
  c->add_option("--experts", o->experts)->capture_default_str();
  c->add_option("--top-k", o->top_k)->capture_default_str();
  c->add_option("--hidden", o->hidden, "the projection's input width (gate/up: hidden size)")->capture_default_str();
  c->add_option("--width", o->width, "its output width (gate/up: the experts' intermediate size)")
      ->capture_default_str();
  c->add_option("--skew", o->skew, "routing skew: expert e drawn with weight 1/(e+1)^skew (0: uniform)")
      ->capture_default_str();
  c->add_option("--iters", o->iters)->capture_default_str();
  add_device_option(c, o->device);
  return [o]() {
    auto ops = make_ops(o->device);
    const int64_t E = o->experts, K = o->top_k, M = int64_t(o->tokens) * K, in = o->hidden, out = o->width;
    if (K > E) user_error("--top-k ", K, " is more than --experts ", E);
    // the pairs' experts, distinct per token, counted into offsets
    std::mt19937 rng(11);
    std::vector<double> weights(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) weights[size_t(e)] = 1.0 / std::pow(double(e + 1), o->skew);
    std::vector<int64_t> count(static_cast<size_t>(E));
    for (int t = 0; t < o->tokens; ++t) {
      std::vector<double> w = weights;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = std::discrete_distribution<int64_t>(w.begin(), w.end())(rng);
        ++count[size_t(e)];
        w[size_t(e)] = 0;
      }
    }
    std::vector<int32_t> off(static_cast<size_t>(E) + 1);
    for (int64_t e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + int32_t(count[size_t(e)]);
    const DType dt = ops->activation_dtype();
    BenchTensors make(*ops);
    const Tensor x = make.randn({M, in}, dt, 1, rng), w = make.randn({E, out, in}, dt, 0.02f, rng),
                 dy = make.randn({M, out}, dt, 1, rng);
    Tensor y = make.zeros({M, out}, dt), dx = make.zeros({M, in}, dt), dw = make.zeros({E, out, in}, DType::F32);
    const Tensor offsets = make.empty({E + 1}, DType::I32);
    ops->copy(offsets, Tensor{off.data(), DType::I32, offsets.shape, Device::CPU});
    std::vector<double> grouped_f, grouped_dx, grouped_dw, dense_f, loop_f;
    const Tensor w0{w.data, dt, {out, in}, w.device};
    ops->enable_profiling(true);
    for (int i = 0; i < o->iters + 3; ++i) {
      ops->synchronize();
      auto t0 = std::chrono::steady_clock::now();
      ops->grouped_linear_forward(y, x, w, offsets);
      ops->synchronize();
      const double f = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      ops->grouped_linear_backward(&dx, false, nullptr, dy, x, w, offsets);
      ops->synchronize();
      const double b = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      ops->grouped_linear_backward(nullptr, false, &dw, dy, x, w, offsets);
      ops->synchronize();
      const double g = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      ops->linear_forward(y, x, w0, nullptr);
      ops->synchronize();
      const double d = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (int64_t e = 0; e < E; ++e) {  // the counts known on the host: one cuBLASLt GEMM per expert
        const int64_t r0 = off[size_t(e)], n = off[size_t(e) + 1] - r0;
        if (n == 0) continue;
        ops->linear_forward(
            y.rows(r0, r0 + n), x.rows(r0, r0 + n),
            Tensor{static_cast<char*>(w.data) + size_t(e * out * in) * dtype_size(dt), dt, {out, in}, w.device},
            nullptr);
      }
      ops->synchronize();
      const double l = seconds_since(t0);
      ops->collect_profile();
      if (i < 3) continue;
      grouped_f.push_back(f), grouped_dx.push_back(b), grouped_dw.push_back(g), dense_f.push_back(d);
      loop_f.push_back(l);
    }
    ops->enable_profiling(false);
    const double flops = 2.0 * double(M) * double(in) * double(out);
    const auto tf = [&](const std::vector<double>& v) { return flops / median(v) / 1e12; };
    int64_t largest = 0;
    for (int64_t n : count) largest = std::max(largest, n);
    nlohmann::json r{{"tokens", o->tokens},
                     {"experts", E},
                     {"top_k", K},
                     {"in", in},
                     {"out", out},
                     {"skew", o->skew},
                     {"rows", M},
                     {"largest_expert_rows", largest},
                     {"grouped_fwd_ms", median(grouped_f) * 1e3},
                     {"grouped_fwd_tflops", tf(grouped_f)},
                     {"grouped_dx_tflops", tf(grouped_dx)},
                     {"grouped_dx_ms", median(grouped_dx) * 1e3},
                     {"grouped_dw_tflops", tf(grouped_dw)},
                     {"grouped_dw_ms", median(grouped_dw) * 1e3},
                     // what dw moves at least: both operands once, its fp32 output read and written
                     {"grouped_dw_gb_per_s", (double(M) * double(in + out) * double(dtype_size(dt)) +
                                              2.0 * double(E) * double(in) * double(out) * 4.0) /
                                                 median(grouped_dw) / 1e9},
                     {"dense_same_flops_tflops", tf(dense_f)},
                     {"cublaslt_per_expert_tflops", tf(loop_f)},
                     {"timing", "host clock around each synchronised call"}};
    std::cout << r.dump() << std::endl;
    return 0;
  };
}

}  // namespace soltrain
