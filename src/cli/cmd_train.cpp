// `soltrain train config.yaml`: the config's job, as Axolotl's `train config.yaml` (sft, or dpo with `rl: dpo`).
// `soltrain train --model M --batch B --out O`: a few AdamW steps on one batch file, printing the loss, then an
// HF folder (a low-level check; `sft` / `pt` train on real datasets).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "data/batch_file.h"
#include "io/output_dir.h"
#include "model/checkpoint.h"
#include "train/trainer.h"

namespace soltrain {

std::function<int()> add_train_command(CLI::App& app) {
  struct Opts {
    std::string config, model, batch, out, device = "cpu";
    std::vector<std::string> set;
    int steps = 20;
    bool overwrite = false;
    OptimizerConfig opt{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(
      "train", "run a YAML config's job (as `axolotl train`), or train on one batch file (--model --batch --out)");
  c->add_option("config", o->config, "YAML config: its job runs as `soltrain sft` (dpo with rl: dpo) runs it");
  c->add_option("--set", o->set, "override a config key: key=value (repeatable; values are YAML)");
  c->add_option("--model", o->model, "Hugging Face model folder to start from");
  c->add_option("--batch", o->batch, "safetensors with input_ids and targets [B,T]");
  c->add_option("--out", o->out, "output folder for the trained model");
  c->add_option("--steps", o->steps, "optimizer steps")->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--lr", o->opt.lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--beta1", o->opt.beta1)->check(CLI::Range(0.0, 1.0))->capture_default_str();
  c->add_option("--beta2", o->opt.beta2)->check(CLI::Range(0.0, 1.0))->capture_default_str();
  c->add_option("--eps", o->opt.eps)->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--weight-decay", o->opt.weight_decay)->check(CLI::NonNegativeNumber)->capture_default_str();
  c->add_option("--max-grad-norm", o->opt.max_grad_norm, "global-norm clipping; 0 disables")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_flag("--overwrite", o->overwrite, "replace --out even if it holds files soltrain did not write");
  add_device_option(c, o->device);
  return [o]() {
    if (!o->config.empty()) {
      if (!o->model.empty() || !o->batch.empty() || !o->out.empty())
        user_error("train: give either a config file or --model/--batch/--out, not both");
      return run_config_job(o->config, o->set, TrainMode::kSft);
    }
    if (o->model.empty() || o->batch.empty() || o->out.empty())
      user_error("train: give a config file (soltrain train config.yaml), or --model, --batch and --out");
    if (!o->set.empty()) user_error("train: --set overrides a config file's keys; no config file was given");
    check_output_dir(o->out, o->overwrite, "--overwrite", "trained model (--out)");
    check_output_apart_from_inputs(o->out, "--out", {{o->model, "--model"}, {o->batch, "--batch"}});
    auto ops = make_ops(o->device);
    auto model = load_pretrained(o->model, *ops);
    const HostBatch batch = load_batch_file(o->batch);
    validate_batch(batch, model->config().vocab_size, o->batch);
    const double tokens = double(batch.rows) * batch.seq_len;
    std::printf("model %s: %.2fM parameters, batch %d x %d, %d steps on %s\n", model->config().architecture.c_str(),
                double(model->params().numel()) / 1e6, batch.rows, batch.seq_len, o->steps, o->device.c_str());
    const TrainHistory h = train_on_batch(*model, batch, o->opt, o->steps, [&](const StepLog& s) {
      std::printf("step %3d/%d  loss %.4f  grad_norm %.3f  %.0f tok/s\n", s.step, o->steps, s.loss, s.grad_norm,
                  tokens / s.seconds);
      std::fflush(stdout);
    });
    if (!std::isfinite(h.losses.back())) user_error("training diverged (loss ", h.losses.back(), "): lower --lr");
    std::printf("loss %.4f -> %.4f\n", h.losses.front(), h.losses.back());
    save_pretrained(*model, o->out, o->model, model_dtype(o->model));
    std::printf("saved %s\n", o->out.c_str());
    return 0;
  };
}

}  // namespace soltrain
