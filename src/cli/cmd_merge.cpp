// `soltrain merge`: a base model plus a PEFT LoRA adapter → one Hugging Face folder with the adapter folded in.
// `soltrain merge-lora config.yaml`: the same for a config's run, as Axolotl's merge-lora (output_dir/merged).
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/hub_inputs.h"
#include "io/output_dir.h"
#include "model/lora_merge.h"

namespace soltrain {

std::function<int()> add_merge_command(CLI::App& app) {
  struct Opts {
    std::string model, adapter, out;
    bool overwrite = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("merge", "fold a PEFT LoRA adapter into its base model (an HF folder)");
  c->add_option("--model", o->model, "Hugging Face base model folder or hub id (Org/Name)")->required();
  c->add_option("--adapter", o->adapter, "PEFT adapter folder (adapter_config.json, adapter_model.safetensors)")
      ->required();
  c->add_option("--out", o->out, "output folder for the merged model")->required();
  c->add_flag("--overwrite", o->overwrite, "replace --out even if it holds files soltrain did not write");
  return [o]() {
    check_output_dir(o->out, o->overwrite, "--overwrite", "merged model (--out)");
    o->model = local_or_hub_model(o->model, std::cerr).string();
    check_output_apart_from_inputs(o->out, "--out", {{o->model, "--model"}, {o->adapter, "--adapter"}});
    merge_adapter(o->model, o->adapter, o->out);
    std::cout << "merged " << o->adapter << " into " << o->model << "; wrote " << o->out << "\n";
    return 0;
  };
}

std::function<int()> add_merge_lora_command(CLI::App& app) {
  struct Opts {
    std::string config, lora_model_dir, out;
    std::vector<std::string> set;
    bool overwrite = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(
      "merge-lora",
      "fold a config's trained LoRA adapter into its base model, written to output_dir/merged (Axolotl's)");
  c->add_option("config", o->config, "the training config (its model and output_dir)")->required();
  c->add_option("--lora-model-dir", o->lora_model_dir, "the adapter folder; default output_dir/adapter");
  c->add_option("--out", o->out, "output folder; default output_dir/merged");
  c->add_option("--set", o->set, "override a config key: key=value (repeatable)");
  c->add_flag("--overwrite", o->overwrite, "replace the output even if it holds files soltrain did not write");
  return [o]() {
    const TrainConfig cfg = load_train_config(o->config, o->set, TrainMode::kSft);
    const std::filesystem::path adapter =
        o->lora_model_dir.empty() ? cfg.output_dir / "adapter" : std::filesystem::path(o->lora_model_dir);
    const std::filesystem::path out = o->out.empty() ? cfg.output_dir / "merged" : std::filesystem::path(o->out);
    if (!std::filesystem::exists(adapter / "adapter_config.json"))
      user_error("merge-lora: ", adapter.string(), " holds no adapter (adapter_config.json): train the config first, ",
                 "or give --lora-model-dir");
    check_output_dir(out, o->overwrite, "--overwrite", "merged model");
    const std::filesystem::path model =
        cfg.model_hub_id.empty() ? cfg.model : local_or_hub_model(cfg.model_hub_id, std::cerr);
    check_output_apart_from_inputs(out, "--out", {{model, "model"}, {adapter, "--lora-model-dir"}});
    merge_adapter(model, adapter, out);
    std::cout << "merged " << adapter.string() << " into " << model.string() << "; wrote " << out.string() << "\n";
    return 0;
  };
}

}  // namespace soltrain
