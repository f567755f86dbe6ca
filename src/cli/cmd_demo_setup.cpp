// `soltrain demo-setup --out DIR`: writes what scripts/demo.sh trains: DIR/model (a random small Qwen3 with
// a byte tokenizer) and DIR/train.jsonl, DIR/validation.jsonl (word reversal as conversations), and the same
// task as preference pairs for `soltrain dpo` (DIR/dpo_train.jsonl, DIR/dpo_validation.jsonl). --label-noise
// makes a fraction of the conversations' answers random words (bench/convergence.sh: a loss floor above 0).
// --hidden-size, --layers, --heads, --kv-heads, --intermediate-size change the random model's shape (defaults:
// the demo's 0.8M-parameter one); --model-only writes DIR/model alone (bench/convergence.sh brings its own data).
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
    DemoModelShape shape;
    int kv_heads = 0;  // 0: half the heads (the demo's 4 / 2), at least 1
    bool model_only = false;
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
  c->add_option("--hidden-size", o->shape.hidden, "the model's hidden size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--layers", o->shape.layers, "decoder layers")->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--heads", o->shape.heads, "attention heads (head dim = hidden size / heads)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--kv-heads", o->kv_heads, "key/value heads (default: half the heads, at least 1)")
      ->check(CLI::PositiveNumber);
  c->add_option("--intermediate-size", o->shape.intermediate, "the MLP's intermediate size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_flag("--model-only", o->model_only, "write --out/model only, no datasets");
  return [o]() {
    const std::filesystem::path out = o->out;
    const DemoModelShape shape = demo_model_shape(o->shape.hidden, o->shape.layers, o->shape.heads, o->kv_heads,
                                                  o->shape.intermediate);
    check_output_dir(out / "model", false, "", "demo model (--out/model)");
    write_random_model(out / "model", shape, o->seed);
    if (o->model_only) {
      std::cerr << "demo-setup: wrote " << (out / "model").string() << " (hidden " << shape.hidden << ", "
                << shape.layers << " layers)\n";
      return 0;
    }
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
