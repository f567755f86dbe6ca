// `soltrain tokenize`: datasets (FILE[:type]) → token/mask shards and a manifest in --out, reused when
// nothing changed. `soltrain tokenize config.yaml` prepares a training config's datasets the way sft will.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/hub_inputs.h"
#include "core/error.h"
#include "data/tokenize_job.h"
#include "io/output_dir.h"
#include "train/output_guard.h"
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
    bool quiet = false, pt = false, overwrite = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("tokenize", "tokenize datasets into token/loss-mask shards");
  c->add_option("config", o->config, "a training config: tokenize its datasets into its dataset_prepared_path");
  c->add_option("--set", o->set, "override a config key: key=value (repeatable)");
  c->add_flag("--pt", o->pt, "prepare the config for `soltrain pt` (text, every token trained) rather than sft");
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
      const TrainMode mode = o->pt ? TrainMode::kPretrain : TrainMode::kSft;  // the shards' settings differ
      TrainConfig cfg = load_train_config(o->config, o->set, mode);
      resolve_hub_inputs(cfg, std::cerr);
      const OutputLock lock = prepare_run_outputs(cfg, std::cerr);
      const TrainData d = prepare_train_data(cfg, std::cerr);
      std::cerr << "tokenize: " << d.train.documents() << " training and " << d.validation.documents()
                << " validation documents ready\n";
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
