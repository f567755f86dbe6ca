// The config reader: each key is looked up in the schema (cli/config_schema.h), else among the peers' keys
// (cli/peer_keys.h), and read by its reader; then the named cross-key rules run. yaml-cpp gives line numbers
// (Mark) for every message; --set overrides replace a key's node before reading. Every problem is reported at
// once.
#include "cli/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "cli/config_schema.h"
#include "cli/config_values.h"
#include "cli/dataset_keys.h"
#include "cli/key_equivalents.h"
#include "cli/llama_factory_config.h"
#include "cli/peer_keys.h"
#include "cli/peer_sharding.h"
#include "cli/saved_config.h"
#include "core/error.h"
#include "data/named_templates.h"
#include "data/preference.h"
#include "hub/hub_cache.h"
#include "io/input_file.h"
#include "model/dpo_objective.h"
#include "tokenizer/chat_template.h"
#include "train/optimizer_settings.h"

namespace soltrain {

namespace fs = std::filesystem;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

namespace {

// The config's keys as written, each with its value and place, in the file's order then --set's.
struct Entries {
  std::map<std::string, Entry> by_key;
  std::vector<std::string> order;
  std::set<std::string> failed;  // keys whose value was refused: not "missing" as well
  std::vector<std::string> errors;
  std::string source;  // the YAML as given
  bool has(const std::string& k) const { return by_key.count(k) > 0; }
  const std::string& where(const std::string& k) const { return by_key.at(k).where; }
  // Given with a value (or with one that was refused).
  bool given(std::initializer_list<const char*> ks) const {
    for (const char* k : ks)
      if (has(k) && (failed.count(k) || !by_key.at(k).node.IsNull())) return true;
    return false;
  }
  bool refused(std::initializer_list<const char*> ks) const {
    for (const char* k : ks)
      if (failed.count(k)) return true;
    return false;
  }
};

YAML::Node load_yaml(const std::string& yaml, const std::string& where) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own message for it is "bad file"
    user_error(where, ":", e.mark.line + 1, ": not valid YAML: nested more than ", e.depth(),
               " levels deep (a training config needs a few)");
  } catch (const YAML::Exception& e) {
    user_error(where, ":", e.mark.line + 1, ": not valid YAML: ", e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) user_error(where, ": expected a map of settings at the top level");
  return root;
}

Entries read_entries(const std::string& yaml, const std::string& where, const std::vector<std::string>& overrides) {
  Entries en;
  for (const auto& kv : load_yaml(yaml, where)) {
    const std::string key = scalar_text(kv.first);
    // yaml-cpp keeps both of a repeated key; YAML forbids it, and one of the two values would be ignored.
    if (en.has(key)) {
      en.errors.push_back(
          cat(where_of(where, kv.first), ": key \"", key, "\" appears twice (also at ", en.where(key), "); keep one"));
      continue;
    }
    en.order.push_back(key);
    en.by_key[key] = {kv.second, where_of(where, kv.first)};
  }
  en.source = yaml;
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) user_error("--set \"", o, "\": expected key=value");
    const std::string key = o.substr(0, eq);
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      user_error("--set ", key, ": \"", o.substr(eq + 1), "\" is not a YAML value (", e.msg, ")");
    }
    if (!en.has(key)) en.order.push_back(key);
    en.by_key[key] = {value, "--set " + o};
  }
  return en;
}

// Axolotl's `rl: dpo` (or `ipo`, `orpo`, `simpo`, `kto`) makes an sft-style config a preference run, `rl: grpo` an
// online RL run: known before the datasets are read, since it decides how their records are read.
TrainMode preference_mode(const Entries& en, TrainMode mode, TrainConfig& c) {
  const auto rl = en.by_key.find("rl");
  // reward_model: true: its pairs train a reward model (the preference run's data and loop, TRL's RewardTrainer)
  if (const auto rm = en.by_key.find("reward_model");
      rm != en.by_key.end() && as_bool("reward_model", rm->second.node)) {
    if (rl != en.by_key.end() && !is_off(rl->second.node))
      user_error(rm->second.where, ": reward_model: true with rl: ", rl->second.node.Scalar(),
                 ": a reward model is trained on its own (leave rl out)");
    if (mode != TrainMode::kSft && mode != TrainMode::kDpo)
      user_error(rm->second.where, ": reward_model: true is not a ", mode == TrainMode::kPretrain ? "pt" : "grpo",
                 " run: run `soltrain sft` or `soltrain dpo`");
    c.dpo.reward_model = true;
    return TrainMode::kDpo;
  }
  if (rl == en.by_key.end() || !rl->second.node.IsScalar()) return mode;
  const std::string v = rl->second.node.Scalar();
  if (v != "dpo" && v != "ipo" && v != "orpo" && v != "simpo" && v != "kto" && v != "grpo") return mode;
  if (mode == TrainMode::kPretrain) user_error(rl->second.where, ": rl: ", v, " is not a pt run");
  if (v == "grpo") {
    if (mode == TrainMode::kDpo) user_error(rl->second.where, ": rl: grpo in a dpo run: run `soltrain grpo`");
    return TrainMode::kGrpo;
  }
  if (mode == TrainMode::kGrpo) user_error(rl->second.where, ": rl: ", v, " in a grpo run: run `soltrain dpo`");
  if (v == "ipo") c.dpo.loss = PreferenceLoss::Ipo;
  if (v == "orpo") c.dpo.method = PreferenceLoss::Orpo;    // TRL's ORPOTrainer, as Axolotl runs it
  if (v == "simpo") c.dpo.method = PreferenceLoss::Simpo;  // TRL's CPOTrainer with loss_type simpo
  if (v == "kto") c.dpo.method = PreferenceLoss::Kto;      // TRL's KTOTrainer (unpaired examples)
  return TrainMode::kDpo;
}

unsigned command_bit(TrainMode m) {
  return m == TrainMode::kSft        ? kSftBit
         : m == TrainMode::kPretrain ? kPtBit
         : m == TrainMode::kDpo      ? kDpoBit
                                     : kGrpoBit;
}

// One key: the schema's reader, else a peer key's (cli/peer_keys.h), else unknown with the closest name.
void apply_key(const std::string& key, const Entries& en, ReadContext& x) {
  const Entry& e = en.by_key.at(key);
  if (const KeySpec* spec = find_config_key(key)) {
    if (!(spec->commands & command_bit(x.mode)) && spec->commands == kDpoBit)
      user_error(e.where, ": ", key, " is a preference-training key: run `soltrain dpo` or set rl: dpo");
    if (!(spec->commands & command_bit(x.mode)) && spec->commands == kGrpoBit)
      user_error(e.where, ": ", key, " is a GRPO key: run `soltrain grpo` or set rl: grpo");
    if (!(spec->commands & command_bit(x.mode)) && spec->commands == (kDpoBit | kGrpoBit))
      user_error(e.where, ": ", key, " is a preference-training key (and GRPO's): run `soltrain dpo` or ",
                 "`soltrain grpo`, or set rl: dpo / rl: grpo");
    if (!e.node.IsNull()) spec->read(e, key, x);  // `key:` with nothing keeps the default
    return;
  }
  try {
    if (apply_peer_key(key, e.node, x.c)) return;
  } catch (const UserError& p) {
    user_error(e.where, ": ", p.what());
  }
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = config_key_names();
    for (const std::string& k : peer_key_names()) n.push_back(k);
    return n;
  }();
  // Another tool's name for a soltrain setting: its equivalent, before any spelling guess.
  if (const auto eq = key_equivalent(key))
    user_error(e.where, ": unknown key \"", key, "\" (", eq->tool, "'s name; soltrain's: ", eq->use, ")");
  unknown_key(e.where, key, names, "key");
}

// The cross-key rules, each named: what one key means given the others, and pairs that cannot go together.
// Each adds its problems to `errors` (or a note the run prints first).
using Rule = void (*)(const Entries&, const std::string& where, TrainConfig&, std::vector<std::string>& errors);

// LoRA settings without `adapter: lora` / `lora: true`: the user meant LoRA (Surogate turns it on by default);
// training the full model instead would be a silent, expensive surprise.
void rule_lora_settings_imply_lora(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>&) {
  if (!en.given({"adapter", "lora"}) &&
      (en.given({"lora_r", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules"}) ||
       (en.given({"lora_target_linear"}) && en.by_key.at("lora_target_linear").node.Scalar() == "true"))) {
    c.lora.enabled = true;
    c.notes.push_back("LoRA settings are given without `adapter: lora` or `lora: true`: training a LoRA adapter");
  }
}

void rule_quantised_base(const Entries& en, const std::string& where, TrainConfig& c,
                         std::vector<std::string>& errors) {
  // Each problem at the line of the key that asked (the file where it is no single key, as adapter: qlora)
  auto at = [&](std::initializer_list<std::string> keys) {
    for (const std::string& k : keys)
      if (en.has(k)) return en.where(k);
    return where;
  };
  // A quantised base is frozen: only adapters can train over it.
  if (c.lora.base != WeightFormat::Dense && !c.lora.enabled)
    errors.push_back(
        cat(at({c.lora.base_key}), ": ", c.lora.base_key,
            ": a quantised base is frozen, so it trains LoRA adapters only (QLoRA): add `adapter: lora`, or "
            "drop it for full fine-tuning in bf16/fp32"));
}

// Axolotl's scheduler is cosine unless the config says otherwise (Surogate's and HF's: linear, soltrain's
// default); a config written for Axolotl (its base_model key) gets Axolotl's, and the run says so. Axolotl's
// constant tail after the cosine floor is not built.
void rule_axolotl_schedule(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  // Axolotl leaves documents longer than sequence_len out (excess_length_strategy: drop) where soltrain cuts them;
  // the run says how many it left out, when any.
  if (en.has("base_model") && !en.given({"excess_length_strategy"})) c.overlong = OverlongPolicy::kDrop;
  // Axolotl packs only when asked (its sample_packing defaults to false): soltrain packs by default, since its
  // unpacked rows are padded to sequence_len (Axolotl pads to the batch's longest), which would cost a run of
  // short documents most of its time. Said, not silent: the steps and batches differ from Axolotl's.
  // (A streamed pretraining set is packed either way.)
  if (en.has("base_model") && !en.given({"sample_packing"}) && !c.streaming)
    c.notes.push_back(
        "sample_packing is not given: soltrain packs documents into rows (Axolotl's default is false, a row per "
        "document, which gives more and smaller steps: set sample_packing: false for that)");
  if (en.has("base_model") && !en.given({"lr_scheduler", "lr_scheduler_type"})) {
    c.lr_scheduler_type = ScheduleType::kCosine;
    c.notes.push_back("lr_scheduler is not given: cosine, Axolotl's default (the config uses Axolotl's base_model)");
  }
  // Axolotl's lr_quadratic_warmup acts only on its cosine schedule (its scheduler mixin), and wins over a
  // cosine_min_lr_ratio there, as Axolotl warns
  if (c.quadratic_warmup && c.lr_scheduler_type != ScheduleType::kCosine) {
    c.quadratic_warmup = false;
    c.notes.push_back(cat("lr_quadratic_warmup: no effect with lr_scheduler ", to_string(c.lr_scheduler_type),
                          " (Axolotl applies it to cosine only)"));
  } else if (c.quadratic_warmup && c.cosine_min_lr_ratio > 0) {
    c.notes.push_back(
        "lr_quadratic_warmup with cosine_min_lr_ratio: the quadratic warmup's cosine decays to 0 (as "
        "Axolotl does when both are given)");
  }
  if (c.cosine_min_lr_ratio > 0 && c.cosine_constant_lr_ratio > 0)
    errors.push_back(cat(en.where("cosine_constant_lr_ratio"),
                         ": cosine_constant_lr_ratio: a constant learning rate at the cosine floor for the last part "
                         "of training is not built yet; drop it (the cosine then reaches its floor at the end)"));
}

// A streamed run (streaming, pretraining_dataset) knows no dataset's length before it is read: Axolotl's checks (a
// max_steps, no val_set_size) and what needs a whole dataset at hand refused by name.
void rule_streaming(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (c.pretraining_dataset && en.has("datasets") && !is_off(en.by_key.at("datasets").node))
    errors.push_back(cat(en.where("pretraining_dataset"),
                         ": pretraining_dataset and datasets: give one (Axolotl trains on pretraining_dataset alone)"));
  if (!c.streaming) return;
  const std::string key = c.pretraining_dataset ? "pretraining_dataset" : "streaming";
  const std::string at = en.where(key);
  if (c.mode != TrainMode::kSft && c.mode != TrainMode::kPretrain)
    errors.push_back(cat(at, ": ", key, ": streamed datasets train sft and pt runs; a ",
                         c.mode == TrainMode::kDpo ? "preference" : "grpo", " run reads its datasets whole"));
  if (c.max_steps <= 0 && !en.refused({"max_steps"}))
    errors.push_back(cat(at, ": ", key, ": max_steps is required (a stream's length is not known before it is read, ",
                         "so num_epochs cannot set the schedule)"));
  if ((c.validation_split_ratio > 0 || c.validation_count > 0))
    errors.push_back(cat(at, ": ", key,
                         ": val_set_size holds documents out of the training data, which a stream does not have at "
                         "hand; give test_datasets instead"));
  if (c.dataset_exact_deduplication)
    errors.push_back(cat(at, ": ", key,
                         ": dataset_exact_deduplication compares every document with every other; drop it "
                         "or streaming"));
  for (const DatasetSpec& d : c.datasets)
    if (d.slice || d.samples > 0)
      errors.push_back(cat(at, ": ", key, ": dataset ", d.hub_id.empty() ? d.path.string() : d.hub_id, ": ",
                           d.slice ? "a split slice (train[...])" : "samples",
                           " needs the dataset's length; streamed datasets are read whole, in order"));
  if (c.shuffle && (en.has("shuffle_merged_datasets") || en.has("streaming_multipack_buffer_size")))
    c.notes.push_back(cat(key,
                          ": the datasets are read in order; Axolotl's shuffle buffer "
                          "(shuffle_merged_datasets, streaming_multipack_buffer_size) is not applied"));
}

// A key whose value was refused is reported once, not again as missing.
void rule_required(const Entries& en, const std::string& where, TrainConfig& c, std::vector<std::string>& errors) {
  if (c.model.empty() && !en.refused({"model", "base_model"}))
    errors.push_back(cat(where, ": `model` is required (a Hugging Face model folder)"));
  if (c.output_dir.empty() && !en.refused({"output_dir", "save_path"}))
    errors.push_back(cat(where, ": `output_dir` is required"));
  if (c.datasets.empty() && !en.refused({"datasets", "pretraining_dataset"}))
    errors.push_back(cat(where, ": `datasets` is required (a list of {path, type})"));
}

// Offload streams the whole-model update (fp32 or 8-bit moments); the sharded (ZeRO) one keeps its on the
// device. Offloaded checkpoints are recompute full's (the only activations it keeps across the pass).
// Axolotl's chat_template: jinja takes chat_template_jinja's template (used too when chat_template is not given); the
// run tokenizer's tokenizer_config.json then holds it (train/run_tokenizer.h), so every path reads it as the model's.
void rule_chat_template_jinja(const Entries& en, const std::string& where, TrainConfig& c,
                              std::vector<std::string>& errors) {
  const std::string& jinja = c.tokenizer_edits.chat_template;
  if (c.chat_template == "jinja" && jinja.empty() && !en.refused({"chat_template_jinja"}))
    errors.push_back(cat(en.where("chat_template"), ": chat_template: jinja needs chat_template_jinja (the template)"));
  if (jinja.empty()) return;
  if (en.given({"chat_template"}) && c.chat_template != "jinja")
    errors.push_back(cat(en.where("chat_template_jinja"), ": chat_template_jinja is read with chat_template: jinja ",
                         "(or none), not with chat_template: ", c.chat_template));
  try {
    ChatTemplate check(jinja);
  } catch (const std::exception& e) {
    errors.push_back(cat(en.has("chat_template_jinja") ? en.where("chat_template_jinja") : where,
                         ": chat_template_jinja is not a template soltrain can render: ", e.what()));
  }
  c.chat_template = "tokenizer_default";
}

void rule_offload(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (c.offload.grads && en.has("offload_grads") && c.zero_stage >= 1)
    errors.push_back(cat(en.where("offload_grads"), ": offload_grads with zero_stage ", c.zero_stage,
                         " is not built yet (each rank's gradients are reduced on the device): use zero_stage: 0 or "
                         "drop offload_grads"));
  for (const char* k : {"offload_activations", "activation_offloading"})  // (Axolotl's name for it)
    if (c.offload_activations && en.has(k) && c.recompute != Recompute::Full) {
      errors.push_back(cat(en.where(k), ": ", k,
                           " needs recompute: full (it moves the layer-input checkpoints, the only activations full "
                           "recompute keeps, to host memory); got recompute: ",
                           recompute_name(c.recompute)));
      break;
    }
  if (c.offload_weights_resident_layers > 0 && !c.offload_weights)
    errors.push_back(cat(en.where("offload_weights_resident_layers"),
                         ": offload_weights_resident_layers keeps some of a streamed base's layers on the device: it "
                         "needs offload_weights: true"));
}

// Streamed weights are a frozen base's (LoRA); its own copies elsewhere (quantised, FP8) would stay resident.
// (Data parallel is fine: each rank streams its own copy of the base on the upload stream.)
void rule_streamed_base(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (!c.offload_weights || !en.has("offload_weights")) return;
  const std::string& at = en.where("offload_weights");
  if (!c.lora.enabled)
    errors.push_back(cat(at,
                         ": offload_weights streams a frozen LoRA base from host memory, and full fine-tuning "
                         "trains every weight: add adapter: lora, or use offload_master / offload_optimizer"));
  else if (c.lora.base != WeightFormat::Dense)
    errors.push_back(cat(at, ": offload_weights streams a bf16 base; a quantised QLoRA base (",
                         weight_format_name(c.lora.base), ", ", c.lora.base_key,
                         ") stays on the device: drop one of them"));
  if (c.fp8_hybrid)
    errors.push_back(cat(at,
                         ": offload_weights with recipe fp8-hybrid, which keeps FP8 copies of the base's projections "
                         "on the device: use one of them"));
}

// Two names of one setting given together (lr_scheduler and lr_scheduler_type, micro_batch_size and
// per_device_train_batch_size, gradient_checkpointing and recompute, adapter: lora and lora: false, ...):
// the last one used to win silently. In the file they must agree; a --set of one replaces the file's others
// (an override is meant to win).
struct SynonymPair {
  const char* a;
  const char* b;
  std::string (*value)(const TrainConfig&);  // what each sets, read after applying it alone
};
constexpr SynonymPair kSynonymPairs[] = {
    {"gradient_checkpointing", "recompute",
     [](const TrainConfig& c) { return std::string(recompute_name(c.recompute)); }},
    {"loss_scale", "train_on_inputs",
     [](const TrainConfig& c) { return std::string(c.train_on_inputs ? "all" : "default"); }},
    {"adapter", "lora", [](const TrainConfig& c) { return std::string(c.lora.enabled ? "lora" : "full"); }},
    {"fp8", "recipe", [](const TrainConfig& c) { return std::string(c.fp8_hybrid ? "fp8-hybrid" : "bf16"); }},
    {"val_set_size", "validation_split_ratio",
     [](const TrainConfig& c) { return cat(c.validation_split_ratio, "/", c.validation_count); }},
};

// A scalar as its meaning: numbers by value (1e-4 and 0.0001 agree), YAML's booleans by truth.
std::string normalized(const YAML::Node& n) {
  if (!n.IsScalar()) return YAML::Dump(n);
  const std::string s = n.Scalar();
  for (const char* t : {"true", "True", "TRUE", "yes"})
    if (s == t) return "true";
  for (const char* f : {"false", "False", "FALSE", "no"})
    if (s == f) return "false";
  try {
    size_t used = 0;
    const double d = std::stod(s, &used);
    if (used == s.size()) return cat(d);
  } catch (const std::exception&) {
  }
  return s;
}

void check_synonyms_agree(Entries& en, TrainMode mode, const std::string& where, const fs::path& base) {
  auto from_set = [&](const std::string& k) { return en.by_key.at(k).where.rfind("--set", 0) == 0; };
  auto given = [&](const std::string& k) { return en.has(k) && !en.by_key.at(k).node.IsNull(); };
  // Keeps the overridden name of a group given both in the file and by --set; false when none was overridden.
  auto override_wins = [&](const std::vector<std::string>& names) {
    if (std::none_of(names.begin(), names.end(), from_set)) return false;
    for (const std::string& k : names)
      if (!from_set(k)) en.by_key.erase(k), std::erase(en.order, k);
    return true;
  };
  auto conflict = [&](const std::string& a, const std::string& b, const std::string& va, const std::string& vb) {
    en.errors.push_back(cat(en.where(b), ": ", b, " (", vb, ") and ", a, " (", va, ", ", en.where(a),
                            ") are the same setting with different values; keep one"));
    en.failed.insert(a), en.failed.insert(b);
  };
  std::map<const KeySpec*, std::vector<std::string>> groups;
  for (const std::string& k : en.order)
    if (const KeySpec* s = find_config_key(k); s && given(k)) groups[s].push_back(k);
  for (const auto& [spec, names] : groups) {
    if (names.size() < 2 || override_wins(names)) continue;
    for (size_t i = 1; i < names.size(); ++i)
      if (normalized(en.by_key.at(names[0]).node) != normalized(en.by_key.at(names[i]).node))
        conflict(names[0], names[i], scalar_text(en.by_key.at(names[0]).node),
                 scalar_text(en.by_key.at(names[i]).node));
  }
  for (const SynonymPair& p : kSynonymPairs) {
    if (!given(p.a) || !given(p.b) || override_wins({p.a, p.b})) continue;
    std::string v[2];
    for (int i = 0; i < 2; ++i) {
      const std::string k = i == 0 ? p.a : p.b;
      TrainConfig alone;
      ReadContext x{alone, mode, where, base};
      Entries one;
      one.order = {k};
      one.by_key[k] = en.by_key.at(k);
      try {
        apply_key(k, one, x);
      } catch (const std::exception&) {
        return;  // the main pass reports a bad value
      }
      v[i] = p.value(alone);
    }
    if (v[0] != v[1]) conflict(p.a, p.b, scalar_text(en.by_key.at(p.a).node), scalar_text(en.by_key.at(p.b).node));
  }
}

// The keys that make a config another tool's file: a peer's name for a soltrain key (base_model,
// micro_batch_size, ...) or a key only a peer has (adapter, val_set_size, ...).
std::vector<std::string> peer_format_keys(const Entries& en) {
  static const std::vector<std::string> peers = peer_key_names();
  std::vector<std::string> out;
  for (const std::string& k : en.order) {
    if (en.where(k).rfind("--set", 0) == 0) continue;
    const KeySpec* s = find_config_key(k);
    if ((s && s->name != k) || std::find(peers.begin(), peers.end(), k) != peers.end()) out.push_back(k);
  }
  return out;
}

// Axolotl pushes when hub_model_id is given; HF's push_to_hub: true needs it (an explicit push_to_hub wins).
void rule_hub_push(const Entries& en, const std::string& where, TrainConfig& c, std::vector<std::string>& errors) {
  if (!en.given({"push_to_hub"}) && !c.hub.model_id.empty()) c.hub.enabled = true;
  if (c.hub.enabled && c.hub.model_id.empty() && !en.refused({"hub_model_id"}))
    errors.push_back(cat(en.has("push_to_hub") ? en.where("push_to_hub") : where,
                         ": push_to_hub needs hub_model_id: the repository to push to (Org/Name)"));
}

// Axolotl turns wandb on with a wandb_project (off with wandb_mode: disabled), mlflow with a mlflow_tracking_uri,
// SwanLab with its plugin.
void rule_trackers(const Entries& en, const std::string& where, TrainConfig& c, std::vector<std::string>& errors) {
  Trackers& t = c.trackers;
  if (t.wandb_settings.count("project")) t.wandb = true;
  if (t.wandb_settings.count("mode") && t.wandb_settings["mode"] == "disabled") t.wandb = false;
  if (t.use_wandb) t.wandb = *t.use_wandb;
  if (t.mlflow_settings.count("tracking_uri")) t.mlflow = true;
  // Axolotl's SwanLab plugin: on with the plugin unless use_swanlab: false, which then needs swanlab_project;
  // swanlab_mode one of its four, disabled turning it off
  if (t.swanlab_plugin && t.use_swanlab.value_or(true)) {
    if (!t.swanlab_settings.count("project"))
      errors.push_back(cat(en.has("plugins") ? en.where("plugins") : where,
                           ": plugins: SwanLab is on (its plugin, use_swanlab) but swanlab_project is not set; set it, "
                           "or use_swanlab: false"));
    t.swanlab = true;
  }
  if (t.use_swanlab == false) t.swanlab = false;
  if (const auto m = t.swanlab_settings.find("mode"); m != t.swanlab_settings.end()) {
    if (m->second != "cloud" && m->second != "local" && m->second != "offline" && m->second != "disabled")
      errors.push_back(cat(en.has("swanlab_mode") ? en.where("swanlab_mode") : where, ": swanlab_mode: \"", m->second,
                           "\" is not valid: expected cloud, local, offline or "
                           "disabled"));
    if (m->second == "disabled") t.swanlab = false;
  }
}

// GRPO: the clip's upper side defaults to its lower one (TRL), rows hold a prompt and its completion, the update's
// completions make whole groups, every reward function has its weight, and β > 0 has a reference to compare to.
void rule_grpo(const Entries& en, const std::string& where, TrainConfig& c, std::vector<std::string>& errors) {
  if (!c.grpo.enabled) return;
  GrpoSettings& g = c.grpo;
  if (!g.epsilon_high_given) g.loss.epsilon_high = g.loss.epsilon;
  if (en.given({"sequence_len", "max_seq_length", "sequence_length"}))
    c.notes.push_back(
        "sequence_len is max_prompt_length + max_completion_length in a grpo run: the given one is not used");
  c.sequence_len = g.max_prompt_length + g.loss.max_completion_length;
  // SFT's batching keys say nothing to a grpo run: each completion trains as its own row with its prompt, on its
  // completion's tokens alone (as TRL's GRPOTrainer). Said, not silently dropped.
  for (const char* k : {"sample_packing", "train_on_inputs", "pad_to_sequence_len"})
    if (en.given({k}))
      c.notes.push_back(cat(k, " does not apply to a grpo run (each completion trains as its own row with its prompt, ",
                            "on the completion's tokens alone): not used"));
  // TRL's correction for the generation engine's log-probs: on where TRL's would be (use_vllm, its default
  // vllm_importance_sampling_correction true), or when asked for; applied to soltrain's own engine.
  const bool correction = g.sampling_correction_given == 1 || (g.sampling_correction_given == -1 && g.use_vllm);
  if (correction) {
    g.loss.sampling_correction = parse_sampling_correction(g.sampling_correction_mode, where);
    g.loss.sampling_clip_min = float(g.sampling_clip_min);
    g.loss.sampling_clip_max = float(g.sampling_clip_max);
    try {
      g.loss.validate(where);
    } catch (const UserError& e) {
      errors.push_back(e.what());
    }
  }
  if (g.use_vllm)
    c.notes.push_back(cat("use_vllm: soltrain generates in its own engine, on the training weights (no vLLM)",
                          correction ? "; TRL's importance-sampling correction applies to its log-probs" : ""));
  else if (correction)
    c.notes.push_back(
        "vllm_importance_sampling_correction: applied to the log-probs of soltrain's generation engine "
        "(TRL applies it only with use_vllm)");
  const int64_t completions = int64_t(c.per_device_train_batch_size) * c.gradient_accumulation_steps;
  if (completions % g.num_generations != 0)
    errors.push_back(cat(where, ": per_device_train_batch_size x gradient_accumulation_steps = ", completions,
                         " completions per update is not a multiple of num_generations ", g.num_generations,
                         ": each prompt's completions must be trained together"));
  if (g.reward_funcs.empty())
    errors.push_back(cat(where, ": reward_funcs is required in a grpo run (built-in: accuracy, think_format; ",
                         "or module.path:function)"));
  if (!g.reward_weights.empty() && g.reward_weights.size() != g.reward_funcs.size())
    errors.push_back(cat(where, ": reward_weights has ", g.reward_weights.size(), " values for ", g.reward_funcs.size(),
                         " reward_funcs"));
  if (g.loss.beta > 0 && !c.lora.enabled && c.fp8_hybrid)
    errors.push_back(cat(where, ": beta ", g.loss.beta, " with full fine-tuning and the fp8-hybrid recipe: the ",
                         "reference's frozen copy is not kept in fp8 yet; use LoRA, bf16, or beta: 0"));
  if (c.gpus > 1) errors.push_back(cat(where, ": grpo runs on one GPU for now (gpus: ", c.gpus, ")"));
  // What the decoder would read half-written while the update runs beside it (run_grpo.cpp's why_no_overlap says
  // the same of the model once it is loaded: Mixture-of-Experts models too).
  if (g.generation_overlap) {
    const char* why = g.loss.beta > 0 && !c.lora.enabled
                          ? "beta > 0 with full fine-tuning (the reference's forward lends its frozen copy to the "
                            "model's parameters)"
                      : c.fp8_hybrid
                          ? "the fp8 recipe (each forward rescales the weights' fp8 copies the decoder would "
                            "read)"
                      : c.offload_weights ? "offload_weights (the layers stream through one set of device buffers)"
                                          : nullptr;
    if (why) errors.push_back(cat(where, ": generation_overlap is not built for ", why));
  }
  if (g.generation_memory_gib > 0 && g.generation_memory_fraction > 0)
    errors.push_back(cat(where, ": give one of generation_memory_gib and generation_memory_fraction"));
  // What a grpo run does not read yet is refused, not ignored: evaluation, and datasets read other than as
  // `prompt` rows through the model's own chat template.
  if (!c.validation_datasets.empty() || c.validation_split_ratio > 0 || c.validation_count > 0)
    errors.push_back(cat(where, ": validation data (validation_datasets, val_set_size, validation_split_ratio) ",
                         "is not evaluated by grpo runs yet: remove it"));
  if (!c.chat_template.empty() && c.chat_template != "tokenizer_default")
    errors.push_back(cat(where, ": chat_template: ", c.chat_template, ": grpo renders prompts with the model's own ",
                         "template for now (tokenizer_default)"));
  for (size_t i = 0; i < c.datasets.size(); ++i) {
    const DatasetSpec& d = c.datasets[i];
    if (d.type != DatasetType::kAuto)
      errors.push_back(cat(where, ": datasets[", i, "]: type is not read by grpo runs (rows with a prompt column, ",
                           "text or messages, as TRL takes them): remove it"));
    if (!d.fields.chat_template.empty() && d.fields.chat_template != "tokenizer_default")
      errors.push_back(cat(where, ": datasets[", i, "]: chat_template: ", d.fields.chat_template,
                           ": grpo renders prompts with the model's own template for now"));
  }
}

// Axolotl's batch_size: without gradient_accumulation_steps it is batch_size // micro_batch_size (normalize_config).
void rule_batch_size(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (!en.has("batch_size") || en.by_key.at("batch_size").node.IsNull() || en.given({"gradient_accumulation_steps"}))
    return;
  const Entry& e = en.by_key.at("batch_size");
  try {
    const int64_t b = get_int(e, "batch_size", 1, INT32_MAX);
    if (b < c.per_device_train_batch_size)
      errors.push_back(cat(e.where, ": batch_size ", b, " is less than micro_batch_size ",
                           c.per_device_train_batch_size,
                           ": no whole accumulation step (it is micro_batch_size x "
                           "gradient_accumulation_steps)"));
    else
      c.gradient_accumulation_steps = int(b / c.per_device_train_batch_size);
  } catch (const UserError& err) {
    errors.push_back(err.what());
  }
}

// FSDP / DeepSpeed keys (cli/peer_sharding.h): after the LoRA and base keys, which decide what offload means.
void rule_peer_sharding(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  apply_peer_sharding(c, en.has("zero_stage"), en.has("zero_stage") ? en.where("zero_stage") : std::string(), errors);
}

// A classifier's settings: num_labels belongs to a reward model (1) or a process reward model (2 or more, 2 when not
// given); a process reward model is an sft run of its own.
void rule_classifier(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  const auto where = [&](const char* k) { return en.by_key.at(k).where; };
  if (c.process_reward_model) {
    if (c.dpo.reward_model || en.given({"rl"}))
      errors.push_back(cat(where("process_reward_model"), ": process_reward_model: true is a run of its own (leave ",
                           c.dpo.reward_model ? "reward_model" : "rl", " out)"));
    if (c.num_labels == 0) c.num_labels = 2;  // (AutoModelForTokenClassification's default)
    // (TRL's PRMTrainer reads prompt / completions / labels rows whatever else they hold)
    for (auto* list : {&c.datasets, &c.validation_datasets})
      for (DatasetSpec& d : *list)
        if (d.type == DatasetType::kAuto) d.type = DatasetType::kStepwiseSupervised;
    if (c.num_labels < 2)
      errors.push_back(cat(where("num_labels"), ": num_labels ", c.num_labels,
                           ": a process reward model labels each step with one of 2 or more classes"));
  } else if (c.dpo.reward_model) {
    if (c.num_labels > 1)
      errors.push_back(cat(where("num_labels"), ": num_labels ", c.num_labels,
                           ": a reward model has one label (TRL's RewardTrainer scores each sequence once)"));
  } else if (c.num_labels > 0) {
    errors.push_back(cat(where("num_labels"),
                         ": num_labels is a classifier's setting: set reward_model: true "
                         "(num_labels 1) or process_reward_model: true (2 or more)"));
  }
  if (!c.process_reward_model)  // TRL's PRMConfig options
    for (const auto& [k, set] : {std::pair<const char*, bool>{"step_separator", en.given({"step_separator"})},
                                 {"train_on_last_step_only", c.train_on_last_step_only}})
      if (set)
        errors.push_back(cat(where(k), ": ", k, " is a process reward model's setting (process_reward_model: true)"));
  // (the score head trains in full beside the adapters and is saved with them, as PEFT's SEQ_CLS / TOKEN_CLS tasks do)
  if ((c.dpo.reward_model || c.process_reward_model) && c.lora.enabled && c.merge_adapter)
    errors.push_back(cat(where("merge_adapter"), ": merging a ", c.dpo.reward_model ? "" : "process ",
                         "reward model's adapter (its score head beside the LoRA tensors) is not built yet; load it "
                         "with PEFT onto AutoModelFor",
                         c.dpo.reward_model ? "SequenceClassification(num_labels=1)" : "TokenClassification"));
}

// The optimizer's settings: torchao's 4-bit moments stay on the device; optimizer: muon as Axolotl's
// MuonOptimizerFactory builds it: betas (0.9, 0.95) unless both are given (the second
// is Muon's momentum); its state is fp32 and on the device.
void rule_optimizer(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (c.muon && !c.normuon && !(en.given({"adamw_beta1", "adam_beta1"}) && en.given({"adamw_beta2", "adam_beta2"}))) {
    c.adamw_beta1 = 0.9;  // (Axolotl's Muon betas unless both are given)
    c.adamw_beta2 = 0.95;
  }
  // (zero_stage with Muon: one process trains unsharded, as FSDP on one GPU does; over several ranks the run
  // refuses it, naming the optimizer: each rank would hold a slice of the matrices Muon orthogonalises whole)
  for (const SettingRefusal& r : optimizer_setting_refusals(c)) {
    std::string where = r.key;
    for (const char* k : {r.key.c_str(), r.key == "optimizer_in_backward" ? "optimizer_in_bwd" : ""})
      if (*k && en.has(k)) where = en.where(k);
    errors.push_back(cat(where, ": ", r.text));
  }
}

// LLEP's settings do something only under expert parallelism with ep_llep on: given elsewhere, one line each rather
// than silently unused.
void rule_expert_parallel(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (c.ep_balance.on && en.has("ep_llep") && c.ep_size <= 1)
    errors.push_back(cat(en.where("ep_llep"), ": ep_llep balances expert parallelism's ranks: it needs ep_size > 1"));
  for (const char* k : {"ep_llep_threshold", "ep_llep_capacity", "ep_llep_min_rows"})
    if (en.has(k) && !c.ep_balance.on)
      errors.push_back(cat(en.where(k), ": ", k, " tunes LLEP, which is off: set ep_llep: true (with ep_size > 1)"));
}

// A Ray job (use_ray, distributed): its worker count and resources settled once every key is read; what the Ray
// launcher cannot run refused here, before any work.
void rule_ray(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (!c.ray.enabled) return;
  if (c.ray.nodes > 0) c.ray.num_workers = c.ray.nodes * c.gpus;
  if (c.ray.resources.empty()) c.ray.resources = {{c.device == Device::CPU ? "CPU" : "GPU", 1.0}};
  const std::string key = en.has("use_ray") ? "use_ray" : "distributed";
  const std::string where = en.has(key) ? en.where(key) : key;
  if (c.dpo.enabled || c.grpo.enabled)
    errors.push_back(cat(where, ": a Ray job runs sft and pt for now (", c.dpo.enabled ? "preference training" : "grpo",
                         " runs on one GPU)"));
  if (c.auto_resume) errors.push_back(cat(where, ": auto_resume with Ray is not built (Ray restarts no soltrain job)"));
}

// Axolotl's tokenizer_use_mistral_common: inferred true for a Magistral model when not given (Axolotl's validator,
// its warning a note here), and the tokenizer edits and templates mistral-common's tokenizer does not take refused as
// Axolotl refuses them (its tokens and chat format are mistral-common's).
void rule_mistral_common(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (!en.given({"tokenizer_use_mistral_common"})) {
    std::string name = c.model.string();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
    if (name.find("magistral") == std::string::npos) return;
    c.mistral_common = true;
    c.notes.push_back(
        "tokenizer_use_mistral_common: true for a Magistral model, as Axolotl infers it (set it false to use the "
        "repository's tokenizer.json)");
  }
  if (!c.mistral_common) return;
  for (const char* k : {"added_tokens_overrides", "special_tokens", "tokens", "chat_template", "chat_template_jinja"})
    if (en.given({k}))
      errors.push_back(cat(en.where(k), ": ", k,
                           " is not supported with tokenizer_use_mistral_common (the tokens and chat format are "
                           "mistral-common's; Axolotl refuses it too)"));
}

// LoftQ (model/loftq.h) starts a LoRA adapter over a full-precision base, which it quantises itself (PEFT refuses
// it over a quantised one).
void rule_loftq(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (c.lora.loftq_iter == 0) return;
  const std::string at = cat(en.where("peft"), ": peft.loftq_config: ");
  if (!c.lora.enabled)
    errors.push_back(cat(at, "LoftQ initialises a LoRA adapter (adapter: lora)"));
  else if (c.lora.base != WeightFormat::Dense)
    errors.push_back(cat(at, "LoftQ quantises a full-precision base itself: use adapter: lora, not ", c.lora.base_key));
  else if (c.zero_stage == 3)
    errors.push_back(cat(at, "LoftQ with zero_stage 3 is not built (each rank would need the whole base weights)"));
}

// Early stopping counts evaluations during training, of held-out data (Axolotl and transformers refuse it
// without them too).
void rule_early_stopping(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  const bool best_asked = c.load_best_model_at_end.value_or(false);
  if (c.early_stopping_patience == 0 && !best_asked) return;
  const char* k = c.early_stopping_patience > 0 ? "early_stopping_patience" : "load_best_model_at_end";
  if (c.validation_datasets.empty() && c.validation_split_ratio == 0 && c.validation_count == 0)
    errors.push_back(cat(en.where(k), ": ", k, " needs a validation set (val_set_size or test_datasets)"));
  else if (c.eval_steps == 0 && c.evals_per_epoch == 0)
    errors.push_back(cat(en.where(k), ": ", k, " needs evaluations during training (eval_steps or evals_per_epoch)"));
}

// QAT (model/qat.h) trains every weight of a dense causal LM with its projections fake-quantised: Axolotl refuses it
// with peft and 8/4-bit loading too; the rest is what soltrain has not built it for.
void rule_qat(const Entries& en, const std::string&, TrainConfig& c, std::vector<std::string>& errors) {
  if (!c.qat) return;
  const std::string at = cat(en.where("qat"), ": qat: ");
  if (c.lora.enabled)
    errors.push_back(cat(at, "QAT trains the whole model and does not combine with adapter: ",
                         c.lora.base_key.empty() ? "lora" : c.lora.base_key, " (Axolotl refuses QAT with PEFT too)"));
  if (c.fp8_hybrid) errors.push_back(cat(at, "QAT does not combine with recipe fp8-hybrid"));
  if (c.grpo.enabled) errors.push_back(cat(at, "QAT with rl: grpo is not built (its generation would need it too)"));
  if (c.token_tile != 0 && c.qat->activation.kind == FakeQuantKind::Nvfp4)  // (the model refuses it too, later)
    errors.push_back(cat(at,
                         "nvfp4 activations take one per-tensor scale over each projection's whole input; "
                         "token_tile would split the MLP's into tiles (leave token_tile unset)"));
  if (c.dpo.reward_model || c.process_reward_model)
    errors.push_back(cat(at, "QAT of a reward model's score head is not built"));
  if (c.qat->fake_quant_after_n_steps > 0)
    c.notes.push_back(cat("qat: fake_quant_after_n_steps ", c.qat->fake_quant_after_n_steps, ": the first ",
                          c.qat->fake_quant_after_n_steps,
                          " steps compute without fake quantisation, weights and activations both (torchao 0.17's "
                          "int4 weight quantiser has no off switch, so Axolotl's keeps fake-quantising the weights)"));
  c.notes.push_back(cat("qat: ", c.qat->describe(),
                        " fake-quantised in every projection and the LM head; the run saves the trained model "
                        "unquantised, as Axolotl's convert step does: quantise it with the same scheme to deploy it"));
}

constexpr Rule kRules[] = {rule_early_stopping,
                           rule_loftq,
                           rule_qat,
                           rule_lora_settings_imply_lora,
                           rule_classifier,
                           rule_quantised_base,
                           rule_peer_sharding,
                           rule_batch_size,
                           rule_axolotl_schedule,
                           rule_required,
                           rule_streaming,
                           rule_chat_template_jinja,
                           rule_mistral_common,
                           rule_offload,
                           rule_expert_parallel,
                           rule_ray,
                           rule_streamed_base,
                           rule_hub_push,
                           rule_trackers,
                           rule_grpo,
                           rule_optimizer};  // (after the rules that set offload and zero_stage)

}  // namespace

TrainConfig parse_train_config(const std::string& yaml, const std::string& where,
                               const std::vector<std::string>& overrides, TrainMode mode) {
  Entries en = read_entries(yaml, where, overrides);
  TrainConfig c;
  // A LLaMA-Factory config becomes soltrain's keys first (its stage picks rl / reward_model / pt); its relative
  // paths then resolve from the working folder, as LLaMA-Factory opens them.
  const bool llama_factory = is_llama_factory_config(en.order);
  if (llama_factory) {
    std::vector<std::pair<std::string, Entry>> keys;
    for (const std::string& k : en.order) keys.emplace_back(k, en.by_key.at(k));
    LlamaFactoryTranslation t = translate_llama_factory(keys, where, mode);
    en.order.clear();
    en.by_key.clear();
    for (auto& [k, e] : t.keys) {
      if (en.has(
              k)) {  // --set wins over the file (its LLaMA-Factory name or soltrain's); twice in the file is an error
        const bool set_new = e.where.rfind("--set", 0) == 0, set_old = en.where(k).rfind("--set", 0) == 0;
        if (set_new) en.by_key[k] = std::move(e);
        if (!set_new && !set_old)
          en.errors.push_back(
              cat(e.where, ": \"", k, "\" is given twice (LLaMA-Factory's name for it and soltrain's); keep one"));
        continue;
      }
      en.order.push_back(k);
      en.by_key[k] = std::move(e);
    }
    mode = t.mode;
    c.notes.insert(c.notes.end(), t.notes.begin(), t.notes.end());
  }
  mode = preference_mode(en, mode, c);
  // Axolotl's pretraining_dataset is a pretraining run whatever the command (`soltrain train` starts as sft)
  if (const auto pd = en.by_key.find("pretraining_dataset");
      mode == TrainMode::kSft && pd != en.by_key.end() && !is_off(pd->second.node))
    mode = TrainMode::kPretrain;
  c.dpo.enabled = mode == TrainMode::kDpo;
  c.grpo.enabled = mode == TrainMode::kGrpo;
  c.grpo.config_dir = fs::path(where).parent_path();
  c.mode = mode;
  if (mode == TrainMode::kPretrain) c.train_on_inputs = true;
  // A config in another tool's format (its key names) is resolved as that tool resolves it: Axolotl, Surogate,
  // TRL and HF open a relative path from the working folder; soltrain's own configs from their folder.
  const std::vector<std::string> peer = peer_format_keys(en);
  const fs::path file_dir = fs::path(where).parent_path();
  ReadContext x{c, mode, where, peer.empty() && !llama_factory ? file_dir : fs::path()};
  std::error_code ec;
  if (llama_factory && !file_dir.empty() && !fs::equivalent(file_dir, fs::current_path(), ec))
    c.notes.push_back(cat("relative paths in ", where, " (dataset_dir, deepspeed) resolve from the working folder, as ",
                          "LLaMA-Factory opens them"));
  else if (!peer.empty() && !file_dir.empty() && !fs::equivalent(file_dir, fs::current_path(), ec))
    c.notes.push_back(cat("relative paths in ", where, " resolve from the working folder, as Axolotl and the other ",
                          "Python tools resolve them: it uses their keys (", peer[0],
                          peer.size() > 1 ? cat(", ", peer[1]) : "", peer.size() > 2 ? ", ..." : "", ")"));
  check_synonyms_agree(en, mode, where, x.base);
  for (const std::string& key : en.order) {
    try {
      apply_key(key, en, x);
    } catch (const DatasetErrors& err) {
      en.errors.insert(en.errors.end(), err.all.begin(), err.all.end());
      en.failed.insert(key);
    } catch (const UserError& err) {
      en.errors.push_back(err.what());
      en.failed.insert(key);
    }
  }
  for (Rule rule : kRules) rule(en, where, c, en.errors);
  // Every problem at once, so a config is fixed in one edit rather than one rerun per key.
  if (en.errors.size() == 1) throw UserError(en.errors[0]);
  if (!en.errors.empty()) {
    std::string all = cat(where, ": ", en.errors.size(), " problems: ");
    for (size_t i = 0; i < en.errors.size(); ++i) all += (i ? "; " : "") + en.errors[i];
    throw UserError(all);
  }
  if (c.dataset_prepared_path.empty()) c.dataset_prepared_path = c.output_dir / "prepared";
  std::vector<std::pair<std::string, Entry>> entries;
  for (const std::string& k : en.order) entries.emplace_back(k, en.by_key.at(k));
  c.source_text = saved_config_text(en.source, entries, !overrides.empty(), x.base, c.model_hub_id);
  return c;
}

TrainConfig load_train_config(const fs::path& file, const std::vector<std::string>& overrides, TrainMode mode) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) user_error(file.string(), ": config file not found or unreadable");
  return parse_train_config(read_input_file(file, "a config"), file.string(), overrides, mode);
}

}  // namespace soltrain
