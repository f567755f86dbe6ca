// `soltrain sft` / `soltrain pt`: the run built from the config (train/run_builder.h), its plan printed, and
// the SFT driver in the one training loop (train/train_loop.h). Gradient accumulation follows HF Trainer with
// num_items_in_batch: the update's loss is the sum of token losses over all micro-batches divided by all their
// counted tokens, so a micro-batch with more trained tokens weighs more (not the mean of per-micro-batch means).
#include "train/run_training.h"

#include <cmath>
#include <optional>
#include <ostream>
#include <span>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/format.h"
#include "core/host_memory.h"
#include "data/batch_file.h"
#include "data/loader.h"
#include "train/evaluate.h"
#include "train/train_data.h"
#include "train/train_loop.h"
#include "train/train_step.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// Everything the SFT run holds.
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
  TrainData data{};
  std::unique_ptr<Transformer> model{};
  std::unique_ptr<RowSource> loader{};  // a Loader over the tokenized data, or a StreamLoader (streaming)
  std::string documents{};              // what the plan says of the training documents
  size_t data_bytes = 0;                // the tokenized training and validation data, held in host memory
  int64_t micro_per_epoch = 0;
  Cadence cadence{};
  ScheduleConfig sched{};
  OptimizerConfig opt{};
  std::unique_ptr<TrainStep> step{};
  // ZeRO-3's sharded weights (null otherwise): the plan reports them.
  Zero3* zero3() const { return step && step->data_parallel() ? step->data_parallel()->zero3() : nullptr; }
};

void set_up(Run& r) {
  const TrainConfig& c = r.c;
  fs::create_directories(c.output_dir);
  // Rank 0 tokenizes into the shared cache first; the others then read it.
  auto prepare = [&] { return as_data_error([&] { return prepare_train_data(c, r.log); }); };
  if (r.lead()) r.data = prepare();
  if (r.dp) r.comm->barrier();
  if (!r.lead()) r.data = prepare();
  // ZeRO-3 gives each rank only its slices of the gradients: no full-size buffer is made for them here.
  check_update_batches_fit(c, r.world, c.per_device_train_batch_size);
  const bool zero3 = r.dp && c.zero_stage == 3;
  const size_t held_before = device_memory().live;
  reset_device_peak();
  size_t read = 0;
  r.model = load_run_model(c, r.ops, lora_config(c), {&r.data.train, &r.data.validation},
                           /*gradients=*/!zero3, r.dp ? r.comm : nullptr, &read);
  // ZeRO-3 loads by slices: what a rank read and the most it held, as the load left them (a test checks both).
  if (zero3 && r.lead())
    r.log << r.cmd << ": ZeRO-3: loading, this rank read " << format_bytes(double(read)) << " (" << read
          << " bytes) of the model's weights and held at most " << device_memory().peak - held_before
          << " bytes of device memory\n";
  for (const ShardSet* set : {&r.data.train, &r.data.validation})
    r.data_bytes += set->tokens.size() * sizeof(int32_t) + set->mask.size() + set->doc_offsets.size() * sizeof(int64_t);
  LoaderOptions lo;
  lo.rows = c.per_device_train_batch_size;
  lo.seq_len = c.sequence_len;
  lo.seed = c.seed;
  lo.pack = c.sample_packing;
  lo.shuffle = c.shuffle;
  lo.overlong = c.overlong;
  if (c.streaming) {
    // A stream's length is unknown: max_steps (required) sets the schedule, and the run is one epoch's worth.
    r.loader = stream_train_data(c, lo, r.model->config().vocab_size, r.log);
    r.micro_per_epoch = c.max_steps * c.gradient_accumulation_steps * r.world;
    r.documents = cat("training documents streamed in order from ", c.datasets.size(), " dataset file",
                      c.datasets.size() == 1 ? "" : "s", " (", c.per_device_train_batch_size, " x ", c.sequence_len,
                      " micro-batches)");
  } else {
    auto loader = std::make_unique<Loader>(std::move(r.data.train), lo);
    if (loader->dropped_overlong() > 0)
      r.log << r.cmd << ": excess_length_strategy drop: left out " << loader->dropped_overlong()
            << " documents longer than sequence_len " << c.sequence_len << "\n";
    r.micro_per_epoch = (loader->rows_in_epoch(0) + lo.rows - 1) / lo.rows;
    r.documents = cat(loader->documents(), " training documents (", r.micro_per_epoch, " micro-batches of ",
                      c.per_device_train_batch_size, " x ", c.sequence_len, " per epoch)");
    r.loader = std::move(loader);
  }
  // Data parallel: an update takes accumulation × world micro-batches (floor(m / (a·w)) = floor(floor(m / w) / a)).
  r.sched = schedule_config(c, total_training_steps(c, r.micro_per_epoch / r.world));
  configure_model(*r.model, c, r.ops, lo.rows, r.dp ? r.comm : nullptr);
  r.opt = optimizer_config(c);
  // (the config reader refuses offload with ZeRO first; this names the settings for the rest)
  if (const char* why = r.dp ? sharded_update_refusal(r.opt, c.zero_stage) : nullptr)
    user_error(c.muon ? (c.normuon ? "optimizer: normuon" : "optimizer: muon") : "offload_grads", " with zero_stage ",
               c.zero_stage, " is not built yet (", why, "); use zero_stage: 0");
  r.step = r.dp ? std::make_unique<TrainStep>(*r.model, r.opt, *r.comm, c.zero_stage)
                : std::make_unique<TrainStep>(*r.model, r.opt);
  // Axolotl's per-epoch counts, in optimizer steps of this run's epoch.
  r.cadence = run_cadence(c, r.micro_per_epoch / r.world / c.gradient_accumulation_steps);
}

// First of all: what kind of training this is, and what the config reader decided for the user.
void print_intent(const Run& r) {
  for (const std::string& n : r.c.notes) r.log << r.cmd << ": " << n << "\n";
  if (!r.c.lora.enabled) {
    r.log << r.cmd << ": full fine-tune\n";
    return;
  }
  r.log << r.cmd << ": " << describe_lora(r.c) << "\n";
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
  // Offloaded masters and moments: host memory on either backend (pinned on CUDA, where each buffer was also
  // checked as it was allocated).
  const size_t offloaded = r.model->params().host_master_bytes() + r.step->optimizer().host_state_bytes() +
                           r.model->params().host_grad_bytes();
  const size_t checkpoints = r.model->checkpoint_host_bytes();  // offload_activations
  const size_t base = r.model->params().host_frozen_bytes();    // offload_weights
  size_t planned = r.model->staging_bytes() + r.data_bytes + offloaded + checkpoints + base;
  if (r.ops.device() == Device::CPU)
    planned += r.model->params().weight_bytes() + 4 * size_t(r.model->params().numel()) +
               r.step->optimizer().state_bytes() + r.model->activation_bytes() + stream_slot_bytes(*r.model);
  const HostMemory m = read_host_memory();
  auto size = [](size_t bytes) { return format_bytes(double(bytes)); };
  r.log << r.cmd << ": host memory: " << size(planned) << " planned (batch staging " << size(r.model->staging_bytes())
        << (r.ops.device() == Device::CPU ? "" : " pinned") << ", tokenized data " << size(r.data_bytes)
        << (offloaded ? cat(", offloaded masters, moments and gradients ", size(offloaded)) : std::string())
        << (checkpoints ? cat(", offloaded layer-input checkpoints ", size(checkpoints)) : std::string())
        << (base ? cat(", the offloaded base's layers ", size(base)) : std::string())
        << (r.ops.device() == Device::CPU ? ", and every buffer above: the CPU backend's device is the host" : "")
        << "); " << describe_host_memory(m) << "\n";
  HostMemory whole = m;
  whole.available = m.limit;
  const std::string refusal = host_memory_refusal(planned, whole, "the memory plan");
  if (!refusal.empty()) throw UserError(refusal);
}

// The plan's notes on what lives outside the totals or off the device: attention's dQ scratch, offloaded
// checkpoints, a streamed base, offloaded optimizer state, FP8's copies.
void print_memory_notes(const Run& r) {
  const TrainConfig& c = r.c;
  const ParameterStore& ps = r.model->params();
  auto size = [](auto bytes) { return format_bytes(double(bytes)); };
  // (the form the GPU runs: SOLTRAIN_ATTENTION_BACKWARD wins over the setting)
  const ModelConfig& mc = r.model->config();
  const AttentionBackward form = r.ops.attention_backward_form();
  const int64_t rows = c.per_device_train_batch_size, T = c.sequence_len;
  if (const size_t a = attention_backward_scratch_bytes(form, rows * T, rows, T, mc.num_heads, mc.head_dim);
      a && r.ops.device() == Device::CUDA) {
    const size_t per_doc = attention_backward_scratch_bytes(form, rows * T, rows + 1, T, mc.num_heads, mc.head_dim) - a;
    r.log << r.cmd << ": attention_backward: " << attention_backward_name(form) << ": on Hopper its dQ sums take "
          << size(a) << " more at one document per row, and " << size(per_doc)
          << " for each further document packed into a micro-batch (outside the total above)\n";
  }
  if (const size_t host = r.model->checkpoint_host_bytes()) {
    const PlannedBuffer* ck = r.model->activation_plan().find("resid");
    r.log << r.cmd << ": offload_activations: the layer-input checkpoints take " << size(host) << " of host memory ("
          << ck->host_copies << " x " << size(ck->bytes()) << ") and a ring of " << ck->copies << " on the device, "
          << size(ck->total_bytes())
          << " (counted in activations above); each is copied out as forward writes it and back one layer "
             "ahead of backward\n";
  }
  if (const WeightStream* w = r.model->weight_stream()) {
    r.log << r.cmd << ": offload_weights: " << w->streamed() << " of the frozen base's " << r.model->config().num_layers
          << " decoder layers take " << size(ps.host_frozen_bytes())
          << " of host memory; the device streams them through two slots, " << size(w->device_bytes())
          << " (counted in weights above), copying each in while the layers before it compute\n";
  }
  if (c.offload.any()) {
    // Where the update's fp32 state lives: host (offloaded) next to the device's staging slots.
    const AdamW& opt = r.step->optimizer();
    r.log << r.cmd << ": offload: host memory holds " << (c.offload.master ? "the fp32 masters " : "")
          << (c.offload.master ? size(ps.host_master_bytes()) : std::string())
          << (c.offload.master && c.offload.optimizer ? " and " : "")
          << (c.offload.optimizer ? "the AdamW moments " + size(opt.host_state_bytes()) : std::string())
          << ((c.offload.master || c.offload.optimizer) && c.offload.grads ? " and " : "")
          << (c.offload.grads ? "the decoder layers' gradients " + size(ps.host_grad_bytes()) : std::string())
          << "; the device stages them in two chunks, " << size(opt.state_bytes())
          << " (counted in AdamW moments above), each update streaming them through it\n";
    if (const GradOffload* g = r.step->grad_offload())
      r.log << r.cmd << ": offload_grads: each layer's backward writes its gradients into one of two device slots, "
            << size(g->device_bytes()) << " (counted in gradients above), copied home as the next layer runs\n";
  }
  if (c.bf16_stochastic_round)
    r.log << r.cmd << ": bf16_stochastic_round: the trained weights are kept in bf16 only (no fp32 masters, "
          << size(size_t(ps.numel()) * 2) << "), each update computed in fp32 and rounded to bf16 stochastically\n";
  if (const BackwardUpdate* b = r.step->backward_update())
    r.log << r.cmd << ": optimizer_in_backward: each decoder layer is updated as its backward ends, from gradients "
          << "that live only in one of two device slots, " << size(b->device_bytes())
          << " (counted in gradients above); no clipping, one micro-batch an update\n";
  if (const Fp8Recipe* f = r.model->fp8()) {
    const Fp8Settings& s = f->settings();
    r.log << r.cmd << ": recipe fp8-hybrid: the decoder layers' projections in FP8 (E4M3 forward, E5M2 gradients; "
          << (s.delayed ? cat("delayed scaling, amax history ", s.amax_history) : std::string("current scaling"))
          << (s.margin ? cat(", margin ", s.margin) : std::string());
    if (s.skip_first_layers || s.skip_last_layers)
      r.log << "; first " << s.skip_first_layers << " and last " << s.skip_last_layers << " layers in bf16";
    r.log << "); its FP8 weight copies, scales and scratch " << format_bytes(double(r.model->fp8_bytes())) << "\n";
  }
}

void print_plan(const Run& r) {
  const TrainConfig& c = r.c;
  const ParameterStore& ps = r.model->params();
  r.log << r.cmd << ": " << r.model->config().architecture << " on " << device_name(c.device) << ", "
        << describe_parameters(ps) << "; " << r.documents << ", " << r.data.validation.documents() << " validation; "
        << r.sched.total_steps << " steps, gradient accumulation " << c.gradient_accumulation_steps << ", lr "
        << c.learning_rate << " " << to_string(c.lr_scheduler_type) << " (warmup " << r.sched.warmup_steps << ")\n";
  if (r.dp)
    r.log << r.cmd << ": data parallel over " << r.world << " ranks (" << r.comm->backend() << "), ZeRO stage "
          << c.zero_stage << ": global batch " << c.per_device_train_batch_size << " x "
          << c.gradient_accumulation_steps << " x " << r.world << " micro-batches per update\n";
  if (const ExpertParallel* ep = r.model->expert_parallel())
    r.log << r.cmd << ": expert parallel in groups of " << ep->size() << " ranks, " << ep->local_experts() << " of "
          << ep->local_experts() * ep->size() << " experts run on each"
          << (ep->balance().on ? cat(", and LLEP moves rows of the busiest experts to the least loaded ranks when a "
                                     "layer's imbalance passes ",
                                     ep->balance().threshold, " (every expert's weights kept on every rank)")
              : r.model->config().moe.held_count ? ", which holds only their base weights"
                                                 : " (full fine-tuning: every expert's weights kept on every rank)")
          << "\n";
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
    if (ps.frozen_sharded()) {
      int64_t whole = 0;
      for (int64_t g : ps.frozen_packed_bytes(r.ops.activation_dtype())) whole += g;
      r.log << r.cmd << ": ZeRO-3 per rank: frozen base " << b.frozen_held << " of its " << whole
            << " B held (this rank's slices, in the format it is stored in), gathered a layer at a time into "
            << b.frozen_gathered << " B of the gather buffers\n";
    }
  }
  // The memory plan, all allocated already (a run that does not fit has stopped before this line).
  const double trainable = double(ps.numel());
  // Every weight's storage as allocated: fp32 masters of the trainable ones, the compute copies (bf16 on the
  // GPU; on the CPU the masters are the compute copy, and frozen weights are fp32 values), and a QLoRA base's
  // quantised codes with their scales (NF4: 0.5 byte + 1/64 byte absmax code per weight; FP8: 1 byte + an
  // fp32 per 128x128 block).
  const double weights = double(ps.weight_bytes());
  std::string quantised;
  // Plus the scratch a linear dequantises its weight into, sized for the largest projection.
  int64_t widest = 0;
  for (const Parameter& p : ps.all())
    if (p.format != WeightFormat::Dense) widest = std::max(widest, shape_numel(p.shape));
  if (widest > 0)  // (ZeRO-3 over several ranks: the base is in the frozen slices, its line above)
    quantised = cat(" (the quantised base ",
                    ps.frozen_sharded() ? std::string("sharded") : format_bytes(double(ps.quantised_bytes())),
                    " of it; + ", format_bytes(double(widest) * double(dtype_size(r.ops.activation_dtype()))),
                    " to dequantise one weight at a time)");
  // ZeRO-3: the slices, plus the buffers a group is gathered into and its gradients computed in.
  const Zero3* z = r.zero3();
  const double gathered = z ? double(z->bytes().gathered) : 0.0;
  const GradOffload* go = r.step->grad_offload();        // offload_grads: the head's group and the two layer slots
  const BackwardUpdate* bu = r.step->backward_update();  // optimizer_in_backward: the same
  const double grads = z    ? double(ps.trainable_bytes().grads + z->bytes().grad_scratch)
                       : go ? double(ps.trainable_bytes().grads + go->device_bytes())
                       : bu ? double(ps.trainable_bytes().grads + bu->device_bytes())
                            : 4 * trainable;
  const double streamed = double(stream_slot_bytes(*r.model));
  const double moments = double(r.step->optimizer().state_bytes()), activations = double(r.model->activation_bytes());
  const double qat = r.model->qat() ? double(r.model->qat()->device_bytes()) : 0.0;
  const double total =
      weights + gathered + streamed + grads + moments + activations + double(r.model->fp8_bytes()) + qat;
  // A short table a person reads at a glance; the whole activation plan (every buffer) under --verbose.
  const ActivationPlan& plan = r.model->activation_plan();
  auto row = [&](const char* what, double bytes, const std::string& note) {
    char b[96];
    std::snprintf(b, sizeof b, "  %-14s %10s", what, format_bytes(bytes).c_str());
    r.log << b << (note.empty() ? "" : "  " + note) << "\n";
  };
  r.log << r.cmd << ": memory plan on " << device_name(c.device) << ", " << format_bytes(total) << " in all"
        << (r.ops.device() == Device::CUDA ? " (and the CUDA context and workspace, ~0.6 GiB)" : "") << ":\n";
  row("weights", weights + gathered + streamed, quantised.empty() ? "" : quantised.substr(2, quantised.size() - 3));
  row("gradients", grads, "");
  row("AdamW moments", moments, low_bit(r.opt.moments) ? "8-bit" : "");
  row("activations", activations,
      cat("recompute ", recompute_name(c.recompute), ", residual stream ",
          r.model->residual_dtype() == DType::F32 ? "fp32" : "bf16", ", MLP token tile ", plan.tile));
  if (qat > 0) row("QAT scratch", qat, "fake-quantised input and weight copies (model/qat.h)");
  r.log << "  largest: " << describe_largest(plan, c.verbose ? plan.largest().size() : 4) << "\n";
  print_memory_notes(r);
  print_host_plan(r);
}

// SFT and pretraining in the loop: packed rows from the loader, the cross-entropy objective. Every rank packs
// the whole global batch (the same on each: one seed, one loader state, which is also what makes a checkpoint
// resumable on another rank count) and trains on its own contiguous share, so the ranks together run what one
// process with world × the accumulation would.
class SftDriver final : public RunDriver {
 public:
  explicit SftDriver(Run& r) : r_(r), micro_(size_t(r.c.gradient_accumulation_steps) * size_t(r.world)) {}

  void update(TrainStep& step, int64_t done, float lr) override {
    const TrainConfig& c = r_.c;
    int64_t counted_all = 0;
    for (HostBatch& b : micro_) {
      b = r_.loader->next();
      counted_all += b.counted();
    }
    if (!c.dump_batches.empty() && r_.lead()) save_update_batches(c.dump_batches, done + 1, micro_);
    if (!r_.dp) return step.run(micro_, lr);
    // LoRA dropout draws its masks from the pass count (passes with targets): each rank starts its share where
    // one process would be at that micro-batch (resume restarts the count at the step, as one process does,
    // transformer.h set_dropout_step).
    if (!passes_) passes_ = done;
    const size_t accum = size_t(c.gradient_accumulation_steps);
    int64_t before_mine = 0, with_targets = 0;
    for (size_t i = 0; i < micro_.size(); ++i)
      if (micro_[i].counted() > 0) before_mine += i < size_t(r_.rank) * accum, ++with_targets;
    r_.model->set_dropout_step(*passes_ + before_mine);
    *passes_ += with_targets;
    step.run(std::span<const HostBatch>(micro_).subspan(size_t(r_.rank) * accum, accum), lr, counted_all);
  }
  Readout read(const TrainStep& step) override { return {step.loss(), step.counted() > 0, r_.model->moe_load()}; }
  double tokens_per_update() const override {
    return double(r_.c.per_device_train_batch_size) * r_.c.sequence_len * r_.c.gradient_accumulation_steps * r_.world;
  }
  double epoch() const override { return r_.loader->epoch_progress(); }
  LoaderState loader_state() const override { return r_.loader->state(); }
  void restore(const LoaderState& s) override { r_.loader->restore(s); }
  bool has_validation() const override { return r_.data.validation.documents() > 0; }
  // Rank 0 evaluates; the others wait at their next collective. ZeRO-3 gathers each layer as it goes, a
  // collective: every rank runs the same evaluation, and rank 0 reports it.
  std::optional<Evaluation> evaluate() override {
    // (ZeRO-3's gathers and expert parallelism's all-to-alls need every rank in the pass)
    if (!has_validation() || (!r_.lead() && !r_.zero3() && !r_.model->expert_parallel())) return std::nullopt;
    const EvalResult e =
        soltrain::evaluate(*r_.model, r_.data.validation, r_.c.per_device_train_batch_size, r_.c.sequence_len);
    if (!r_.lead()) return std::nullopt;
    if (e.accuracy)  // a process reward model's labels (TRL's PRMTrainer reports eval_accuracy)
      return Evaluation{e.loss,
                        e.tokens,
                        {{"accuracy", *e.accuracy}},
                        cat("validation loss ", format_loss(e.loss), ", accuracy ", format_loss(*e.accuracy), " over ",
                            e.tokens, " labels")};
    return Evaluation{
        e.loss, e.tokens, {}, cat("validation loss ", format_loss(e.loss), " over ", e.tokens, " tokens")};
  }

 private:
  Run& r_;
  std::vector<HostBatch> micro_;
  std::optional<int64_t> passes_;  // data parallel: LoRA dropout passes before this update
};

}  // namespace

RunResult run_training(const TrainConfig& c, TrainMode mode, Ops& ops, std::ostream& log_in, Communicator* comm,
                       LoopHooks hooks) {
  std::ostream quiet(nullptr);  // what ranks other than 0 log to: nothing
  const bool lead = !comm || comm->rank() == 0;
  std::ostream& log = lead ? log_in : quiet;
  Run r{c, mode == TrainMode::kSft ? "sft" : "pt", log, ops, comm, comm ? comm->rank() : 0, comm ? comm->size() : 1};
  r.dp = comm && (comm->size() > 1 || std::string(comm->backend()) != "single");
  print_intent(r);
  set_up(r);
  SftDriver driver(r);
  TrainLoop loop({c, r.cmd, log, ops, comm, r.dp, *r.model, *r.step, r.sched, r.cadence, std::move(hooks)}, driver);
  loop.resume();
  print_plan(r);
  return loop.run();
}

}  // namespace soltrain
