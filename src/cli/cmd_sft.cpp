// `soltrain sft config.yaml` and `soltrain pt config.yaml`: one YAML file (plus --set overrides) runs a
// whole training job. Exit code 130 when stopped by Ctrl-C / SIGTERM after saving a checkpoint.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "train/output_guard.h"
#include "train/run_checks.h"
#include "train/run_training.h"

namespace soltrain {

namespace {

std::function<int()> add_run_command(CLI::App& app, const char* name, const char* help, TrainMode mode) {
  struct Opts {
    std::string config;
    std::vector<std::string> set;
    std::string dump_batches;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(name, help);
  c->add_option("config", o->config, "YAML config (see examples/)")->required();
  c->add_option("--set", o->set, "override a config key: key=value (repeatable; values are YAML)");
  c->add_option("--dump-batches", o->dump_batches,
                "write every micro-batch trained on to DIR/step-S-micro-M.safetensors (input_ids, targets, "
                "positions, cu_seqlens), for checks against other trainers");
  return [o, mode]() {
    TrainConfig cfg = load_train_config(o->config, o->set, mode);
    cfg.dump_batches = o->dump_batches;
    resolve_hub_inputs(cfg, std::cerr);
    check_run_inputs(cfg);
    prepare_run_outputs(cfg, std::cerr);  // before any work: nothing the user had is written over
    auto ops = make_ops(cfg.device);
    const RunResult r = run_training(cfg, mode, *ops, std::cerr);
    return r.interrupted ? 130 : 0;
  };
}

}  // namespace

std::function<int()> add_sft_command(CLI::App& app) {
  return add_run_command(app, "sft", "supervised fine-tuning from a YAML config", TrainMode::kSft);
}

std::function<int()> add_pt_command(CLI::App& app) {
  return add_run_command(app, "pt", "pretraining / continued pretraining on text from a YAML config",
                         TrainMode::kPretrain);
}

}  // namespace soltrain
