// `soltrain sft config.yaml` and `soltrain pt config.yaml`: one YAML file (plus --set overrides) runs a
// whole training job. Exit code 130 when stopped by Ctrl-C / SIGTERM after saving a checkpoint.
#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/hub_inputs.h"
#include "cli/launch_workers.h"
#include "cli/run_job.h"
#include "dist/launch.h"
#include "train/output_guard.h"
#include "train/run_checks.h"

namespace soltrain {

int run_config_job(const std::string& config, const std::vector<std::string>& set, TrainMode mode,
                   const std::string& dump_batches, int gpus, bool verbose) {
  TrainConfig cfg = load_train_config(config, set, mode);
  cfg.dump_batches = dump_batches;
  cfg.verbose = verbose;
  if (gpus > 0) cfg.gpus = gpus;
  // auto_resume needs a process that outlives the trainer: the launcher, also for one worker.
  if (!cfg.dpo.enabled && (cfg.gpus > 1 || cfg.auto_resume) && read_launch_env().kind == LaunchEnv::Kind::Single) {
    resolve_hub_inputs(cfg, std::cerr);
    check_worker_count(cfg.gpus, cfg.device);
    check_run_inputs(cfg);
    const OutputLock lock = prepare_run_outputs(cfg, std::cerr);  // once, before the workers start
    lock.share_with_children();                                   // held while any worker lives
    std::optional<AutoResume> ar;
    if (cfg.auto_resume) ar = AutoResume{cfg.max_restarts, cfg.output_dir};
    return launch_workers(cfg.gpus, cfg.device, std::min(60, cfg.ddp_timeout + 5), ar);
  }
  return run_job(std::move(cfg), mode, std::cerr).interrupted ? 130 : 0;
}

namespace {

std::function<int()> add_run_command(CLI::App& app, const char* name, const char* help, TrainMode mode) {
  struct Opts {
    std::string config;
    std::vector<std::string> set;
    std::string dump_batches;
    int gpus = 0;
    bool verbose = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(name, help);
  c->add_option("config", o->config, "YAML config (see examples/)")->required();
  c->add_option("--set", o->set, "override a config key: key=value (repeatable; values are YAML)");
  c->add_option("--dump-batches", o->dump_batches,
                "write every micro-batch trained on to DIR/step-S-micro-M.safetensors (input_ids, targets, "
                "positions, cu_seqlens), for checks against other trainers");
  c->add_option("--gpus", o->gpus,
                "start N worker processes on this machine, one per GPU (CPU ranks with device: cpu); "
                "overrides the config's gpus")
      ->check(CLI::Range(1, 1024));
  c->add_flag("--verbose", o->verbose, "the whole memory plan (every activation buffer), not only its largest");
  return [o, mode]() { return run_config_job(o->config, o->set, mode, o->dump_batches, o->gpus, o->verbose); };
}

}  // namespace

std::function<int()> add_sft_command(CLI::App& app) {
  return add_run_command(app, "sft", "supervised fine-tuning from a YAML config", TrainMode::kSft);
}

std::function<int()> add_dpo_command(CLI::App& app) {
  return add_run_command(app, "dpo", "preference training (DPO, IPO, hinge) from a YAML config", TrainMode::kDpo);
}

std::function<int()> add_pt_command(CLI::App& app) {
  return add_run_command(app, "pt", "pretraining / continued pretraining on text from a YAML config",
                         TrainMode::kPretrain);
}

}  // namespace soltrain
