// The training loop. Gradient accumulation follows HF Trainer with num_items_in_batch: the update's loss is
// the sum of token losses over all micro-batches divided by all their counted tokens, so a micro-batch
// with more trained tokens weighs more (not the mean of per-micro-batch means). The pieces below run in
// order: set up (data, model, loader, schedule) → resume → print the plan → the loop of updates (logging,
// evaluation, checkpoints) → the final save.
#include "train/run_training.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <ostream>
#include <span>

#include "core/error.h"
#include "core/host_memory.h"
#include "data/batch_file.h"
#include "data/loader.h"
#include "model/checkpoint.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"
#include "train/curves_svg.h"
#include "train/evaluate.h"
#include "train/failed_write.h"
#include "train/loss_watchdog.h"
#include "train/metrics.h"
#include "train/mfu.h"
#include "train/stop_signal.h"
#include "train/train_checkpoint.h"
#include "train/train_data.h"
#include "train/train_step.h"

namespace soltrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int64_t total_training_steps(const TrainConfig& c, int64_t micro_batches_per_epoch) {
  if (c.max_steps > 0) return c.max_steps;
  // HF: updates per epoch = micro-batches // accumulation (at least 1), times the epochs, rounded up.
  const int64_t per_epoch = std::max<int64_t>(1, micro_batches_per_epoch / c.gradient_accumulation_steps);
  return std::max<int64_t>(1, int64_t(std::ceil(c.num_epochs * double(per_epoch))));
}

namespace {

std::string fmt_loss(double v) {
  return std::isfinite(v) ? cat(std::round(v * 1e4) / 1e4) : "n/a";
}

// Everything a run holds between its pieces.
struct Run {
  const TrainConfig& c;
  const char* cmd;
  std::ostream& log;  // rank 0's log; other ranks get a stream that prints nothing
  Ops& ops;
  Communicator* comm = nullptr;  // null (or the single-process one): a single process
  int rank = 0, world = 1;
  // The data-parallel step path: more than one rank, or a real communicator at world size 1 (NCCL or MPI
  // alone, which must train bitwise as the single process does).
  bool dp = false;
  bool lead() const { return rank == 0; }
  TrainData data;
  std::optional<LoraConfig> lora;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Loader> loader;
  size_t data_bytes = 0;  // the tokenized training and validation data, held in host memory
  int64_t micro_per_epoch = 0;
  int64_t save_steps = 0, eval_steps = 0;  // the config's, or from saves_per_epoch / evals_per_epoch
  ScheduleConfig sched;
  OptimizerConfig opt;
  std::unique_ptr<TrainStep> step;
  TrainerState state;
  // ZeRO-3's sharded weights (null otherwise): checkpoints and evaluation go through it.
  Zero3* zero3() const { return step && step->data_parallel() ? step->data_parallel()->zero3() : nullptr; }
};

void set_up(Run& r) {
  const TrainConfig& c = r.c;
  fs::create_directories(c.output_dir);
  // Rank 0 tokenizes into the shared cache first; the others then read it.
  if (r.lead()) r.data = prepare_train_data(c, r.log);
  if (r.dp) r.comm->barrier();
  if (!r.lead()) r.data = prepare_train_data(c, r.log);
  if (c.lora.enabled) {
    r.lora = LoraConfig{c.lora.rank,           float(c.lora.alpha), float(c.lora.dropout),
                        c.lora.target_modules, c.lora.use_rslora,   c.seed};
    r.lora->base_format = c.lora.base;
    r.lora->offload_base = c.offload_weights;
    r.lora->offload_resident_layers = c.offload_weights_resident_layers;
    r.lora->validate("config.yaml");
  }
  // ZeRO-3 gives each rank only its slices of the gradients: no full-size buffer is made for them here.
  r.model = load_pretrained(c.model, r.ops, r.lora, /*gradients=*/!(r.dp && c.zero_stage == 3));
  for (const ShardSet* set : {&r.data.train, &r.data.validation})
    for (int32_t id : set->tokens)
      if (id < 0 || id >= r.model->config().vocab_size)
        user_error(c.model.string(), ": the tokenizer produced id ", id, " but the model's vocab_size is ",
                   r.model->config().vocab_size);

  for (const ShardSet* set : {&r.data.train, &r.data.validation})
    r.data_bytes += set->tokens.size() * sizeof(int32_t) + set->mask.size() + set->doc_offsets.size() * sizeof(int64_t);
  LoaderOptions lo;
  lo.rows = c.per_device_train_batch_size;
  lo.seq_len = c.sequence_len;
  lo.seed = c.seed;
  lo.pack = c.sample_packing;
  lo.shuffle = c.shuffle;
  r.loader = std::make_unique<Loader>(std::move(r.data.train), lo);
  r.micro_per_epoch = (r.loader->rows_in_epoch(0) + lo.rows - 1) / lo.rows;
  // Data parallel: an update takes accumulation × world micro-batches (floor(m / (a·w)) = floor(floor(m / w) / a)).
  const int64_t total = total_training_steps(c, r.micro_per_epoch / r.world);
  r.sched = ScheduleConfig{c.lr_scheduler_type, total, c.warmup_steps, c.wsd_decay_ratio, c.cosine_min_lr_ratio};
  if (c.warmup_steps == 0 && c.warmup_ratio > 0) r.sched.warmup_steps = warmup_from_ratio(total, c.warmup_ratio);

  r.model->set_residual_dtype(c.residual_dtype);
  r.ops.set_attention_backward(c.attention_backward);
  if (c.fp8_hybrid) r.model->enable_fp8(c.fp8);  // (data parallel: TrainStep max-reduces the amaxes)
  r.model->set_token_tile(c.token_tile);
  r.model->set_offload_checkpoints(c.offload_activations);
  r.model->plan(lo.rows, lo.seq_len, c.recompute);
  r.opt = OptimizerConfig{float(c.learning_rate), c.adamw_beta1,          c.adamw_beta2, float(c.adamw_epsilon),
                          float(c.weight_decay),  float(c.max_grad_norm), c.moments,     c.offload};
  // (the config reader refuses offload with ZeRO first; this names the settings for the rest)
  if (const char* why = r.dp ? sharded_update_refusal(r.opt, c.zero_stage) : nullptr)
    user_error(c.moments == Moments::Blockwise8 ? "optimizer: adamw_8bit" : "offload_master / offload_optimizer",
               " with zero_stage ", c.zero_stage, " is not built yet (", why,
               "); use zero_stage: 0", c.moments == Moments::Blockwise8 ? " or optimizer: adamw_torch" : "");
  r.step = r.dp ? std::make_unique<TrainStep>(*r.model, r.opt, *r.comm, c.zero_stage)
                : std::make_unique<TrainStep>(*r.model, r.opt);
  r.state.total_steps = total;
  r.state.seed = c.seed;
  // Axolotl's per-epoch counts, in optimizer steps of this run's epoch.
  const int64_t steps_per_epoch = std::max<int64_t>(1, r.micro_per_epoch / r.world / c.gradient_accumulation_steps);
  auto every = [&](double per_epoch) { return std::max<int64_t>(1, int64_t(double(steps_per_epoch) / per_epoch)); };
  r.save_steps = c.save_steps == 0 && c.saves_per_epoch > 0 ? every(c.saves_per_epoch) : c.save_steps;
  r.eval_steps = c.eval_steps == 0 && c.evals_per_epoch > 0 ? every(c.evals_per_epoch) : c.eval_steps;
}

void resume_or_start(Run& r) {
  const TrainConfig& c = r.c;
  const int64_t total = r.state.total_steps;
  if (const auto from = resolve_resume(c)) {
    if (r.zero3()) r.zero3()->masters_for_loading();  // read whole, then each rank keeps its slices
    r.state = load_checkpoint(*from, *r.model, r.step->optimizer());
    if (r.zero3()) r.zero3()->scatter_loaded_masters();
    if (r.state.seed != c.seed)
      user_error(from->string(), ": checkpoint was trained with seed ", r.state.seed, ", config says ", c.seed,
                 " (the data order would differ)");
    r.loader->restore(r.state.loader);
    r.state.total_steps = total;
    r.log << r.cmd << ": resuming from " << from->string() << " at step " << r.state.step << "\n";
  } else if (c.resume_from_checkpoint.kind == ResumeFrom::kLatest) {
    r.log << r.cmd << ": resume_from_checkpoint: true, but " << c.output_dir.string()
          << " has no checkpoint yet: starting fresh\n";
  } else if (const auto old = list_checkpoints(c.output_dir); !old.empty()) {
    r.log
        << r.cmd << ": note: starting fresh although " << old.back().string()
        << " exists (resume_from_checkpoint: true continues it); checkpoints of this run replace same-numbered ones\n";
  }
}

// First of all: what kind of training this is, and what the config reader decided for the user.
void print_intent(const Run& r) {
  for (const std::string& n : r.c.notes) r.log << r.cmd << ": " << n << "\n";
  if (!r.c.lora.enabled) {
    r.log << r.cmd << ": full fine-tune\n";
    return;
  }
  std::string mods;
  for (const std::string& m : r.c.lora.target_modules) mods += (mods.empty() ? "" : ",") + m.substr(0, m.find("_proj"));
  r.log << r.cmd << ": LoRA r" << r.c.lora.rank << " on " << mods;
  if (r.c.lora.base != WeightFormat::Dense)
    r.log << " over a frozen " << (r.c.lora.base == WeightFormat::Nf4 ? "NF4" : "FP8 (128x128 blocks)") << " base ("
          << r.c.lora.base_key << ")";
  r.log << "\n";
}

// offload_weights' two device slots (0 when the base is resident).
size_t stream_slot_bytes(const Transformer& m) {
  return m.weight_stream() ? m.weight_stream()->device_bytes() : 0;
}

// Host memory: what the run holds there (the batch's pinned staging, the tokenized data; on the CPU backend
// every buffer of the plan) against the real limit, a container's cgroup rather than MemTotal. Each large
// host buffer was checked against what was available as it was allocated (Buffer::host, alloc_host); they
// are all allocated by now and count in the usage, so the plan as a whole is held against the limit.
void print_host_plan(const Run& r) {
  const double gib = double(1u << 30);
  // Offloaded masters and moments: host memory on either backend (pinned on CUDA, where each buffer was also
  // checked as it was allocated).
  const size_t offloaded = r.model->params().host_master_bytes() + r.step->optimizer().host_state_bytes();
  const size_t checkpoints = r.model->checkpoint_host_bytes();  // offload_activations
  const size_t base = r.model->params().host_frozen_bytes();    // offload_weights
  size_t planned = r.model->staging_bytes() + r.data_bytes + offloaded + checkpoints + base;
  if (r.ops.device() == Device::CPU)
    planned += r.model->params().weight_bytes() + 4 * size_t(r.model->params().numel()) +
               r.step->optimizer().state_bytes() + r.model->activation_bytes() + stream_slot_bytes(*r.model);
  const HostMemory m = read_host_memory();
  r.log << r.cmd << ": host memory: " << double(planned) / gib << " GiB planned (batch staging "
        << double(r.model->staging_bytes()) / gib << " GiB" << (r.ops.device() == Device::CPU ? "" : " pinned")
        << ", tokenized data " << double(r.data_bytes) / gib << " GiB"
        << (offloaded ? cat(", offloaded masters and moments ", double(offloaded) / gib, " GiB") : std::string())
        << (checkpoints ? cat(", offloaded layer-input checkpoints ", double(checkpoints) / gib, " GiB")
                        : std::string())
        << (base ? cat(", the offloaded base's layers ", double(base) / gib, " GiB") : std::string())
        << (r.ops.device() == Device::CPU ? ", and every buffer above: the CPU backend's device is the host" : "")
        << "); " << describe_host_memory(m) << "\n";
  HostMemory whole = m;
  whole.available = m.limit;
  const std::string refusal = host_memory_refusal(planned, whole, "the memory plan");
  if (!refusal.empty()) throw UserError(refusal);
}

void print_plan(const Run& r) {
  const TrainConfig& c = r.c;
  const ParameterStore& ps = r.model->params();
  r.log << r.cmd << ": " << r.model->config().architecture << " " << double(ps.numel()) / 1e6 << "M parameters on "
        << device_name(c.device) << "; " << r.loader->documents() << " training documents (" << r.micro_per_epoch
        << " micro-batches of " << c.per_device_train_batch_size << " x " << c.sequence_len << " per epoch), "
        << r.data.validation.documents() << " validation; " << r.state.total_steps << " steps, gradient accumulation "
        << c.gradient_accumulation_steps << ", lr " << c.learning_rate << " " << to_string(c.lr_scheduler_type)
        << " (warmup " << r.sched.warmup_steps << ")\n";
  if (r.dp)
    r.log << r.cmd << ": data parallel over " << r.world << " ranks (" << r.comm->backend() << "), ZeRO stage "
          << c.zero_stage << ": global batch " << c.per_device_train_batch_size << " x "
          << c.gradient_accumulation_steps << " x " << r.world << " micro-batches per update\n";
  if (const Zero3* z = r.zero3()) {
    // Exact bytes as allocated, so a test can check that each persistent piece is 1/world of the model.
    const ParameterStore::TrainableBytes held = ps.trainable_bytes();
    const Zero3::Bytes b = z->bytes();
    r.log << r.cmd << ": ZeRO-3 per rank: " << b.held_elements << " of the model's " << b.trainable_elements
          << " trainable elements held: masters " << held.masters << " B, compute copy " << held.values
          << (held.values ? " B" : " B (the masters are the CPU's compute copy)") << ", gradients " << held.grads
          << " B, AdamW moments " << r.step->optimizer().state_bytes() << " B; ";
    if (b.gathered + b.grad_scratch == 0)  // train/zero3.h: one rank's slices are whole, collectives in place
      r.log << "one rank's slices are whole groups: they are the gather and gradient buffers\n";
    else
      r.log << "while a pass runs, gather buffers " << b.gathered << " B and gradient scratch " << b.grad_scratch
            << " B (two layers and the embedding/head group)\n";
  }
  // The memory plan, all allocated already (a run that does not fit has stopped before this line).
  const double gib = double(1u << 30), trainable = double(ps.numel());
  // Every weight's storage as allocated: fp32 masters of the trainable ones, the compute copies (bf16 on the
  // GPU; on the CPU the masters are the compute copy, and frozen weights are fp32 values), and a QLoRA base's
  // quantised codes with their scales (NF4: 0.5 byte + 1/64 byte absmax code per weight; FP8: 1 byte + an
  // fp32 per 128x128 block).
  const double weights = double(ps.weight_bytes());
  std::string quantised;
  if (ps.quantised_bytes() > 0) {
    // Plus the scratch a linear dequantises its weight into, sized for the largest projection.
    int64_t widest = 0;
    for (const Parameter& p : ps.all())
      if (p.format != WeightFormat::Dense) widest = std::max(widest, shape_numel(p.shape));
    quantised = cat(" (the quantised base ", double(ps.quantised_bytes()) / gib, " GiB of it; + ",
                    double(widest) * double(dtype_size(r.ops.activation_dtype())) / gib,
                    " GiB to dequantise one weight at a time)");
  }
  // ZeRO-3: the slices, plus the buffers a group is gathered into and its gradients computed in.
  const Zero3* z = r.zero3();
  const double gathered = z ? double(z->bytes().gathered) : 0.0;
  const double grads = z ? double(ps.trainable_bytes().grads + z->bytes().grad_scratch) : 4 * trainable;
  const double streamed = double(stream_slot_bytes(*r.model));
  const double moments = double(r.step->optimizer().state_bytes()), activations = double(r.model->activation_bytes());
  const double total = weights + gathered + streamed + grads + moments + activations + double(r.model->fp8_bytes());
  r.log << r.cmd << ": memory plan: weights " << (weights + gathered + streamed) / gib << " GiB" << quantised
        << ", gradients " << grads / gib << " GiB, AdamW moments " << moments / gib
        << (r.opt.moments == Moments::Blockwise8 ? " GiB (8-bit)" : " GiB") << ", activations " << activations / gib
        << " GiB (recompute " << recompute_name(c.recompute) << ", residual stream "
        << (r.model->residual_dtype() == DType::F32 ? "fp32" : "bf16") << ", MLP token tile "
        << r.model->activation_plan().tile << "); largest: " << describe_largest(r.model->activation_plan(), 4)
        << "; total " << total / gib << " GiB"
        << (r.ops.device() == Device::CUDA ? " (and the CUDA context and workspace, ~0.6 GiB)" : "") << "\n";
  // (the form the GPU runs: SOLTRAIN_ATTENTION_BACKWARD wins over the setting)
  const ModelConfig& mc = r.model->config();
  const AttentionBackward form = r.ops.attention_backward_form();
  const int64_t rows = c.per_device_train_batch_size, T = c.sequence_len;
  if (const size_t a = attention_backward_scratch_bytes(form, rows * T, rows, T, mc.num_heads, mc.head_dim);
      a && r.ops.device() == Device::CUDA) {
    const size_t per_doc = attention_backward_scratch_bytes(form, rows * T, rows + 1, T, mc.num_heads, mc.head_dim) - a;
    r.log << r.cmd << ": attention_backward: " << attention_backward_name(form) << ": on Hopper its dQ sums take "
          << double(a) / gib << " GiB more at one document per row, and " << double(per_doc) / double(1 << 20)
          << " MiB for each further document packed into a micro-batch (outside the total above)\n";
  }
  if (const size_t host = r.model->checkpoint_host_bytes()) {
    const PlannedBuffer* ck = r.model->activation_plan().find("resid");
    r.log << r.cmd << ": offload_activations: the layer-input checkpoints take " << double(host) / gib
          << " GiB of host memory (" << ck->host_copies << " x " << double(ck->bytes()) / gib << " GiB) and a ring of "
          << ck->copies << " on the device, " << double(ck->total_bytes()) / gib
          << " GiB (counted in activations above); each is copied out as forward writes it and back one layer "
             "ahead of backward\n";
  }
  if (const WeightStream* w = r.model->weight_stream()) {
    r.log << r.cmd << ": offload_weights: " << w->streamed() << " of the frozen base's " << r.model->config().num_layers
          << " decoder layers take " << double(ps.host_frozen_bytes()) / gib
          << " GiB of host memory; the device streams them through two slots, " << double(w->device_bytes()) / gib
          << " GiB (counted in weights above), copying each in while the layers before it compute\n";
  }
  if (c.offload.any()) {
    // Where the update's fp32 state lives: host (offloaded) next to the device's staging slots.
    const AdamW& opt = r.step->optimizer();
    r.log << r.cmd << ": offload: host memory holds " << (c.offload.master ? "the fp32 masters " : "")
          << (c.offload.master ? cat(double(ps.host_master_bytes()) / gib, " GiB") : std::string())
          << (c.offload.master && c.offload.optimizer ? " and " : "")
          << (c.offload.optimizer ? cat("the AdamW moments ", double(opt.host_state_bytes()) / gib, " GiB")
                                  : std::string())
          << "; the device stages them in two chunks, " << double(opt.state_bytes()) / gib
          << " GiB (counted in AdamW moments above), each update streaming them through it\n";
  }
  if (const Fp8Recipe* f = r.model->fp8()) {
    const Fp8Settings& s = f->settings();
    r.log << r.cmd << ": recipe fp8-hybrid: the decoder layers' projections in FP8 (E4M3 forward, E5M2 gradients; "
          << (s.delayed ? cat("delayed scaling, amax history ", s.amax_history) : std::string("current scaling"))
          << (s.margin ? cat(", margin ", s.margin) : std::string());
    if (s.skip_first_layers || s.skip_last_layers)
      r.log << "; first " << s.skip_first_layers << " and last " << s.skip_last_layers << " layers in bf16";
    r.log << "); its FP8 weight copies, scales and scratch " << double(r.model->fp8_bytes()) / gib << " GiB\n";
  }
  print_host_plan(r);
}

// The per-step log: progress line, metrics files; MFU against the matmul rate measured at the start.
class StepLogger {
 public:
  StepLogger(const Run& r, MetricsLog* metrics, ProgressLine& progress, std::function<void()> save)
      : r_(r),
        metrics_(metrics),
        progress_(progress),
        save_(std::move(save)),
        start_(Clock::now()),
        first_step_(r.state.step),
        watchdog_(r.c.loss_watchdog_threshold, r.c.loss_watchdog_patience) {
    if (r.ops.device() == Device::CPU) return;
    matmul_tflops_ = measure_matmul_tflops(r.ops);
    flops_per_token_ = model_flops_per_token(r.model->config(), r.c.sequence_len, r.c.lora.enabled);
    r.log << r.cmd << ": measured bf16 matmul rate " << matmul_tflops_ << " TFLOP/s (the MFU roof); "
          << flops_per_token_ / 1e9 << " GFLOP per token\n";
  }

  // After update `state.step` (1-based), queued from `t0` on. Reads the loss back (waiting for the update to
  // finish) only when it logs, or when `must_check` (a checkpoint follows: it must not hold a diverged
  // model), and times the step then. The watchdog sees every value read: a NaN or infinite loss or gradient
  // norm, or loss_watchdog_threshold exceeded, stops the run (as Axolotl's watchdog, on logged steps).
  void after_update(double lr, Clock::time_point t0, bool must_check) {
    const TrainConfig& c = r_.c;
    const int64_t step = r_.state.step, total = r_.state.total_steps;
    // A terminal gets the line redrawn every step; logs and files get one entry per logging_steps.
    const bool log_step = step % c.logging_steps == 0 || step == total;
    if (!log_step && !progress_.tty() && !must_check) return;
    StepMetrics m;
    m.step = step;
    m.total_steps = total;
    m.loss = r_.step->loss();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    m.lr = lr;
    m.grad_norm = r_.step->grad_norm();
    watchdog_.after_step(step, m.loss, m.grad_norm, r_.step->counted() > 0, c.learning_rate, c.output_dir);
    m.tokens = r_.step->counted();
    const LoaderState& ls = r_.loader->state();
    m.epoch = double(ls.epoch) + double(ls.index) / double(r_.loader->documents());
    m.tokens_per_s =
        double(c.per_device_train_batch_size) * c.sequence_len * c.gradient_accumulation_steps * r_.world / dt;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    m.seconds_left = elapsed / double(step - first_step_) * double(total - step);
    m.gpu_memory_gib = r_.ops.device() == Device::CPU ? 0.0 : r_.ops.memory_used_gib();
    if (matmul_tflops_ > 0) m.mfu = m.tokens_per_s * flops_per_token_ / (matmul_tflops_ * 1e12);
    if (log_step && metrics_) write_or_save_and_stop([&] { metrics_->train(m); }, save_);  // a full disk stops the run
    if (log_step || progress_.tty()) progress_.show(m);
  }

 private:
  const Run& r_;
  MetricsLog* metrics_;  // rank 0 only
  ProgressLine& progress_;
  std::function<void()> save_;
  Clock::time_point start_;
  int64_t first_step_;
  LossWatchdog watchdog_;
  double flops_per_token_ = 0, matmul_tflops_ = 0;
};

// Fault tests (tests/test_data_parallel.cpp): SOLTRAIN_TEST_RANK_FAULT=R:STEP:kill|raise makes rank R die
// by SIGKILL, or throw, after update STEP.
void test_fault(int rank, int64_t step) {
  const char* v = std::getenv("SOLTRAIN_TEST_RANK_FAULT");
  if (!v) return;
  int r = -1;
  long long s = -1;
  char how[8] = {};
  if (std::sscanf(v, "%d:%lld:%7s", &r, &s, how) != 3 || r != rank || s != step) return;
  if (std::string(how) == "kill") std::raise(SIGKILL);
  throw std::runtime_error(cat("injected fault after step ", step));
}

void dump_batches(const fs::path& dir, int64_t step, const std::vector<HostBatch>& micro) {
  fs::create_directories(dir);
  for (size_t m = 0; m < micro.size(); ++m)
    save_batch_file(dir / cat("step-", step, "-micro-", m, ".safetensors"), micro[m]);
}

void save_final(const Run& r, const RunResult& result, bool has_val, ProgressLine& progress,
                const MetricsLog& metrics) {
  const TrainConfig& c = r.c;
  const fs::path saved = c.output_dir / (r.lora ? "adapter" : "model");
  if (r.lora)
    save_adapter(*r.model, saved, c.model.string());  // PEFT's layout: peft, vLLM and soltrain merge read it
  else
    save_pretrained(*r.model, saved, c.model);
  write_training_curves(metrics.jsonl_path(), c.output_dir / "training_curves.svg");
  std::string summary =
      cat(r.cmd, ": done, ", r.state.step, " steps; ", r.lora ? "adapter" : "model", " saved to ", saved.string());
  // Surogate's merge_adapter: the adapter stays where PEFT reads it, the merged model goes next to it.
  if (r.lora && c.merge_adapter) {
    const fs::path merged = c.output_dir / "merged";
    merge_adapter(c.model, saved, merged);
    summary += cat("; merged model saved to ", merged.string());
  }
  if (has_val)
    summary += cat("; validation loss ", fmt_loss(result.first_eval_loss), " -> ", fmt_loss(result.last_eval_loss));
  progress.message(summary);
}

}  // namespace

RunResult run_training(const TrainConfig& c, TrainMode mode, Ops& ops, std::ostream& log_in, Communicator* comm) {
  std::ostream quiet(nullptr);  // what ranks other than 0 log to: nothing
  const bool lead = !comm || comm->rank() == 0;
  std::ostream& log = lead ? log_in : quiet;
  Run r{c,
        mode == TrainMode::kSft ? "sft" : "pt",
        log,
        ops,
        comm,
        comm ? comm->rank() : 0,
        comm ? comm->size() : 1,
        false,
        {},
        {},
        {},
        {},
        0,
        0,
        0,
        {},
        {},
        {},
        {}};
  r.dp = comm && (comm->size() > 1 || std::string(comm->backend()) != "single");
  print_intent(r);
  set_up(r);
  resume_or_start(r);
  print_plan(r);

  std::optional<MetricsLog> metrics_file;
  if (lead) metrics_file.emplace(c.output_dir, r.state.step);
  MetricsLog* metrics = metrics_file ? &*metrics_file : nullptr;
  ProgressLine progress(log);
  const bool has_val = r.data.validation.documents() > 0;
  RunResult result;
  result.total_steps = r.state.total_steps;
  result.first_eval_loss = result.last_eval_loss = NAN;
  auto run_eval = [&](int64_t step) {
    r.step->settle();
    // Rank 0 evaluates; the others wait at their next collective. ZeRO-3 gathers each layer as it goes, a
    // collective: every rank runs the same evaluation, and rank 0 reports it.
    if (!has_val || (!lead && !r.zero3())) return;
    const EvalResult e = evaluate(*r.model, r.data.validation, c.per_device_train_batch_size, c.sequence_len);
    if (!lead) return;
    metrics->eval(step, e.loss, e.tokens);
    result.last_eval_loss = e.loss;
    progress.message(cat("step ", step, ": validation loss ", fmt_loss(e.loss), " over ", e.tokens, " tokens"));
  };
  if (r.state.step == 0) {
    run_eval(0);
    result.first_eval_loss = result.last_eval_loss;
  }
  int64_t last_saved = r.state.step;
  auto checkpoint = [&]() {
    r.step->settle();  // the weights whole before they are written
    r.state.loader = r.loader->state();
    const fs::path dir = c.output_dir / cat("checkpoint-", r.state.step);
    if (r.zero3()) r.zero3()->masters_to_host();  // ZeRO-3: rank 0 writes the masters gathered whole
    save_checkpoint(dir, c, *r.model, r.step->optimizer(), r.state, comm);
    if (r.zero3()) r.zero3()->release_host_masters();
    if (lead) prune_checkpoints(c.output_dir, c.save_total_limit);
    last_saved = r.state.step;
    progress.message(cat("step ", r.state.step, ": saved ", dir.string()));
  };

  StepLogger step_log(r, metrics, progress, checkpoint);
  StopSignal stop;
  // Every rank packs the whole global batch (the same on each: one seed, one loader state, which is also
  // what makes a checkpoint resumable on another rank count) and trains on its own contiguous share, so
  // the ranks together run what one process with world × the accumulation would.
  const size_t accum = size_t(c.gradient_accumulation_steps);
  std::vector<HostBatch> micro(accum * size_t(r.world));
  // Every rank stops at the same step: a signal seen by any stops all (after the same update).
  auto stop_requested = [&] {
    const bool here = StopSignal::requested();
    return r.dp ? comm->all_max_host(here ? 1 : 0) > 0 : here;
  };
  bool stopping = false;
  // Data parallel: LoRA dropout passes before this update (resume restarts the count at the step, as one
  // process does, transformer.h set_dropout_step).
  int64_t passes = r.state.step;
  while (r.state.step < r.state.total_steps && !(stopping = stop_requested())) {
    const auto t0 = Clock::now();
    int64_t counted_all = 0;
    for (HostBatch& b : micro) {
      b = r.loader->next();
      counted_all += b.counted();
    }
    if (!c.dump_batches.empty() && lead) dump_batches(c.dump_batches, r.state.step + 1, micro);
    const double lr = c.learning_rate * lr_factor(r.sched, r.state.step);
    if (r.dp) {
      // LoRA dropout draws its masks from the pass count (passes with targets): each rank starts its share
      // where one process would be at that micro-batch.
      int64_t before_mine = 0, with_targets = 0;
      for (size_t i = 0; i < micro.size(); ++i)
        if (micro[i].counted() > 0) before_mine += i < size_t(r.rank) * accum, ++with_targets;
      r.model->set_dropout_step(passes + before_mine);
      passes += with_targets;
      r.step->run(std::span<const HostBatch>(micro).subspan(size_t(r.rank) * accum, accum), float(lr), counted_all);
    } else
      r.step->run(micro, float(lr));
    ++r.state.step;
    test_fault(r.rank, r.state.step);
    const bool save_step = r.save_steps > 0 && r.state.step % r.save_steps == 0;
    step_log.after_update(lr, t0, save_step);
    if (r.eval_steps > 0 && r.state.step % r.eval_steps == 0 && r.state.step < r.state.total_steps)
      run_eval(r.state.step);
    if (save_step) checkpoint();
  }
  result.steps = r.state.step;
  r.step->settle();
  if (stopping) {
    if (r.state.step > last_saved) checkpoint();
    if (lead) write_training_curves(metrics->jsonl_path(), c.output_dir / "training_curves.svg");
    progress.message(cat(r.cmd, ": stopped by signal ", StopSignal::signal_number(), " at step ", r.state.step,
                         "; resume with resume_from_checkpoint: true"));
    result.interrupted = true;
    return result;
  }
  run_eval(r.state.step);
  if (r.zero3()) r.zero3()->masters_to_host();
  if (lead) save_final(r, result, has_val, progress, *metrics);
  if (r.zero3()) r.zero3()->release_host_masters();
  if (r.dp) comm->barrier();  // no rank reports done before the model is written
  return result;
}

}  // namespace soltrain
