// A small training setup on the demo's task (reverse a word) for whole-run tests: a random Qwen3-shaped model
// of 2 layers by default (every projection width a multiple of 16, so FP8 GEMMs take it), 300 training and 40
// validation conversations, and configs over them with a test's own keys on top.
#pragma once
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain::test {

struct DemoRunSetup {
  TempDir t;
  std::string defaults;  // keys every config of this setup has (a test's `extra` still replaces them)

  // common: keys the base config below lacks (to replace one of its keys, pass it in config()'s `extra`).
  explicit DemoRunSetup(std::string common = "", int layers = 2) : defaults(std::move(common)) {
    DemoModelShape s;
    s.hidden = 64, s.layers = layers, s.heads = 2, s.kv_heads = 1, s.head_dim = 32, s.intermediate = 128;
    write_random_model(t.path / "model", s, 11);
    write_reversal_dataset(t.path / "train.jsonl", 300, 8);
    write_reversal_dataset(t.path / "val.jsonl", 40, 9);
  }
  std::filesystem::path config(const std::string& out, const std::string& extra) const {
    const std::filesystem::path p = t.path / (out + ".yaml");
    write_text(p, yaml_with("model: model\noutput_dir: " + out +
                                "\ndatasets:\n  - path: train.jsonl\n    type: conversation\n"
                                "validation_datasets: [{path: val.jsonl, type: conversation}]\n"
                                "dataset_prepared_path: prepared\nsequence_len: 64\n"
                                "per_device_train_batch_size: 4\nlearning_rate: 3.0e-3\n"
                                "lr_scheduler_type: cosine\nwarmup_steps: 2\nlogging_steps: 10\n" +
                                defaults,
                            extra));
    return p;
  }
  // `soltrain sft` in process on `ops` (the CPU's, or a CUDA test's) with config(out, extra) and `set`
  // overrides: the log it printed.
  std::string train(Ops& ops, const std::string& out, const std::string& extra,
                    const std::vector<std::string>& set = {}) const {
    std::ostringstream log;
    run_training(load_train_config(config(out, extra), set, TrainMode::kSft), TrainMode::kSft, ops, log);
    return log.str();
  }
};

}  // namespace soltrain::test
