#include "train/train_step.h"

#include <cmath>

#include "core/error.h"
#include "model/fp8_recipe.h"

namespace soltrain {

TrainStep::TrainStep(Transformer& model, const OptimizerConfig& opt)
    : model_(model),
      opt_(opt),
      adamw_(std::make_unique<AdamW>(model.params(), model.ops(), opt.moments, opt.offload, opt.muon.has_value(),
                                     opt.muon && opt.muon->normuon)),
      sft_(model.ops()),
      sumsq_(model.ops().alloc(sizeof(double))) {
  // (refused in the user's words before this: train/optimizer_settings.h)
  SOLTRAIN_CHECK(!(opt.in_backward && opt.offload.grads), "optimizer_in_backward with offload_grads");
  SOLTRAIN_CHECK(!(opt.in_backward && opt.max_grad_norm > 0), "optimizer_in_backward with clipping");
  if (opt.offload.grads) {
    grad_offload_ = std::make_unique<GradOffload>(model);
    model.set_hooks(grad_offload_.get());
  }
  if (opt.in_backward) {
    backward_update_ = std::make_unique<BackwardUpdate>(model, *adamw_);
    model.set_hooks(backward_update_.get());
  }
}

const char* sharded_update_refusal(const OptimizerConfig& opt, int zero_stage) {
  if (zero_stage < 1) return nullptr;
  if (opt.offload.grads) return "each rank's gradients are reduced on the device";
  if (opt.muon) return "Muon orthogonalises whole matrices";
  return nullptr;
}

namespace {
int checked_stage(const OptimizerConfig& opt, int zero_stage) {
  // (the data-parallel hooks are the collectives': one set of layer hooks per model)
  if (opt.in_backward)
    user_error(
        "optimizer_in_backward with data parallel is not built yet (each layer's gradients must be reduced "
        "over the ranks before its update): run one process, or drop optimizer_in_backward");
  if (opt.offload.grads)
    user_error(
        "offload_grads with data parallel is not built yet (each rank's layer gradients are reduced on the "
        "device): run one process, or drop offload_grads");
  if (const char* why = sharded_update_refusal(opt, zero_stage))
    user_error("ZeRO stage ", zero_stage, " with this optimizer is not built yet (", why, ")");
  return zero_stage;
}
}  // namespace

TrainStep::TrainStep(Transformer& model, const OptimizerConfig& opt, Communicator& comm, int zero_stage)
    : model_(model),
      opt_(opt),
      dp_(std::make_unique<DataParallel>(model, comm, checked_stage(opt, zero_stage), opt)),
      adamw_(zero_stage >= 1
                 ? std::make_unique<AdamW>(model.params(), model.ops(), dp_->plan().owned, opt.moments, opt.offload)
                 : std::make_unique<AdamW>(model.params(), model.ops(), opt.moments, opt.offload, opt.muon.has_value(),
                                           opt.muon && opt.muon->normuon)),
      sft_(model.ops()),
      sumsq_(model.ops().alloc(sizeof(double))),
      loss_sum_(model.ops().alloc(sizeof(double))) {
  model.set_hooks(dp_.get());
}

TrainStep::~TrainStep() {
  if (dp_ || grad_offload_ || backward_update_) model_.set_hooks(nullptr);
}

namespace {
// SFT's update: every token weighs 1 / (the update's counted targets), so gradients accumulate without
// rescaling.
class SftStep final : public StepObjective {
 public:
  SftStep(SftObjective& sft, int64_t counted) : sft_(sft), counted_(counted) {}
  void begin_update(std::span<const HostBatch>) override { sft_.begin_update(counted_); }
  bool trains(const HostBatch& b) const override { return b.counted() > 0; }
  void train_micro_batch(Transformer& model, const HostBatch& b) override {
    model.forward(b, &sft_, /*backward_follows=*/true);
    model.backward(sft_);
  }

 private:
  SftObjective& sft_;
  int64_t counted_;
};
}  // namespace

void DpoStep::begin_update(std::span<const HostBatch> micro_batches) {
  int64_t pairs = 0, chosen = 0;
  for (const HostBatch& b : micro_batches) {
    const std::vector<int32_t> n = counted_per_document(b);
    for (size_t i = 0; i < b.pairs.size(); i += 2) chosen += n[size_t(b.pairs[i])];
    pairs += int64_t(b.pairs.size() / 2);
  }
  dpo_.begin_update(pairs, chosen);
}

void DpoStep::train_micro_batch(Transformer& model, const HostBatch& b) {
  dpo_micro_batch(model, dpo_, b, /*backward=*/true);
}

void GrpoStep::begin_update(std::span<const HostBatch> micro_batches) {
  scales_ = grpo_document_scales(grpo_.config(), micro_batches);
  first_ = micro_batches.data();
  grpo_.begin_update();
}

void GrpoStep::train_micro_batch(Transformer& model, const HostBatch& b) {
  const size_t i = size_t(&b - first_);
  SOLTRAIN_CHECK(first_ && i < scales_.size(), "a GRPO micro-batch outside the update begun");
  grpo_micro_batch(model, grpo_, b, scales_[i], /*backward=*/true);
}

void TrainStep::run(std::span<const HostBatch> micro_batches, float lr, int64_t counted_all, StepObjective* objective) {
  // (data parallel reduces SFT's loss sum: another objective's would need its own reduction, not built)
  SOLTRAIN_CHECK(!(dp_ && objective), "objectives other than SFT run in a single process");
  Ops& ops = model_.ops();
  const ParameterStore& ps = model_.params();
  const Tensor sumsq{sumsq_.data(), DType::F64, {1}, sumsq_.device()};
  model_.set_completed_steps(adamw_->steps_done());  // (QAT's fake_quant_after_n_steps; a resume restores the count)
  counted_ = 0;
  for (const HostBatch& b : micro_batches) counted_ += b.counted();
  if (counted_all >= 0) counted_ = counted_all;
  SftStep sft(sft_, counted_);
  StepObjective& obj = objective ? *objective : sft;
  // Expert parallelism: every rank's pass serves the other ranks' tokens to its experts, so every micro-batch
  // runs, targets or not (one without contributes only those experts' gradients).
  const bool every = model_.expert_parallel() != nullptr;
  auto trains = [&](const HostBatch& b) { return every || obj.trains(b); };
  size_t last = micro_batches.size();  // the last micro-batch with targets: its backward reduces the groups
  size_t passes = 0;
  for (size_t i = 0; i < micro_batches.size(); ++i)
    if (trains(micro_batches[i])) last = i, ++passes;
  if (backward_update_ && passes > 1)  // (refused before anything of the update is begun or counted)
    user_error(
        "optimizer_in_backward updates the weights during the backward pass, so an update has one "
        "micro-batch: set gradient_accumulation_steps: 1 (got ",
        passes, " micro-batches with targets)");
  if (backward_update_) {  // the layers' slots are zeroed as each layer's backward begins; the head's are zeroed
    ops.zero(ps.group_grads(model_.head_group()));
    ops.zero(sumsq);
    backward_update_->begin_update(opt_, lr, sumsq);
  } else if (grad_offload_) {  // the layers' host gradients are overwritten by the first pass; the head's are zeroed
    ops.zero(ps.group_grads(model_.head_group()));
    ops.zero(sumsq);
    grad_offload_->begin_update();
  } else {
    ops.zero(ps.all_grads());
  }
  model_.reset_aux_loss();
  if (dp_) dp_->begin_update();
  obj.begin_update(micro_batches);
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const HostBatch& b = micro_batches[i];
    if (!trains(b)) {             // nothing trained in it: contributes nothing
      if (dp_) dp_->idle_pass();  // (but ZeRO-3's ranks gather and reduce in step: this one joins them)
      continue;
    }
    if (dp_ && i == last) dp_->arm();
    if (grad_offload_ && i == last) grad_offload_->set_last_pass(&sumsq);
    obj.train_micro_batch(model_, b);
  }
  obj.before_update();
  if (dp_) {
    dp_->finish_gradients();
    const Tensor loss_sum{loss_sum_.data(), DType::F64, {1}, loss_sum_.device()};
    if (last < micro_batches.size())
      ops.copy(loss_sum, sft_.loss_sum());
    else
      ops.zero(loss_sum);  // none of this rank's micro-batches had targets
    dp_->all_reduce(loss_sum);
    // an MoE model's load-balancing loss: every rank's micro-batches' (HF Trainer's sum over them)
    if (const Tensor aux = model_.aux_loss_sum(); aux.data) dp_->all_reduce(aux);
    dp_->grad_sumsq(sumsq);
    adamw_->step(opt_, lr, 1.0f, &sumsq);
    // FP8: every rank scales from the amaxes all ranks saw (an evaluation's too), so the ranks' scaling
    // states stay one and a checkpoint's is each rank's.
    if (const Fp8Recipe* f = model_.fp8())
      if (const Tensor h = f->amax_histories(); h.defined()) dp_->all_reduce_max(h);
    model_.after_update();
    dp_->gather_weights();
    return;
  }
  ops.wait(Ops::Stream::Main, Ops::Stream::Side);  // whatever the layer hooks queued
  if (backward_update_) {  // the layers were updated in backward: the rest (and Σ g² of the head's group) now
    backward_update_->finish_update();
    model_.after_update();
    return;
  }
  if (grad_offload_) {  // Σ g² of the layers was summed as each was copied home; the head's group joins it
    grad_offload_->finish_update();
    ops.reduce_sum(sumsq, ps.group_grads(model_.head_group()), /*squares=*/true, /*accumulate=*/true);
  } else {
    ops.reduce_sum(sumsq, ps.all_grads(), /*squares=*/true, /*accumulate=*/false);
  }
  adamw_->step(opt_, lr, 1.0f, &sumsq);
  model_.after_update();
}

double TrainStep::loss() const {
  // (an MoE model's load-balancing loss joins it as HF Trainer adds it: each micro-batch's, every rank's)
  if (!dp_) return sft_.read_loss(model_.ops()) + model_.read_aux_loss();
  double s = 0;
  model_.ops().copy(Tensor{&s, DType::F64, {1}, Device::CPU},
                    Tensor{loss_sum_.data(), DType::F64, {1}, loss_sum_.device()});
  return counted_ > 0 ? s / double(counted_) + model_.read_aux_loss() : NAN;
}

double TrainStep::grad_norm() const {
  double s = 0;
  model_.ops().copy(Tensor{&s, DType::F64, {1}, Device::CPU}, Tensor{sumsq_.data(), DType::F64, {1}, sumsq_.device()});
  return std::sqrt(s);
}

}  // namespace soltrain
