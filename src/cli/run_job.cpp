#include "cli/run_job.h"

#include <cstdlib>
#include <filesystem>

#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "core/error.h"
#include "dist/launch.h"
#include "io/sha256.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"
#include "train/evaluate.h"
#include "train/output_guard.h"
#include "train/run_builder.h"
#include "train/run_checks.h"
#include "train/run_dpo.h"
#include "train/run_grpo.h"
#include "train/run_tokenizer.h"
#include "train/train_data.h"

namespace soltrain {

namespace {

// Ranks started with different configs hang at mismatched collectives (save_steps 5 vs 7, lora on one) or
// train diverging replicas (another learning rate or seed) with exit 0: before any work every rank
// compares a hash of its config (the YAML as given plus overrides) with the others'.
void check_same_config(Communicator& comm, const TrainConfig& c) {
  const std::string digest = sha256_hex(c.source_text);
  const int64_t h = int64_t(std::stoull(digest.substr(0, 15), nullptr, 16));  // 60 bits: -h fits
  const int64_t most = comm.all_max_host(h), least = -comm.all_max_host(-h);
  if (most != least)
    user_error("the ranks were started with different configs (this rank's config hash ", digest.substr(0, 12),
               "): start every rank with the same config file and --set overrides");
}

}  // namespace

RunResult run_job(TrainConfig cfg, TrainMode mode, std::ostream& log, LoopHooks hooks, InProcessRewards rewards) {
  resolve_hub_inputs(cfg, log);
  if (cfg.dpo.enabled || cfg.grpo.enabled) {  // `soltrain dpo` / `grpo`, or `rl: dpo` / `rl: grpo` in a config
    if (cfg.gpus > 1)
      user_error(cfg.dpo.enabled ? "dpo" : "grpo", ": data parallel (gpus: ", cfg.gpus, ") is not built yet for ",
                 cfg.dpo.enabled ? "preference training" : "online RL", "; use gpus: 1");
    check_run_inputs(cfg);
    const OutputLock lock = prepare_run_outputs(cfg, log);
    prepare_run_tokenizer(cfg);
    auto ops = make_ops(cfg.device);
    if (cfg.dpo.reward_model) return run_reward(cfg, *ops, log, std::move(hooks));
    return cfg.dpo.enabled ? run_dpo(cfg, *ops, log, std::move(hooks))
                           : run_grpo(cfg, *ops, log, std::move(hooks), std::move(rewards));
  }
  LaunchEnv env = read_launch_env();
  if (cfg.ray.enabled && env.kind == LaunchEnv::Kind::Single)  // (Ray's actors run it with torchrun's variables)
    user_error(
        "this config is a Ray job (use_ray, distributed): start it with `soltrain sft CONFIG` or "
        "soltrain.ray.train(config)");
  env.timeout_s = cfg.ddp_timeout;
  select_local_device(env, cfg.device);
  auto ops = make_ops(cfg.device);
  // SOLTRAIN_COMMUNICATOR=nccl (or mpi) runs that communicator even alone, for checks that it trains
  // bitwise as a single process does.
  const char* force = std::getenv("SOLTRAIN_COMMUNICATOR");
  auto comm = make_communicator(env, *ops, force ? force : "");
  if (comm->size() > 1) {
    set_error_prefix(cat("rank ", comm->rank(), ": "));
    check_same_config(*comm, cfg);
  }
  check_run_inputs(cfg);
  OutputLock lock;  // before any work: nothing the user had is written over, and no other run writes there
  if (comm->rank() == 0) lock = prepare_run_outputs(cfg, log);
  comm->barrier();
  prepare_run_tokenizer(cfg);
  // (Axolotl's pretraining_dataset or a LLaMA-Factory pt stage makes `soltrain train`'s sft run a pt run)
  const TrainMode run_mode = mode == TrainMode::kSft && cfg.mode == TrainMode::kPretrain ? cfg.mode : mode;
  return run_training(cfg, run_mode, *ops, log, comm.get(), std::move(hooks));
}

JobEvaluation evaluate_job(TrainConfig cfg, std::ostream& log) {
  namespace fs = std::filesystem;
  if (cfg.dpo.enabled)
    user_error(
        "evaluate: a preference run reports its validation metrics while it trains (eval_steps); evaluate() "
        "for dpo is not built yet");
  resolve_hub_inputs(cfg, log);
  check_run_inputs(cfg);
  prepare_run_tokenizer(cfg);
  const TrainData data = as_data_error([&] { return prepare_train_data(cfg, log); });
  if (data.validation.documents() == 0)
    user_error("evaluate: no validation data: give validation_datasets (eval_dataset) or validation_split_ratio");
  auto ops = make_ops(cfg.device);
  const fs::path adapter = cfg.output_dir / "adapter", trained = cfg.output_dir / "model";
  std::unique_ptr<Transformer> model;
  JobEvaluation out;
  if (cfg.lora.enabled && fs::exists(adapter / "adapter_config.json")) {
    model = load_pretrained_with_adapter(cfg.model, adapter, *ops, cfg.lora.base, run_vocab_resize(cfg));
    out.model = adapter.string();
  } else if (!cfg.lora.enabled && fs::exists(trained / "config.json")) {
    model = load_pretrained(trained, *ops);
    out.model = trained.string();
  } else {
    model = load_pretrained(cfg.model, *ops, std::nullopt, true, {}, std::nullopt, run_vocab_resize(cfg));
    out.model = cfg.model.string();
  }
  configure_model(*model, cfg, *ops, cfg.per_device_train_batch_size);
  const EvalResult e = evaluate(*model, data.validation, cfg.per_device_train_batch_size, cfg.sequence_len);
  out.loss = e.loss;
  out.tokens = e.tokens;
  return out;
}

}  // namespace soltrain
