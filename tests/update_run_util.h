// A short training run for comparing how an update is made (optimizer_in_backward, bf16_stochastic_round): the
// demo's tiny model (or a Qwen3-MoE of `experts` experts) on the word-reversal set, 8 steps logged each, a
// checkpoint at step 4, no clipping; `extra` keys replace or add to these.
#pragma once
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain::test {

struct UpdateRunSetup {
  TempDir t;
  explicit UpdateRunSetup(int experts = 0) {
    DemoModelShape s;
    s.hidden = 64, s.layers = 3, s.heads = 2, s.kv_heads = 1, s.head_dim = 32, s.intermediate = 128;
    s.experts = experts;
    write_random_model(t.path / "model", s, 11);
    write_reversal_dataset(t.path / "train.jsonl", 200, 8);
  }
  std::filesystem::path config(const std::string& out, const std::string& extra) const {
    const std::filesystem::path p = t.path / (out + ".yaml");
    write_text(p, yaml_with("model: model\noutput_dir: " + out +
                                "\ndatasets:\n  - path: train.jsonl\n    type: conversation\n"
                                "dataset_prepared_path: prepared\nsequence_len: 64\nlearning_rate: 3.0e-3\n"
                                "lr_scheduler_type: cosine\nwarmup_steps: 2\nper_device_train_batch_size: 2\n"
                                "logging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0\nmax_steps: 8\nsave_steps: 4\n",
                            extra));
    return p;
  }
  // `soltrain sft` in process on the CPU: the log it printed.
  std::string train(const std::string& out, const std::string& extra, const std::vector<std::string>& set = {}) const {
    auto ops = make_cpu_ops();
    std::ostringstream log;
    run_training(load_train_config(config(out, extra), set, TrainMode::kSft), TrainMode::kSft, *ops, log);
    return log.str();
  }
  // A file of run `run`'s output folder ("" when missing).
  std::string file(const std::string& run, const std::string& name) const { return read_bytes(t.path / run / name); }
  std::vector<double> losses(const std::string& run) const {
    std::vector<double> l;
    for (const auto& j : read_jsonl(t.path / run / "metrics.jsonl"))
      if (j.contains("loss")) l.push_back(j["loss"].get<double>());
    return l;
  }
};

}  // namespace soltrain::test
