#include "cli/llama_factory_config.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/config_schema.h"
#include "core/error.h"
#include "data/llama_factory.h"
#include "io/json_file.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// Keys only LLaMA-Factory's configs have: two of them make a file LLaMA-Factory's.
constexpr const char* kOnly[] = {
    "model_name_or_path", "stage",       "do_train",       "finetuning_type", "lora_target", "template",
    "cutoff_len",         "max_samples", "dataset",        "dataset_dir",     "plot_loss",   "quantization_bit",
    "pref_beta",          "pref_loss",   "overwrite_cache"};

// LLaMA-Factory's own keys with nothing to do here (its preprocessing, plotting, kernel and attention choices, the
// steps it runs besides training). Keys soltrain reads itself (report_to, bf16, fp16, save_only_model,
// dataloader_num_workers, trust_remote_code, ...) pass through to its schema and peer-key rules.
constexpr const char* kIgnored[] = {"do_train",
                                    "do_eval",
                                    "plot_loss",
                                    "overwrite_cache",
                                    "preprocessing_num_workers",
                                    "flash_attn",
                                    "use_unsloth",
                                    "enable_liger_kernel",
                                    "upcast_layernorm",
                                    "pure_bf16",
                                    "print_param_status",
                                    "infer_backend",
                                    "disable_gradient_checkpointing",
                                    "double_quantization"};

// Keys the translation reads itself (into other keys, or refusing them): not passed on.
constexpr const char* kTranslated[] = {"stage",
                                       "finetuning_type",
                                       "lora_target",
                                       "additional_target",
                                       "quantization_bit",
                                       "quantization_method",
                                       "template",
                                       "dataset",
                                       "dataset_dir",
                                       "eval_dataset",
                                       "max_samples",
                                       "pref_loss",
                                       "pref_ftx",
                                       "mask_history",
                                       "streaming",
                                       "tokenized_path",
                                       "neat_packing",
                                       "enable_thinking",
                                       "adapter_name_or_path",
                                       "default_system",
                                       "do_predict"};

// Keys LLaMA-Factory names differently, with nothing else to say about the value.
const std::map<std::string, std::string>& renamed() {
  static const std::map<std::string, std::string> m{{"model_name_or_path", "model"},
                                                    {"cutoff_len", "sequence_len"},
                                                    {"pref_beta", "beta"},

                                                    {"dpo_label_smoothing", "label_smoothing"},
                                                    {"kto_chosen_weight", "desirable_weight"},
                                                    {"kto_rejected_weight", "undesirable_weight"},
                                                    {"val_size", "val_set_size"},
                                                    {"train_on_prompt", "train_on_inputs"},

                                                    {"packing", "sample_packing"}};
  return m;
}

std::vector<std::string> comma_list(const Entry& e, const std::string& key) {
  std::vector<std::string> out;
  if (e.node.IsSequence()) {
    for (const YAML::Node& n : e.node) out.push_back(n.Scalar());
    return out;
  }
  const std::string s = get_string(e, key);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    std::string item = s.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
    pos = comma + 1;
  }
  return out;
}

YAML::Node yaml_of(const nlohmann::json& j) {
  return YAML::Load(j.dump());  // (JSON is YAML)
}

struct Translator {
  const std::map<std::string, Entry>& in;
  const std::string& where;
  LlamaFactoryTranslation out;

  bool has(const std::string& k) const { return in.count(k) > 0 && !in.at(k).node.IsNull(); }
  const Entry& at(const std::string& k) const { return in.at(k); }
  std::string text(const std::string& k, const std::string& def) const { return has(k) ? get_string(at(k), k) : def; }
  void put(const std::string& key, YAML::Node value, const std::string& from) {
    const std::string w = in.count(from) ? in.at(from).where : where;
    out.keys.emplace_back(key, Entry{std::move(value), w});
  }
  // A default for a key the config gives under no name (its own or an alias: the schema's KeySpec says).
  void put_default(const std::string& key, const YAML::Node& value) {
    const KeySpec* spec = find_config_key(key);
    for (const auto& [k, e] : in)
      if (k == key || (spec && find_config_key(k) == spec)) return;
    put(key, value, key);
  }

  // `dataset` (and `eval_dataset`) names → soltrain dataset entries
  YAML::Node datasets(const std::string& key, const std::string& stage) {
    const fs::path dir = text("dataset_dir", "data");
    const fs::path info_file = dir / "dataset_info.json";
    nlohmann::json info;
    const std::vector<std::string> names = comma_list(at(key), key);
    if (names.empty()) user_error(at(key).where, ": ", key, " names no dataset");
    YAML::Node list(YAML::NodeType::Sequence);
    for (const std::string& name : names) {
      if (info.is_null()) {
        if (!fs::exists(info_file))
          user_error(at(key).where, ": ", key, ": ", name, ": LLaMA-Factory reads dataset names from ",
                     info_file.string(), ", which does not exist (dataset_dir: the folder holding dataset_info.json)");
        info = read_json_file(info_file);
      }
      const auto it = info.find(name);
      if (it == info.end()) user_error(at(key).where, ": ", key, ": ", name, " is not in ", info_file.string());
      const nlohmann::json& d = *it;
      const std::string ewhere = cat(info_file.string(), ": ", name);
      YAML::Node e(YAML::NodeType::Map);
      if (!d.is_object()) user_error(ewhere, ": a dataset_info.json entry is ", d.type_name(), ", expected an object");
      const auto str = [&](const char* k) {  // (a value of another kind: one line, not a JSON library error)
        if (!d.at(k).is_string()) user_error(ewhere, ": \"", k, "\" is ", d.at(k).type_name(), ", expected a string");
        return d.at(k).get<std::string>();
      };
      if (d.contains("hf_hub_url")) {
        e["path"] = str("hf_hub_url");
        if (d.contains("subset")) e["name"] = str("subset");
        if (d.contains("folder")) e["data_files"] = str("folder") + "/**";
      } else if (d.contains("file_name")) {
        e["path"] = (dir / str("file_name")).string();
      } else {
        user_error(ewhere, ": only hf_hub_url and file_name sources are read (not ModelScope, scripts or cloud files)");
      }
      if (d.contains("num_samples"))
        user_error(ewhere, ": num_samples (a random sample of the rows) is not read; use max_samples (the first rows)");
      std::string split = d.contains("split") ? str("split") : "train";
      if (has("max_samples")) split += cat("[:", get_int(at("max_samples"), "max_samples", 1), "]");
      e["split"] = split;
      if (stage == "pt") {  // pretrain.py: the prompt column's text (alpaca's first user turn), then eos
        const LfFormat f = read_lf_format(d, ewhere);
        if (f.sharegpt) user_error(ewhere, ": LLaMA-Factory pre-trains on alpaca-formatted datasets only");
        e["type"] = "text";
        e["field"] = f.prompt;
      } else {
        read_lf_format(d, ewhere);  // (refused here, at the config, rather than at the first record)
        YAML::Node lf = yaml_of(d);
        for (const char* drop : {"hf_hub_url", "ms_hub_url", "om_hub_url", "file_name", "subset", "split", "folder"})
          lf.remove(drop);
        lf["template"] = text("template", "");
        lf["cutoff_len"] = has("cutoff_len") ? get_int(at("cutoff_len"), "cutoff_len", 1) : 2048;
        lf["train_on_prompt"] = has("train_on_prompt") && get_bool(at("train_on_prompt"), "train_on_prompt");
        e["llama_factory"] = lf;
      }
      list.push_back(e);
    }
    return list;
  }

  void run(const std::vector<std::pair<std::string, Entry>>& keys, TrainMode mode) {
    const std::string stage = text("stage", "sft");
    out.mode = mode;
    if (stage == "pt") {
      if (mode != TrainMode::kSft && mode != TrainMode::kPretrain)
        user_error(at("stage").where, ": stage: pt is a pre-training config (run it with soltrain train or pt)");
      out.mode = TrainMode::kPretrain;
    } else if (stage == "dpo") {
      const std::string loss = text("pref_loss", "sigmoid");
      if (loss == "orpo" || loss == "simpo")
        put("rl", YAML::Node(loss), "pref_loss");
      else if (loss == "sigmoid" || loss == "ipo" || loss == "hinge") {
        put("rl", YAML::Node("dpo"), "stage");
        put("loss_type", YAML::Node(loss), "pref_loss");
      } else
        user_error(at("pref_loss").where, ": pref_loss: ", loss,
                   " is not built (sigmoid, ipo, hinge, orpo, simpo are)");
    } else if (stage == "kto") {
      put("rl", YAML::Node("kto"), "stage");
    } else if (stage == "rm") {
      put("reward_model", YAML::Node(true), "stage");
    } else if (stage != "sft") {
      user_error(at("stage").where, ": stage: ", stage,
                 " is not built (sft, pt, dpo, kto and rm are; soltrain grpo is its ", "online RL)");
    }
    if (stage != "dpo" && has("pref_loss") && text("pref_loss", "") != "sigmoid")
      user_error(at("pref_loss").where, ": pref_loss is read by stage: dpo");
    if (has("pref_ftx") && get_double(at("pref_ftx"), "pref_ftx", 0, 1e9) != 0)
      user_error(at("pref_ftx").where,
                 ": pref_ftx (an SFT term in LLaMA-Factory's DPO loss) is not built; rpo_alpha is ", "TRL's NLL term");
    const std::string ft = text("finetuning_type", "lora");  // (LLaMA-Factory's default)
    if (ft == "lora") {
      put("adapter", YAML::Node("lora"), "finetuning_type");
      const int64_t rank = has("lora_rank") ? get_int(at("lora_rank"), "lora_rank", 1) : 8;
      if (!has("lora_rank")) put("lora_rank", YAML::Node(rank), "finetuning_type");
      if (!has("lora_alpha")) put("lora_alpha", YAML::Node(2 * rank), "finetuning_type");  // (lora_rank * 2)
      if (!has("lora_dropout")) put("lora_dropout", YAML::Node(0), "finetuning_type");
      YAML::Node targets(YAML::NodeType::Sequence);
      const std::vector<std::string> t =
          has("lora_target") ? comma_list(at("lora_target"), "lora_target") : std::vector<std::string>{"all"};
      if (t.size() == 1 && t[0] == "all")
        put("lora_target_modules", YAML::Node("all-linear"), "lora_target");
      else {
        for (const std::string& m : t) targets.push_back(m);
        put("lora_target_modules", targets, "lora_target");
      }
      if (has("additional_target")) {
        YAML::Node save(YAML::NodeType::Sequence);
        for (const std::string& m : comma_list(at("additional_target"), "additional_target")) save.push_back(m);
        put("lora_modules_to_save", save, "additional_target");
      }
    } else if (ft != "full") {
      user_error(at("finetuning_type").where, ": finetuning_type: ", ft, " is not built (lora and full are)");
    }
    if (has("quantization_bit")) {
      const int64_t bits = get_int(at("quantization_bit"), "quantization_bit", 1);
      if (bits == 4)
        put("qlora_nf4", YAML::Node(true), "quantization_bit");
      else if (bits == 8)
        put("load_in_8bit", YAML::Node(true), "quantization_bit");
      else
        user_error(at("quantization_bit").where, ": quantization_bit: ", bits, " (4 and 8 are built)");
    }
    if (has("quantization_method") && text("quantization_method", "") != "bnb" &&
        text("quantization_method", "") != "bitsandbytes")
      user_error(at("quantization_method").where, ": quantization_method: ", text("quantization_method", ""),
                 " is not built (bnb: bitsandbytes' NF4 / LLM.int8 is)");
    for (const char* k :
         {"mask_history", "streaming", "tokenized_path", "neat_packing", "adapter_name_or_path", "do_predict"})
      if (has(k) && !(at(k).node.IsScalar() && (at(k).node.Scalar() == "false")))
        user_error(at(k).where, ": ", k, " is not built for LLaMA-Factory configs yet");
    if (has("enable_thinking") && !get_bool(at("enable_thinking"), "enable_thinking"))
      user_error(at("enable_thinking").where, ": enable_thinking: false is not built (the qwen3 template trains its ",
                 "empty thoughts; qwen3_nothink has none)");
    const std::string tmpl = text("template", "");
    const LfTemplate* t = tmpl.empty() ? nullptr : find_lf_template(tmpl);
    if (!tmpl.empty() && !t)
      user_error(at("template").where, ": template: ", tmpl, " is not one soltrain renders (", lf_template_names(),
                 ")");
    if (!t && stage != "pt")
      out.notes.push_back("no template: LLaMA-Factory's rows are rendered with the tokenizer's chat template");
    if (t && t->replace_eos) {  // fix_special_tokens: the eos token becomes the template's first stop word
      YAML::Node st(YAML::NodeType::Map);
      st["eos_token"] = t->stop_words[0];
      put("special_tokens", st, "template");
    }
    if (has("default_system")) user_error(at("default_system").where, ": default_system is not built yet");
    if (!has("dataset")) user_error(where, ": a LLaMA-Factory config needs `dataset` (names in dataset_info.json)");
    put("datasets", datasets("dataset", stage), "dataset");
    if (has("eval_dataset")) {
      if (has("val_size") && get_double(at("val_size"), "val_size", 0, 1e18) > 1e-6)  // (data_args.py refuses it too)
        user_error(at("val_size").where, ": val_size with eval_dataset: the held-out rows come from one or the other");
      put("test_datasets", datasets("eval_dataset", stage), "eval_dataset");
    }
    // LLaMA-Factory's and HF TrainingArguments' defaults where soltrain's differ
    if (!has("cutoff_len")) put("sequence_len", YAML::Node(2048), "cutoff_len");
    if (stage == "pt" && !has("packing")) put("sample_packing", YAML::Node(true), "stage");  // (parser.py)
    if (stage != "pt" && !has("packing")) put("sample_packing", YAML::Node(false), "stage");
    for (const auto& [k, v] :
         std::vector<std::pair<std::string, YAML::Node>>{{"learning_rate", YAML::Node(5e-5)},
                                                         {"num_train_epochs", YAML::Node(3)},
                                                         {"lr_scheduler_type", YAML::Node("linear")},
                                                         {"per_device_train_batch_size", YAML::Node(8)},
                                                         {"weight_decay", YAML::Node(0)},
                                                         {"adam_beta2", YAML::Node(0.999)},
                                                         {"max_grad_norm", YAML::Node(1.0)},
                                                         {"seed", YAML::Node(42)},
                                                         {"logging_steps", YAML::Node(500)},
                                                         {"save_steps", YAML::Node(500)}})
      put_default(k, v);
    for (const auto& [k, e] : keys) {
      const auto listed = [&](const auto& list) {
        return std::find(std::begin(list), std::end(list), k) != std::end(list);
      };
      if (listed(kIgnored) || listed(kTranslated)) continue;
      if ((k == "lora_rank" || k == "lora_alpha" || k == "lora_dropout") && ft != "lora") continue;
      if (k == "train_on_prompt" && stage == "pt") continue;  // (pre-training trains every token)
      if (k == "resume_from_checkpoint" && e.node.IsNull()) continue;
      if (k == "ddp_timeout" && get_int(e, k, 1, INT64_MAX) > (1 << 24)) {  // (the examples' 180000000 s: "never")
        out.keys.emplace_back(k, Entry{YAML::Node(1 << 24), e.where});
        out.notes.push_back(cat("ddp_timeout ", e.node.Scalar(), " s read as 2^24 s (194 days), soltrain's largest"));
        continue;
      }
      const auto r = renamed().find(k);
      out.keys.emplace_back(r == renamed().end() ? k : r->second, e);
    }
    out.notes.insert(out.notes.begin(), cat("a LLaMA-Factory config (stage: ", stage, ", finetuning_type: ", ft,
                                            t ? cat(", template: ", t->name) : std::string(),
                                            "): read with LLaMA-Factory's meanings and defaults"));
  }
};

}  // namespace

bool is_llama_factory_config(const std::vector<std::string>& keys) {
  int n = 0;
  for (const std::string& k : keys) n += std::find(std::begin(kOnly), std::end(kOnly), k) != std::end(kOnly);
  return n >= 2;
}

LlamaFactoryTranslation translate_llama_factory(const std::vector<std::pair<std::string, Entry>>& keys,
                                                const std::string& where, TrainMode mode) {
  std::map<std::string, Entry> in;
  for (const auto& [k, e] : keys) in.emplace(k, e);
  Translator t{in, where, {}};
  t.run(keys, mode);
  return std::move(t.out);
}

}  // namespace soltrain
