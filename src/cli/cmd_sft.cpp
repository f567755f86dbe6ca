// `soltrain sft config.yaml` and `soltrain pt config.yaml`: one YAML file (plus --set overrides) runs a
// whole training job. Exit code 130 when stopped by Ctrl-C / SIGTERM after saving a checkpoint.
#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "cli/launch_workers.h"
#include "core/error.h"
#include "dist/launch.h"
#include "train/output_guard.h"
#include "train/run_checks.h"
#include "train/run_dpo.h"
#include "train/run_training.h"

namespace soltrain {

namespace {

std::function<int()> add_run_command(CLI::App& app, const char* name, const char* help, TrainMode mode) {
  struct Opts {
    std::string config;
    std::vector<std::string> set;
    std::string dump_batches;
    int gpus = 0;
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
  return [o, mode]() {
    TrainConfig cfg = load_train_config(o->config, o->set, mode);
    cfg.dump_batches = o->dump_batches;
    resolve_hub_inputs(cfg, std::cerr);
    if (o->gpus > 0) cfg.gpus = o->gpus;
    if (cfg.dpo.enabled) {  // `soltrain dpo`, or an sft config with Axolotl's `rl: dpo`
      if (cfg.gpus > 1)
        user_error("dpo: data parallel (gpus: ", cfg.gpus, ") is not built yet for preference training; use gpus: 1");
      if (!o->dump_batches.empty()) user_error("--dump-batches is not built yet for dpo");
      check_run_inputs(cfg);
      prepare_run_outputs(cfg, std::cerr);
      auto ops = make_ops(cfg.device);
      return run_dpo(cfg, *ops, std::cerr).interrupted ? 130 : 0;
    }
    const LaunchEnv env = read_launch_env();
    if (cfg.gpus > 1 && env.kind == LaunchEnv::Kind::Single) {
      check_worker_count(cfg.gpus, cfg.device);
      check_run_inputs(cfg);
      prepare_run_outputs(cfg, std::cerr);  // once, before the workers start
      return launch_workers(cfg.gpus, cfg.device);
    }
    select_local_device(env, cfg.device);
    auto ops = make_ops(cfg.device);
    // SOLTRAIN_COMMUNICATOR=nccl (or mpi) runs that communicator even alone, for checks that it trains
    // bitwise as a single process does.
    const char* force = std::getenv("SOLTRAIN_COMMUNICATOR");
    auto comm = make_communicator(env, *ops, force ? force : "");
    if (comm->size() > 1) set_error_prefix(cat("rank ", comm->rank(), ": "));
    check_run_inputs(cfg);
    if (comm->rank() == 0)
      prepare_run_outputs(cfg, std::cerr);  // before any work: nothing the user had is written over
    comm->barrier();
    const RunResult r = run_training(cfg, mode, *ops, std::cerr, comm.get());
    return r.interrupted ? 130 : 0;
  };
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
