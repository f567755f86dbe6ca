// `soltrain dump`: logits, loss and every trainable parameter's gradient of one batch (all weights, or with
// --adapter the LoRA tensors under PEFT's names), for comparison with PyTorch / PEFT; with --grpo the same
// under GRPO's loss (rewards, the sampling policy's and the reference's NLL from a file), with --preference under
// a preference loss over the batch file's pairs (DPO and relatives, SimPO, ORPO), for TRL.
#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "data/batch_file.h"
#include "io/output_dir.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/dpo_objective.h"
#include "model/peft_adapter.h"
#include "model/reward_objective.h"
#include "train/run_dpo.h"
#include "train/train_step.h"

namespace soltrain {

namespace {

struct GrpoDump {
  std::string file;       // rewards [rows]; optional old_nll, ref_nll, sampling_nll [rows, T]
  std::string reference;  // a model folder: the reference pass computes ref_nll with its weights (full fine-tuning)
  std::string loss_type = "dapo", scale_rewards = "group", level = "token", correction = "none";
  float beta = 0, epsilon = 0.2f, epsilon_high = -1, delta = 0, temperature = 1, top_entropy_quantile = 1;
  float clip_min = NAN, clip_max = 3;
  int num_generations = 2, max_completion_length = 0, micro_batches = 1;
  bool kl_ratio = true;
};

// Every trainable parameter's gradient as grad.<name>, held in `store` (kept alive until the file is written).
void add_gradients(Transformer& model, Ops& ops, std::vector<NamedTensor>& out,
                   std::vector<std::vector<float>>& store) {
  store.reserve(model.params().all().size());
  for (const Parameter& p : model.params().all()) {
    if (!p.trainable) continue;
    store.emplace_back(size_t(shape_numel(p.shape)));
    model.params().download_grad(ops, p, store.back().data());
    out.push_back({"grad." + checkpoint_name(model.config(), p.name),
                   Tensor{store.back().data(), DType::F32, p.shape, Device::CPU}});
  }
}

// Named scalars as [1] tensors (their storage held by `values` until the file is written).
void add_scalars(std::vector<NamedTensor>& out, const std::vector<const char*>& names, std::vector<float>& values) {
  SOLTRAIN_CHECK(names.size() == values.size(), "add_scalars: names and values");
  for (size_t i = 0; i < values.size(); ++i)
    out.push_back({names[i], Tensor{&values[i], DType::F32, {1}, Device::CPU}});
}

struct PreferenceDump {
  std::string loss;  // sigmoid, ipo, hinge (the batch's ref_nll as the reference), simpo, orpo
  float label_smoothing = 0, nll_alpha = -1, simpo_gamma = 0.5f, desirable_weight = 1, undesirable_weight = 1;
};

// One update over the batch's pairs (one micro-batch) under a preference loss: its loss, metrics and gradients.
int dump_preference(const PreferenceDump& d, float beta, Ops& ops, Transformer& model, const HostBatch& batch,
                    const std::string& out_path) {
  // The run's settings as `soltrain dpo` reads them (rl: for the methods TRL gives a trainer of their own), turned
  // into the objective by the run's own preference_objective
  DpoSettings s;
  // (apo_zero_unpaired: KTO's loss with kl 0, as the config's loss_type reads it)
  s.apo_zero_unpaired = d.loss == "apo_zero_unpaired";
  s.loss = s.apo_zero_unpaired ? PreferenceLoss::Kto : parse_preference_loss(d.loss, "--preference");
  if (s.loss == PreferenceLoss::Simpo || s.loss == PreferenceLoss::Orpo || s.loss == PreferenceLoss::Kto)
    s.method = s.loss;
  s.beta = beta;
  s.beta_given = true;
  s.label_smoothing = d.label_smoothing;
  if (d.nll_alpha >= 0) (s.loss == PreferenceLoss::Simpo ? s.cpo_alpha : s.rpo_alpha) = d.nll_alpha;
  s.simpo_gamma = d.simpo_gamma;
  s.desirable_weight = d.desirable_weight;
  s.undesirable_weight = d.undesirable_weight;
  const DpoConfig c = preference_objective(s);
  if ((c.loss == PreferenceLoss::Kto) != !batch.desirable.empty())
    user_error("--preference ", d.loss, ": a desirable label per pair is ",
               c.loss == PreferenceLoss::Kto ? "needed (the batch file's desirable)" : "KTO's only");
  if (batch.pairs.empty()) user_error("--preference: the batch file has no pairs");
  if (!reference_free(c.loss) && batch.ref_nll.empty() && !model.lora())
    user_error("--preference ", d.loss,
               ": the batch file has no ref_nll (the reference's Σ NLL of each pair document)");
  if (c.loss == PreferenceLoss::Orpo && batch.prompt_targets.size() * 2 != batch.pairs.size())
    user_error("--preference orpo: the batch file needs prompt_targets, one per pair");
  model.plan(batch.rows, batch.seq_len);
  DpoObjective dpo(ops, c, int64_t(batch.rows) * batch.seq_len);
  DpoStep step(dpo);
  ops.zero(model.params().all_grads());
  step.begin_update({&batch, 1});
  step.train_micro_batch(model, batch);
  const DpoMetrics m = dpo.read(ops);
  std::vector<float> scalars{float(m.loss),          float(m.reward_chosen), float(m.reward_rejected),
                             float(m.accuracy),      float(m.margin),        float(m.logp_chosen),
                             float(m.logp_rejected), float(m.nll),           float(m.kl)};
  std::vector<NamedTensor> out;
  add_scalars(out,
              {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
               "logps/rejected", "nll_loss", "kl"},
              scalars);
  std::vector<std::vector<float>> grads;
  add_gradients(model, ops, out, grads);
  write_safetensors(out_path, out);
  std::cout << preference_loss_name(c.loss) << " loss " << m.loss << " over " << m.pairs << " pairs; wrote " << out_path
            << "\n";
  return 0;
}

// One update over the batch's pairs under a reward model's Bradley–Terry loss (TRL's RewardTrainer): its loss,
// metrics and gradients.
int dump_reward(float center, Ops& ops, Transformer& model, const HostBatch& batch, const std::string& out_path) {
  if (batch.pairs.empty()) user_error("--reward: the batch file has no pairs");
  model.plan(batch.rows, batch.seq_len);
  RewardObjective reward(ops, RewardConfig{center}, int64_t(batch.rows) * batch.seq_len, model.config().pad_token_id);
  RewardStep step(reward);
  ops.zero(model.params().all_grads());
  step.begin_update({&batch, 1});
  step.train_micro_batch(model, batch);
  const RewardMetrics m = reward.read(ops);
  std::vector<float> scalars{float(m.loss),       float(m.accuracy),    float(m.margin),
                             float(m.min_reward), float(m.mean_reward), float(m.max_reward)};
  std::vector<NamedTensor> out;
  add_scalars(out, {"loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward"}, scalars);
  std::vector<std::vector<float>> grads;
  add_gradients(model, ops, out, grads);
  write_safetensors(out_path, out);
  std::cout << "reward loss " << m.loss << " over " << m.pairs << " pairs; wrote " << out_path << "\n";
  return 0;
}

// The batch's rows split into `k` micro-batches of rows / k (an update's), each with its completions'
// advantages and the file's per-token NLLs.
std::vector<HostBatch> grpo_micro_batches(const HostBatch& all, const std::vector<float>& adv,
                                          const std::vector<float>& old_nll, const std::vector<float>& ref_nll,
                                          const std::vector<float>& sampling_nll, int k) {
  if (k < 1 || all.rows % k != 0) user_error("--micro-batches ", k, " does not divide the batch's ", all.rows, " rows");
  const int rows = all.rows / k, T = all.seq_len;
  std::vector<HostBatch> out;
  for (int m = 0; m < k; ++m) {
    const size_t t0 = size_t(m) * size_t(rows) * size_t(T), t1 = t0 + size_t(rows) * size_t(T);
    HostBatch b;
    b.rows = rows;
    b.seq_len = T;
    b.input_ids.assign(all.input_ids.begin() + long(t0), all.input_ids.begin() + long(t1));
    b.targets.assign(all.targets.begin() + long(t0), all.targets.begin() + long(t1));
    b.advantages.assign(adv.begin() + m * rows, adv.begin() + (m + 1) * rows);
    if (!old_nll.empty()) b.old_nll.assign(old_nll.begin() + long(t0), old_nll.begin() + long(t1));
    if (!ref_nll.empty()) b.ref_token_nll.assign(ref_nll.begin() + long(t0), ref_nll.begin() + long(t1));
    if (!sampling_nll.empty()) b.sampling_nll.assign(sampling_nll.begin() + long(t0), sampling_nll.begin() + long(t1));
    out.push_back(std::move(b));
  }
  return out;
}

int dump_grpo(const GrpoDump& g, Ops& ops, Transformer& model, const HostBatch& batch, const std::string& out_path) {
  GrpoConfig c;
  c.loss_type = parse_grpo_loss_type(g.loss_type, "--loss-type");
  c.scale_rewards = parse_scale_rewards(g.scale_rewards, "--scale-rewards");
  c.beta = g.beta;
  c.epsilon = g.epsilon;
  c.epsilon_high = g.epsilon_high < 0 ? g.epsilon : g.epsilon_high;
  c.delta = g.delta;
  c.sequence_level = g.level == "sequence";
  c.kl_ratio = g.kl_ratio;
  c.top_entropy_quantile = g.top_entropy_quantile;
  c.max_completion_length = g.max_completion_length > 0 ? g.max_completion_length : batch.seq_len;
  if (g.correction != "none") {
    c.sampling_correction = parse_sampling_correction(g.correction, "--sampling-correction");
    c.sampling_clip_min = g.clip_min;
    c.sampling_clip_max = g.clip_max;
  }
  c.validate("dump --grpo");
  const SafetensorsFile f(g.file);
  const int R = batch.rows, T = batch.seq_len;
  std::vector<float> rewards_f(size_t(R), 0.0f), old_nll, ref_nll, sampling_nll;
  read_as_f32(f.at("rewards"), {R}, rewards_f.data(), "rewards");
  if (f.find("old_nll")) {
    old_nll.resize(size_t(R) * size_t(T));
    read_as_f32(f.at("old_nll"), {R, T}, old_nll.data(), "old_nll");
  }
  if (c.beta != 0 && g.reference.empty()) {
    ref_nll.resize(size_t(R) * size_t(T));
    read_as_f32(f.at("ref_nll"), {R, T}, ref_nll.data(), "ref_nll");
  }
  if (c.sampling_correction != SamplingCorrection::None) {
    if (old_nll.empty() || !f.find("sampling_nll"))
      user_error("--sampling-correction ", g.correction, ": the --grpo file needs old_nll and sampling_nll [rows, T]");
    sampling_nll.resize(size_t(R) * size_t(T));
    read_as_f32(f.at("sampling_nll"), {R, T}, sampling_nll.data(), "sampling_nll");
  }
  const std::vector<double> rewards(rewards_f.begin(), rewards_f.end());
  if (g.num_generations < 1 || R % g.num_generations != 0)
    user_error("--num-generations ", g.num_generations, " does not divide the batch's ", R, " rows");
  const std::vector<float> adv = grpo_advantages(rewards, g.num_generations, c.scale_rewards);
  const std::vector<HostBatch> micro = grpo_micro_batches(batch, adv, old_nll, ref_nll, sampling_nll, g.micro_batches);
  const SamplingCorrectionStats cs = sampling_correction_stats(c, micro);
  model.set_logit_temperature(g.temperature);
  model.plan(micro[0].rows, T);
  GrpoObjective grpo(ops, c, int64_t(micro[0].rows) * T, micro[0].rows);
  std::unique_ptr<ReferenceWeights> reference;
  if (!g.reference.empty()) {  // the run's reference pass, with another folder's weights lent
    if (c.beta == 0) user_error("--reference ", g.reference, ": the reference counts only with --beta > 0");
    if (model.lora()) user_error("--reference: with --adapter the reference is the base with the adapters off");
    const auto other = load_pretrained(g.reference, ops);
    if (const std::string why = ReferenceWeights::mismatch(other->params(), model.params()); !why.empty())
      user_error("--reference ", g.reference, ": not the model's shape: ", why);
    reference = std::make_unique<ReferenceWeights>(ops, other->params());
    grpo.set_reference_weights(reference.get());
  }
  GrpoStep step(grpo);
  ops.zero(model.params().all_grads());
  step.begin_update(micro);
  for (const HostBatch& b : micro) step.train_micro_batch(model, b);
  const GrpoMetrics m = grpo.read(ops);

  std::vector<float> scalars{float(m.loss),        float(m.kl),           float(m.clip_low),      float(m.clip_high),
                             float(m.clip_region), float(m.clip_low_min), float(m.clip_high_max), float(m.entropy)};
  std::vector<const char*> names{"loss",
                                 "kl",
                                 "clip_ratio/low_mean",
                                 "clip_ratio/high_mean",
                                 "clip_ratio/region_mean",
                                 "clip_ratio/low_min",
                                 "clip_ratio/high_max",
                                 "entropy"};
  if (c.sampling_correction != SamplingCorrection::None) {
    for (const char* n : {"sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                          "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                          "sampling/importance_sampling_ratio/max"})
      names.push_back(n);
    for (double v : {cs.logp_diff_mean, cs.logp_diff_max, cs.ratio_min, cs.ratio_mean, cs.ratio_max})
      scalars.push_back(float(v));
  }
  std::vector<NamedTensor> out;
  add_scalars(out, names, scalars);
  out.push_back({"advantages", Tensor{const_cast<float*>(adv.data()), DType::F32, {R}, Device::CPU}});
  std::vector<std::vector<float>> grads;
  add_gradients(model, ops, out, grads);
  write_safetensors(out_path, out);
  std::cout << "grpo loss " << m.loss << " over " << m.tokens << " completion tokens; wrote " << out_path << "\n";
  return 0;
}

}  // namespace

std::function<int()> add_dump_command(CLI::App& app) {
  struct Opts {
    std::string model, adapter, save_adapter, batch, out, device = "cpu", residual_dtype = "auto", qlora = "none";
    std::string qat;
  };
  auto o = std::make_shared<Opts>();
  auto g = std::make_shared<GrpoDump>();
  auto pd = std::make_shared<PreferenceDump>();
  CLI::App* c = app.add_subcommand("dump", "write logits, loss and gradients of one batch as safetensors");
  c->add_option("--model", o->model, "Hugging Face model folder")->required();
  c->add_option("--adapter", o->adapter, "PEFT LoRA adapter folder: the base is frozen, gradients are the adapter's");
  c->add_option("--save-adapter", o->save_adapter,
                "also write the loaded adapter back out as soltrain saves adapters (PEFT round-trip checks)")
      ->needs("--adapter");
  c->add_option(
       "--qlora", o->qlora,
       "hold the frozen base quantised: nf4, fp8, int8 or nvfp4 (quantised on load; an FP8 or NVFP4 checkpoint "
       "is as stored)")
      ->check(CLI::IsMember({"none", "nf4", "fp8", "int8", "nvfp4"}))
      ->needs("--adapter")
      ->capture_default_str();
  c->add_option("--qat", o->qat,
                "quantisation-aware training's fake quantisation (model/qat.h): WEIGHT[:ACTIVATION[:GROUP]], e.g. "
                "int4:int8:32, mxfp4:mxfp4, nvfp4:nvfp4")
      ->excludes("--adapter");
  c->add_option("--batch", o->batch, "safetensors with input_ids and targets [B,T]")->required();
  c->add_option("--out", o->out, "output .safetensors file")->required();
  c->add_option("--residual-dtype", o->residual_dtype,
                "the residual stream's dtype on the GPU: auto (fp32 with LoRA, else bf16), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  c->add_option("--grpo", g->file,
                "GRPO's loss instead of cross-entropy: safetensors with rewards [B] and, as used, old_nll and ref_nll "
                "[B,T] (−log p of each target under the sampling policy and the reference)");
  c->add_option("--loss-type", g->loss_type, "GRPO: grpo, bnpo, dr_grpo or dapo")->capture_default_str();
  c->add_option("--scale-rewards", g->scale_rewards, "GRPO: group, batch or none")->capture_default_str();
  c->add_option("--importance-sampling-level", g->level, "GRPO: token or sequence")
      ->check(CLI::IsMember({"token", "sequence"}))
      ->capture_default_str();
  c->add_option("--beta", g->beta, "GRPO: the KL term's weight; --preference: its beta")->capture_default_str();
  c->add_option("--reference", g->reference,
                "GRPO with --beta: a model folder whose weights the reference pass computes with (full fine-tuning; "
                "instead of the file's ref_nll)");
  c->add_option("--epsilon", g->epsilon, "GRPO: the lower clip")->capture_default_str();
  c->add_option("--epsilon-high", g->epsilon_high, "GRPO: the upper clip (default: epsilon)");
  c->add_option("--delta", g->delta, "GRPO: cap on the importance ratio (0: none)")->capture_default_str();
  c->add_option("--use-bias-correction-kl", g->kl_ratio, "GRPO: the KL term times the importance ratio")
      ->capture_default_str();
  c->add_option("--temperature", g->temperature, "GRPO: logits divided by it")->capture_default_str();
  c->add_option("--top-entropy-quantile", g->top_entropy_quantile,
                "GRPO: the policy term at the micro-batch's highest-entropy completion tokens only (1: all)")
      ->capture_default_str();
  c->add_option("--sampling-correction", g->correction,
                "GRPO: TRL's vllm_importance_sampling_mode over the file's sampling_nll: none, token_truncate, "
                "token_mask, sequence_truncate or sequence_mask")
      ->capture_default_str();
  c->add_option("--sampling-clip-min", g->clip_min, "GRPO: the correction's lower bound (default: none)");
  c->add_option("--sampling-clip-max", g->clip_max, "GRPO: the correction's upper bound")->capture_default_str();
  c->add_option("--num-generations", g->num_generations, "GRPO: completions per prompt (consecutive rows)")
      ->capture_default_str();
  c->add_option("--max-completion-length", g->max_completion_length, "GRPO: dr_grpo's divisor (default: T)");
  c->add_option("--micro-batches", g->micro_batches, "GRPO: the rows split into this many accumulated micro-batches")
      ->capture_default_str();
  c->add_option("--preference", pd->loss,
                "a preference loss over the batch file's pairs (and ref_nll, prompt_targets as the loss needs): "
                "sigmoid, ipo, hinge, simpo, orpo, kto or apo_zero_unpaired (KTO: pairs are each example and its KL "
                "document, with the "
                "file's desirable labels) (beta from --beta)")
      ->excludes("--grpo");
  c->add_option("--label-smoothing", pd->label_smoothing, "preference: the share of pairs assumed flipped")
      ->capture_default_str();
  c->add_option("--nll-alpha", pd->nll_alpha,
                "preference: the chosen answers' NLL term's weight, rpo_alpha or SimPO's cpo_alpha (default 0 / 1; "
                "ORPO's is 1)");
  c->add_option("--simpo-gamma", pd->simpo_gamma, "preference: SimPO's target margin")->capture_default_str();
  c->add_option("--desirable-weight", pd->desirable_weight, "preference: KTO's desirable examples' weight")
      ->capture_default_str();
  c->add_option("--undesirable-weight", pd->undesirable_weight, "preference: KTO's undesirable examples' weight")
      ->capture_default_str();
  auto rw = std::make_shared<std::pair<bool, float>>(false, 0.0f);  // --reward, --center-rewards-coefficient
  c->add_flag("--reward", rw->first,
              "a reward model's Bradley-Terry loss over the batch file's pairs (TRL's RewardTrainer): the model read "
              "as its sequence classifier, each sequence scored at its last token that is not config.json's "
              "pad_token_id (--pad-token-id for a causal LM folder)")
      ->excludes("--grpo")
      ->excludes("--preference")
      ->excludes("--adapter");
  auto pad = std::make_shared<int>(-1);
  c->add_option("--pad-token-id", *pad, "--reward: the pad token id (default: config.json's)")->needs("--reward");
  c->add_option("--center-rewards-coefficient", rw->second, "--reward: TRL's center_rewards_coefficient")
      ->needs("--reward")
      ->capture_default_str();
  auto labels = std::make_shared<int>(0);
  c->add_option("--token-labels", *labels,
                "a process reward model: the model read as its token classifier with this many labels, the batch "
                "file's targets the labels at their own tokens (transformers' TokenClassification loss)")
      ->check(CLI::Range(2, 254))
      ->excludes("--reward");
  add_device_option(c, o->device);
  return [o, g, pd, rw, pad, labels]() {
    if (!o->save_adapter.empty()) {
      check_output_dir(o->save_adapter, false, "", "adapter (--save-adapter)");
      check_output_apart_from_inputs(o->save_adapter, "--save-adapter",
                                     {{o->model, "--model"}, {o->adapter, "--adapter"}});
    }
    auto ops = make_ops(o->device);
    const WeightFormat base = o->qlora == "nf4"     ? WeightFormat::Nf4
                              : o->qlora == "fp8"   ? WeightFormat::Fp8Block
                              : o->qlora == "int8"  ? WeightFormat::Int8Row
                              : o->qlora == "nvfp4" ? WeightFormat::Nvfp4
                                                    : WeightFormat::Dense;
    std::optional<AsClassifier> classifier;
    if (rw->first) {
      const int from_config = load_model_config(o->model).pad_token_id;
      classifier = AsClassifier{*pad >= 0 ? *pad : from_config};
      if (classifier->pad_token_id < 0)
        user_error("--reward: ", o->model, "/config.json has no pad_token_id: give --pad-token-id");
    }
    if (*labels > 0) classifier = AsClassifier{-1, *labels};
    if (classifier && !o->adapter.empty()) user_error("--adapter with --reward or --token-labels is not built yet");
    auto model = o->adapter.empty() ? load_pretrained(o->model, *ops, std::nullopt, true, {}, classifier)
                                    : load_pretrained_with_adapter(o->model, o->adapter, *ops, base);
    model->enable_dropout(false);  // a reference to compare with is deterministic (PEFT in eval mode)
    const HostBatch batch = load_batch_file(o->batch);
    validate_batch(batch, model->config().vocab_size, o->batch, model->config().num_labels);
    model->set_residual_dtype(parse_residual_dtype(o->residual_dtype, "--residual-dtype"));
    if (!g->file.empty()) return dump_grpo(*g, *ops, *model, batch, o->out);
    if (!pd->loss.empty()) return dump_preference(*pd, g->beta, *ops, *model, batch, o->out);
    if (rw->first) return dump_reward(rw->second, *ops, *model, batch, o->out);
    if (!o->qat.empty()) {
      std::vector<std::string> f{""};
      for (char ch : o->qat)
        if (ch == ':')
          f.emplace_back();
        else
          f.back().push_back(ch);
      int64_t group = 32;
      if (f.size() > 2) {  // (a bad number is one line, as the config's group_size is)
        char* end = nullptr;
        group = std::strtoll(f[2].c_str(), &end, 10);
        if (f[2].empty() || *end || group <= 0) user_error("--qat: group \"", f[2], "\" is not a positive integer");
      }
      model->enable_qat(parse_qat(f[0], f.size() > 1 ? f[1] : "", group, f.size() > 2, 0, "--qat: "));
    }
    model->plan(batch.rows, batch.seq_len);
    const int64_t V = model->config().head_outputs();  // (a token classifier's: its labels)
    std::vector<float> logits(size_t(batch.rows) * size_t(batch.seq_len) * size_t(V));
    ops->zero(model->params().all_grads());
    const StepResult r = model->step(batch, true, logits.data());

    float loss = float(r.loss);
    std::vector<NamedTensor> out{
        {"logits", Tensor{logits.data(), DType::F32, {batch.rows, batch.seq_len, V}, Device::CPU}},
        {"loss", Tensor{&loss, DType::F32, {1}, Device::CPU}}};
    std::vector<std::vector<float>> grads;
    add_gradients(*model, *ops, out, grads);
    write_safetensors(o->out, out);
    if (!o->save_adapter.empty()) save_adapter(*model, o->save_adapter, {o->model});
    std::cout << "loss " << r.loss << " over " << r.counted << " targets; wrote " << o->out << "\n";
    return 0;
  };
}

}  // namespace soltrain
