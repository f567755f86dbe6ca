// `soltrain merge`: a base model plus a PEFT LoRA adapter → one Hugging Face folder with the adapter folded in.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "model/lora_merge.h"

namespace soltrain {

std::function<int()> add_merge_command(CLI::App& app) {
  struct Opts {
    std::string model, adapter, out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("merge", "fold a PEFT LoRA adapter into its base model (an HF folder)");
  c->add_option("--model", o->model, "Hugging Face base model folder")->required();
  c->add_option("--adapter", o->adapter, "PEFT adapter folder (adapter_config.json, adapter_model.safetensors)")
      ->required();
  c->add_option("--out", o->out, "output folder for the merged model")->required();
  return [o]() {
    merge_adapter(o->model, o->adapter, o->out);
    std::cout << "merged " << o->adapter << " into " << o->model << "; wrote " << o->out << "\n";
    return 0;
  };
}

}  // namespace soltrain
