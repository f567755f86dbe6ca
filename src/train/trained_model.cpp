#include "train/trained_model.h"

#include <algorithm>

#include "core/version.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "train/run_tokenizer.h"

namespace soltrain {

namespace fs = std::filesystem;

AdapterBase adapter_base(const TrainConfig& c) {
  if (c.model_hub_id.empty()) return {c.model.string(), ""};
  return {c.model_hub_id, c.revision == "main" ? "" : c.revision};
}

DType save_dtype(const TrainConfig& c) {
  return c.save_dtype ? *c.save_dtype : model_dtype(c.model);
}

void write_trained_model(const TrainConfig& c, const Transformer& model, const fs::path& dir, bool fp32_masters) {
  const bool lora = model.lora().has_value();
  if (lora) {
    write_adapter(model, dir, adapter_base(c));
  } else {
    write_pretrained(model, dir, c.model, fp32_masters ? DType::F32 : save_dtype(c));
  }
  // Axolotl's output has them (one folder serves the weights or adapter and its text): the run's tokenizer, with
  // the tokens it added (train/run_tokenizer.h), over the model's own
  copy_tokenizer_files(run_tokenizer_folder(c), dir);
  write_file_atomic(dir / "README.md", model_card(c, lora));
}

void save_trained_model(const TrainConfig& c, const Transformer& model, const fs::path& out_dir) {
  StagedDir staged(out_dir);
  write_trained_model(c, model, staged.path());
  staged.commit();
}

namespace {
// A YAML scalar in double quotes (hub ids and paths may hold ':' or '#').
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}
}  // namespace

std::string model_card(const TrainConfig& c, bool lora) {
  const std::string base = c.model_hub_id.empty() ? c.model.string() : c.model_hub_id;
  const std::string method = c.mode == TrainMode::kDpo        ? "dpo"
                             : c.mode == TrainMode::kGrpo     ? "grpo"
                             : c.mode == TrainMode::kPretrain ? "pt"
                                                              : "sft";
  std::string s = "---\n";
  if (!c.model_hub_id.empty()) s += "base_model: " + quoted(c.model_hub_id) + "\n";
  s += cat("library_name: ", lora ? "peft" : "transformers", "\npipeline_tag: text-generation\ntags:\n- soltrain\n- ",
           method, "\n");
  if (lora) s += "- lora\n";
  std::vector<std::string> hub_datasets;
  for (const DatasetSpec& d : c.datasets)
    if (!d.hub_id.empty() && std::find(hub_datasets.begin(), hub_datasets.end(), d.hub_id) == hub_datasets.end())
      hub_datasets.push_back(d.hub_id);
  if (!hub_datasets.empty()) {
    s += "datasets:\n";
    for (const std::string& d : hub_datasets) s += "- " + quoted(d) + "\n";
  }
  s += "---\n\n";
  const std::string link =
      c.model_hub_id.empty() ? "`" + base + "`" : cat("[", base, "](https://huggingface.co/", base, ")");
  s += cat("# ", c.output_dir.filename().string().empty() ? "model" : c.output_dir.filename().string(), "\n\n",
           lora ? "A LoRA adapter for " : "A fine-tune of ", link, ", trained with soltrain ", soltrain_version(), " (",
           method == "dpo"  ? "DPO"
           : method == "pt" ? "continued pretraining"
                            : "supervised fine-tuning",
           ").\n\n");
  s += "## Training\n\n";
  if (lora)
    s += cat(
        "- LoRA: r ", c.lora.rank, ", alpha ", c.lora.alpha, ", dropout ", c.lora.dropout,
        c.lora.use_rslora ? ", rsLoRA" : "", "; targets ",
        [&] {
          std::string t;
          for (const std::string& m : c.lora.target_modules) t += (t.empty() ? "" : ", ") + m;
          return t;
        }(),
        "\n");
  s += cat("- learning_rate ", c.learning_rate, " (", to_string(c.lr_scheduler_type), "), ",
           c.max_steps > 0 ? cat("max_steps ", c.max_steps) : cat("num_epochs ", c.num_epochs), ", batch ",
           c.per_device_train_batch_size, " x ", c.gradient_accumulation_steps, " accumulation, sequence_len ",
           c.sequence_len, ", seed ", c.seed, "\n");
  if (c.dpo.reward_model)
    s += "- a Bradley-Terry reward model (TRL's RewardTrainer loss): one score per sequence, at its last non-pad "
         "token\n";
  else if (c.process_reward_model)
    s += cat("- a process reward model (TRL's PRMTrainer): each step's label (of ", c.num_labels,
             ") at its last token\n");
  else if (c.dpo.enabled)
    s += cat("- DPO beta ", c.dpo.beta, "\n");
  s += "- the run's settings: `config.yaml` of its checkpoints; its metrics: `metrics.jsonl` beside this folder\n\n";
  s += "## Use\n\n```python\n";
  if (lora && c.dpo.reward_model)  // PEFT's SEQ_CLS adapter: its base built with one label, the score head from here
    s += "from peft import PeftModel\nfrom transformers import AutoModelForSequenceClassification\n\nbase = "
         "AutoModelForSequenceClassification.from_pretrained(\"<the base model>\", num_labels=1, pad_token_id=<the "
         "tokenizer's pad id>)\nmodel = PeftModel.from_pretrained(base, \"<this folder>\")  # the reward\n";
  else if (lora && c.process_reward_model)  // PEFT's TOKEN_CLS adapter
    s +=
        cat("from peft import PeftModel\nfrom transformers import AutoModelForTokenClassification\n\nbase = "
            "AutoModelForTokenClassification.from_pretrained(\"<the base model>\", num_labels=",
            c.num_labels, ")\nmodel = PeftModel.from_pretrained(base, \"<this folder>\")\n");
  else if (lora)
    s += "from peft import AutoPeftModelForCausalLM\n\nmodel = AutoPeftModelForCausalLM.from_pretrained(\"<this "
         "folder>\")\n";
  else if (c.dpo.reward_model)
    s += "from transformers import AutoModelForSequenceClassification\n\nmodel = "
         "AutoModelForSequenceClassification.from_pretrained(\"<this folder>\")  # num_labels 1: the reward\n";
  else if (c.process_reward_model)
    s += "from transformers import AutoModelForTokenClassification\n\nmodel = "
         "AutoModelForTokenClassification.from_pretrained(\"<this folder>\")  # each step's label at its last token\n";
  else
    s += "from transformers import AutoModelForCausalLM\n\nmodel = AutoModelForCausalLM.from_pretrained(\"<this "
         "folder>\")\n";
  s += "```\n";
  return s;
}

}  // namespace soltrain
