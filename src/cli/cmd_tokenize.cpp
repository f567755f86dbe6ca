// `soltrain tokenize`: datasets (FILE[:type]) → token/mask shards and a manifest in --out, reused when
// nothing changed. `soltrain tokenize config.yaml` prepares a training config's datasets the way sft will.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/hub_inputs.h"
#include "core/error.h"
#include "data/sample_preview.h"
#include "data/tokenize_job.h"
#include "io/output_dir.h"
#include "train/output_guard.h"
#include "train/preference_data.h"
#include "train/run_tokenizer.h"
#include "train/train_data.h"

namespace soltrain {

namespace {

// "path[:type]": a type suffix is recognised only when it names a type, so paths with colons still work.
DatasetSource parse_source(const std::string& arg) {
  const size_t colon = arg.rfind(':');
  if (colon != std::string::npos) {
    if (const auto t = find_dataset_type(std::string_view(arg).substr(colon + 1))) return {arg.substr(0, colon), *t};
  }
  return {arg, DatasetType::kAuto};
}

}  // namespace

std::function<int()> add_tokenize_command(CLI::App& app) {
  struct Opts {
    TokenizeOptions t;
    std::vector<std::string> data;
    std::string bad_records = "error", config;
    std::vector<std::string> set;
    bool quiet = false, pt = false, dpo = false, overwrite = false;
    bool debug = false, debug_text_only = false;
    int64_t debug_num_examples = 5;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("tokenize", "tokenize datasets into token/loss-mask shards");
  c->alias("preprocess");  // Axolotl's name for it: `axolotl preprocess config.yaml --debug`
  c->add_option("config", o->config, "a training config: tokenize its datasets into its dataset_prepared_path");
  c->add_option("--set", o->set, "override a config key: key=value (repeatable)");
  c->add_flag("--pt", o->pt, "prepare the config for `soltrain pt` (text, every token trained) rather than sft");
  c->add_flag("--dpo", o->dpo, "prepare the config for `soltrain dpo` (preference pairs); `rl: dpo` in it does too");
  c->add_flag("--debug", o->debug,
              "print the first documents token by token as text(label, id), label -100 where not trained "
              "(Axolotl's preprocess --debug; coloured in a terminal)");
  c->add_option("--debug-num-examples", o->debug_num_examples, "documents (or pairs) --debug prints")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_flag("--debug-text-only", o->debug_text_only, "--debug without the (label, id) of each token");
  c->add_option("--tokenizer", o->t.tokenizer, "model folder with tokenizer.json and tokenizer_config.json");
  c->add_option("--data", o->data,
                "FILE[:type] (.jsonl, .json, .csv, .tsv, .parquet, .gz/.zst of the text formats, or a folder of them), "
                "repeatable");
  c->add_option("--out", o->t.out, "output folder for the shards and manifest.json");
  c->add_option("--seq-len", o->t.seq_len, "training sequence length (reports documents longer than it)");
  c->add_flag("--train-on-inputs", o->t.train_on_inputs, "train on prompt tokens too, not only assistant turns");
  c->add_option("--bad-records", o->bad_records, "skip (count and continue) or error (stop) on a bad record");
  c->add_option("--text-field", o->t.fields.text, "field holding the text of text datasets");
  c->add_option("--system-prompt", o->t.fields.system_prompt, "system message prepended to conversations");
  c->add_flag("--quiet", o->quiet, "no progress line");
  c->add_flag("--overwrite", o->overwrite, "replace --out even if it holds files soltrain did not write");
  return [o]() {
    if (!o->config.empty()) {
      if (!o->data.empty() || !o->t.tokenizer.empty() || !o->t.out.empty())
        user_error("tokenize: give either a config file or --tokenizer/--data/--out, not both");
      if (o->pt && o->dpo) user_error("tokenize: --pt and --dpo prepare different data; give one");
      // the shards' settings differ by command
      const TrainMode mode = o->pt ? TrainMode::kPretrain : o->dpo ? TrainMode::kDpo : TrainMode::kSft;
      TrainConfig cfg = load_train_config(o->config, o->set, mode);
      resolve_hub_inputs(cfg, std::cerr);
      const OutputLock lock = prepare_run_outputs(cfg, std::cerr);
      for (const std::string& n : resolve_run_tokenizer(cfg).notes) std::cerr << "tokenize: " << n << "\n";
      const bool pairs = cfg.mode == TrainMode::kDpo;  // `rl: dpo` in the config makes it a preference run
      ShardSet train, validation;
      if (pairs) {
        PreferenceData d = prepare_preference_data(cfg, std::cerr);
        train = std::move(d.train), validation = std::move(d.validation);
      } else {
        TrainData d = prepare_train_data(cfg, std::cerr);
        train = std::move(d.train), validation = std::move(d.validation);
      }
      if (cfg.streaming)  // (as Axolotl's streaming datasets need no `axolotl preprocess`)
        std::cerr << "tokenize: the training datasets are streamed ("
                  << (cfg.pretraining_dataset ? "pretraining_dataset" : "streaming")
                  << "): read and tokenized as training reaches them, nothing prepared here\n";
      const char* unit = pairs ? " pairs" : " documents";
      const int64_t per = pairs ? 2 : 1;
      std::cerr << "tokenize: " << train.documents() / per << " training and " << validation.documents() / per
                << " validation" << unit << " ready\n";
      if (o->debug) {
        PreviewOptions p{o->debug_num_examples, ::isatty(1) != 0, o->debug_text_only, pairs};
        print_sample_preview(train, Tokenizer::load(run_tokenizer_folder(cfg)), p, std::cout);
      }
      return 0;
    }
    if (o->t.tokenizer.empty() || o->data.empty() || o->t.out.empty())
      user_error("tokenize: give a config file, or --tokenizer, --data and --out");
    check_output_dir(o->t.out, o->overwrite, "--overwrite", "shards (--out)");
    std::vector<std::pair<std::filesystem::path, std::string>> inputs = {{o->t.tokenizer, "--tokenizer"}};
    for (const std::string& d : o->data) inputs.emplace_back(parse_source(d).path, "--data");
    check_output_apart_from_inputs(o->t.out, "--out", inputs);
    o->t.bad_records = parse_bad_record_policy(o->bad_records);
    for (const std::string& d : o->data) o->t.sources.push_back(parse_source(d));
    o->t.progress = !o->quiet;
    run_tokenize(o->t, std::cerr);
    return 0;
  };
}

}  // namespace soltrain
