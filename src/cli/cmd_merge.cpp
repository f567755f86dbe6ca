// `soltrain merge`: a base model plus a PEFT LoRA adapter → one Hugging Face folder with the adapter folded in.
#include <iostream>
#include <memory>

#include "cli/commands.h"
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

}  // namespace soltrain
