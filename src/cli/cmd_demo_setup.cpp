// `soltrain demo-setup --out DIR`: writes what scripts/demo.sh trains: DIR/model (a random small Qwen3 with
// a byte tokenizer) and DIR/train.jsonl, DIR/validation.jsonl (word reversal as conversations), and the same
// task as preference pairs for `soltrain dpo` (DIR/dpo_train.jsonl, DIR/dpo_validation.jsonl). --label-noise
// makes a fraction of the conversations' answers random words (bench/convergence.sh: a loss floor above 0).
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/demo_kit.h"
#include "io/output_dir.h"

namespace soltrain {

std::function<int()> add_demo_setup_command(CLI::App& app) {
  struct Opts {
    std::string out;
    int train = 4000, validation = 200;
    uint64_t seed = 1;
    double label_noise = 0.0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("demo-setup", "write the demo's random model and synthetic datasets");
  c->add_option("--out", o->out, "folder to write model/, train.jsonl and validation.jsonl into")->required();
  c->add_option("--train", o->train, "training conversations")->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--validation", o->validation, "validation conversations")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--seed", o->seed)->capture_default_str();
  c->add_option("--label-noise", o->label_noise,
                "fraction of conversations whose answer is a random word of the same length (a known loss floor)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  return [o]() {
    const std::filesystem::path out = o->out;
    check_output_dir(out / "model", false, "", "demo model (--out/model)");
    write_random_model(out / "model", DemoModelShape{}, o->seed);
    write_reversal_dataset(out / "train.jsonl", o->train, o->seed + 1, o->label_noise);
    write_reversal_dataset(out / "validation.jsonl", o->validation, o->seed + 2, o->label_noise);
    write_reversal_preferences(out / "dpo_train.jsonl", o->train, o->seed + 3);
    write_reversal_preferences(out / "dpo_validation.jsonl", o->validation, o->seed + 4);
    std::cerr << "demo-setup: wrote " << (out / "model").string() << ", " << o->train << " training and "
              << o->validation << " validation conversations\n";
    return 0;
  };
}

}  // namespace soltrain
