// The config reader: a table of known keys, each with a parser that checks its value. yaml-cpp gives line
// numbers (Mark) for the "unknown key" message; --set overrides replace a key's node before parsing.
#include "cli/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "cli/config_values.h"
#include "cli/dataset_keys.h"
#include "cli/peer_keys.h"
#include "core/error.h"
#include "data/named_templates.h"
#include "data/preference.h"
#include "hub/hub_cache.h"
#include "model/dpo_objective.h"

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

// Longer than any model's context (the largest are ~10^7): a bigger value is a typo, not a plan.
constexpr int64_t kMaxSequenceLen = int64_t(1) << 24;

}  // namespace

TrainConfig parse_train_config(const std::string& yaml, const std::string& where,
                               const std::vector<std::string>& overrides, TrainMode mode) {
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

  std::map<std::string, Entry> entries;
  std::vector<std::string> order, errors;
  std::set<std::string> failed;  // keys whose value was refused: not "missing" as well
  for (const auto& kv : root) {
    const std::string key = scalar_text(kv.first);
    // yaml-cpp keeps both of a repeated key; YAML forbids it, and one of the two values would be ignored.
    if (entries.count(key)) {
      errors.push_back(cat(where_of(where, kv.first), ": key \"", key, "\" appears twice (also at ", entries[key].where,
                           "); keep one"));
      continue;
    }
    order.push_back(key);
    entries[key] = {kv.second, where_of(where, kv.first)};
  }
  std::string source = yaml;
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
    if (!entries.count(key)) order.push_back(key);
    entries[key] = {value, "--set " + o};
    source += cat("\n# --set ", o, "\n", key, ": ", scalar_text(value), "\n");
  }

  TrainConfig c;
  c.source_text = source;
  // Axolotl's `rl: dpo` (or `ipo`) makes an sft-style config a preference run: known before the datasets are
  // read, since it decides how their records are read.
  if (const auto rl = entries.find("rl"); rl != entries.end() && rl->second.node.IsScalar()) {
    const std::string v = rl->second.node.Scalar();
    if (v == "dpo" || v == "ipo") {
      if (mode == TrainMode::kPretrain) user_error(rl->second.where, ": rl: ", v, " is a preference run, not pt");
      mode = TrainMode::kDpo;
      if (v == "ipo") c.dpo.loss = PreferenceLoss::Ipo;
    }
  }
  c.dpo.enabled = mode == TrainMode::kDpo;
  // Keys that only mean something in a preference run.
  auto dpo_only = [&](const Entry& e, const std::string& k) {
    if (mode != TrainMode::kDpo)
      user_error(e.where, ": ", k, " is a preference-training key: run `soltrain dpo` or set rl: dpo");
  };
  if (mode == TrainMode::kPretrain) c.train_on_inputs = true;
  const fs::path base = fs::path(where).parent_path();
  auto path_value = [&](const Entry& e, const std::string& k) {
    fs::path p = get_string(e, k);
    return p.is_relative() && !base.empty() && e.where.rfind("--set", 0) != 0 ? (base / p).lexically_normal() : p;
  };
  // `Org/Name` that is no local folder (next to the config or from here) is a hub model id.
  auto model_value = [&](const Entry& e, const std::string& k) {
    const std::string s = get_string(e, k);
    std::error_code ec;
    if (looks_like_hub_id(s) && !fs::exists(base / s, ec) && !fs::exists(s, ec)) {
      c.model_hub_id = s;
      c.model = s;
    } else {
      c.model_hub_id.clear();
      c.model = path_value(e, k);
    }
  };
  using Setter = std::function<void(const Entry&)>;
  const std::map<std::string, Setter> keys = {
      {"base_model", [&](const Entry& e) { model_value(e, "base_model"); }},
      {"model", [&](const Entry& e) { model_value(e, "model"); }},
      {"revision", [&](const Entry& e) { c.revision = get_string(e, "revision"); }},
      {"revision_of_model", [&](const Entry& e) { c.revision = get_string(e, "revision_of_model"); }},  // Axolotl's
      {"output_dir", [&](const Entry& e) { c.output_dir = path_value(e, "output_dir"); }},
      {"save_path", [&](const Entry& e) { c.output_dir = path_value(e, "save_path"); }},  // Surogate's name
      {"overwrite_output_dir", [&](const Entry& e) { c.overwrite_output_dir = get_bool(e, "overwrite_output_dir"); }},
      {"dataset_prepared_path",
       [&](const Entry& e) { c.dataset_prepared_path = path_value(e, "dataset_prepared_path"); }},
      {"datasets", [&](const Entry& e) { c.datasets = parse_datasets(e, "datasets", where, mode, base); }},
      {"validation_datasets",
       [&](const Entry& e) { c.validation_datasets = parse_datasets(e, "validation_datasets", where, mode, base); }},
      {"validation_split_ratio",
       [&](const Entry& e) { c.validation_split_ratio = get_double(e, "validation_split_ratio", 0, 0.9); }},
      // Axolotl's val_set_size: a fraction below 1, a number of documents from 1 on.
      {"val_set_size",
       [&](const Entry& e) {
         const double v = get<double>(e, "val_set_size", "a fraction in [0, 0.9] or a count of documents");
         if (v >= 1 && v == double(int64_t(v)))
           c.validation_count = int64_t(v);
         else
           c.validation_split_ratio = get_double(e, "val_set_size", 0, 0.9);
       }},
      {"rl",
       [&](const Entry& e) {
         const std::string v = get_string(e, "rl");
         if (v != "dpo" && v != "ipo")
           user_error(e.where, ": rl: \"", v,
                      "\": soltrain trains dpo and ipo (other preference methods are not built yet)");
       }},
      {"loss_type",
       [&](const Entry& e) {
         dpo_only(e, "loss_type");
         const std::string v = get_string(e, "loss_type");
         if (v != "sigmoid" && v != "ipo" && v != "hinge") bad_value(e, "loss_type", "sigmoid, ipo or hinge");
         c.dpo.loss = parse_preference_loss(v, e.where);
       }},
      {"beta", [&](const Entry& e) { dpo_only(e, "beta"), c.dpo.beta = get_double(e, "beta", 0, 1e6, true); }},
      {"rl_beta", [&](const Entry& e) { dpo_only(e, "rl_beta"), c.dpo.beta = get_double(e, "rl_beta", 0, 1e6, true); }},
      {"label_smoothing",
       [&](const Entry& e) {
         dpo_only(e, "label_smoothing"), c.dpo.label_smoothing = get_double(e, "label_smoothing", 0, 0.49);
       }},
      {"dpo_label_smoothing",
       [&](const Entry& e) {
         dpo_only(e, "dpo_label_smoothing"), c.dpo.label_smoothing = get_double(e, "dpo_label_smoothing", 0, 0.49);
       }},
      {"rpo_alpha",
       [&](const Entry& e) { dpo_only(e, "rpo_alpha"), c.dpo.rpo_alpha = get_double(e, "rpo_alpha", 0, 1e6); }},
      {"precompute_ref_log_probs",
       [&](const Entry& e) {
         dpo_only(e, "precompute_ref_log_probs"), c.dpo.precompute_ref = get_bool(e, "precompute_ref_log_probs");
       }},
      {"max_prompt_len",
       [&](const Entry& e) { dpo_only(e, "max_prompt_len"), c.dpo.max_prompt_len = get_int(e, "max_prompt_len", 1); }},
      {"sequence_len", [&](const Entry& e) { c.sequence_len = get_int32(e, "sequence_len", 2, kMaxSequenceLen); }},
      {"sample_packing", [&](const Entry& e) { c.sample_packing = get_bool(e, "sample_packing"); }},
      {"train_on_inputs",
       [&](const Entry& e) {
         c.train_on_inputs = get_bool(e, "train_on_inputs");
         if (mode == TrainMode::kPretrain && !c.train_on_inputs)
           user_error(e.where, ": train_on_inputs: false has no meaning for pt (every token of text is trained)");
       }},
      {"per_device_train_batch_size",
       [&](const Entry& e) { c.per_device_train_batch_size = get_int32(e, "per_device_train_batch_size", 1); }},
      {"micro_batch_size",
       [&](const Entry& e) { c.per_device_train_batch_size = get_int32(e, "micro_batch_size", 1); }},
      {"gradient_accumulation_steps",
       [&](const Entry& e) { c.gradient_accumulation_steps = get_int32(e, "gradient_accumulation_steps", 1); }},
      {"num_epochs", [&](const Entry& e) { c.num_epochs = get_double(e, "num_epochs", 0, 1e6, true); }},
      {"num_train_epochs",  // transformers' (and Surogate's) name
       [&](const Entry& e) { c.num_epochs = get_double(e, "num_train_epochs", 0, 1e6, true); }},
      {"max_steps", [&](const Entry& e) { c.max_steps = get_int(e, "max_steps", 0); }},
      {"learning_rate", [&](const Entry& e) { c.learning_rate = get_double(e, "learning_rate", 0, 10, true); }},
      {"lr_scheduler_type",
       [&](const Entry& e) {
         try {
           c.lr_scheduler_type = parse_schedule_type(get_string(e, "lr_scheduler_type"));
         } catch (const UserError&) {
           bad_value(e, "lr_scheduler_type", "constant, constant_with_warmup, linear, cosine or wsd");
         }
       }},
      {"lr_scheduler",
       [&](const Entry& e) {
         try {
           c.lr_scheduler_type = parse_schedule_type(get_string(e, "lr_scheduler"));
         } catch (const UserError&) {
           bad_value(e, "lr_scheduler", "constant, constant_with_warmup, linear, cosine or wsd");
         }
       }},
      {"warmup_steps", [&](const Entry& e) { c.warmup_steps = get_int(e, "warmup_steps", 0); }},
      {"warmup_ratio", [&](const Entry& e) { c.warmup_ratio = get_double(e, "warmup_ratio", 0, 1); }},
      {"wsd_decay_ratio", [&](const Entry& e) { c.wsd_decay_ratio = get_double(e, "wsd_decay_ratio", 0, 1); }},
      {"weight_decay", [&](const Entry& e) { c.weight_decay = get_double(e, "weight_decay", 0, 10); }},
      {"max_grad_norm", [&](const Entry& e) { c.max_grad_norm = get_double(e, "max_grad_norm", 0, 1e9); }},
      {"adamw_beta1", [&](const Entry& e) { c.adamw_beta1 = get_double(e, "adamw_beta1", 0, 1); }},
      {"adamw_beta2", [&](const Entry& e) { c.adamw_beta2 = get_double(e, "adamw_beta2", 0, 1); }},
      {"adamw_epsilon", [&](const Entry& e) { c.adamw_epsilon = get_double(e, "adamw_epsilon", 0, 1, true); }},
      {"seed", [&](const Entry& e) { c.seed = uint64_t(get_int(e, "seed", 0)); }},
      // Data parallel: worker processes started on this machine, and ZeRO's stage (DeepSpeed's meaning).
      {"gpus", [&](const Entry& e) { c.gpus = get_int32(e, "gpus", 1, 1024); }},
      {"zero_stage", [&](const Entry& e) { c.zero_stage = get_int32(e, "zero_stage", 0, 3); }},
      // Surogate's names: the fp32 masters / AdamW moments in host memory, streamed through the device each update.
      {"offload_master", [&](const Entry& e) { c.offload.master = get_bool(e, "offload_master"); }},
      {"offload_optimizer", [&](const Entry& e) { c.offload.optimizer = get_bool(e, "offload_optimizer"); }},
      // The layer-input checkpoints of recompute full in host memory, a ring of two on the device.
      {"offload_activations", [&](const Entry& e) { c.offload_activations = get_bool(e, "offload_activations"); }},
      {"offload_weights", [&](const Entry& e) { c.offload_weights = get_bool(e, "offload_weights"); }},
      {"offload_weights_resident_layers",
       [&](const Entry& e) {
         c.offload_weights_resident_layers = int(get_int(e, "offload_weights_resident_layers", 0, 1 << 20));
       }},
      {"recompute",
       [&](const Entry& e) {
         const std::string r = get_string(e, "recompute");
         if (r != "none" && r != "elementwise" && r != "selective" && r != "full")
           bad_value(e, "recompute", "none, elementwise, selective or full");
         c.recompute = parse_recompute(r, "recompute");
       }},
      // Long sequences: the MLP's token tile (model/activation_plan.h; 0 = automatic).
      {"token_tile", [&](const Entry& e) { c.token_tile = get_int(e, "token_tile", 0); }},
      // The precision recipe (Surogate's key and names; model/fp8_recipe.h) and its FP8 settings.
      {"recipe",
       [&](const Entry& e) {
         const std::string r = get_string(e, "recipe");
         if (r != "bf16" && r != "fp8-hybrid")
           user_error(e.where, ": recipe: \"", r, "\": soltrain's recipes are bf16 and fp8-hybrid",
                      r == "nvfp4" ? " (NVFP4 needs a Blackwell GPU and is not built)" : "");
         c.fp8_hybrid = r == "fp8-hybrid";
       }},
      {"fp8_scaling",
       [&](const Entry& e) {
         const std::string r = get_string(e, "fp8_scaling");
         if (r != "delayed" && r != "current") bad_value(e, "fp8_scaling", "delayed or current");
         c.fp8.delayed = r == "delayed";
       }},
      {"fp8_amax_history", [&](const Entry& e) { c.fp8.amax_history = get_int32(e, "fp8_amax_history", 1, 8192); }},
      {"fp8_margin", [&](const Entry& e) { c.fp8.margin = get_int32(e, "fp8_margin", 0, 64); }},
      {"skip_quant_first_layers",
       [&](const Entry& e) { c.fp8.skip_first_layers = get_int32(e, "skip_quant_first_layers", 0); }},
      {"skip_quant_last_layers",
       [&](const Entry& e) { c.fp8.skip_last_layers = get_int32(e, "skip_quant_last_layers", 0); }},
      {"attention_backward",
       [&](const Entry& e) {
         const std::string f = get_string(e, "attention_backward");
         if (f != "split" && f != "ordered" && f != "atomic")
           bad_value(e, "attention_backward", "split, ordered or atomic");
         c.attention_backward = parse_attention_backward(f, "attention_backward");
       }},
      {"residual_dtype",
       [&](const Entry& e) {
         const std::string r = get_string(e, "residual_dtype");
         if (r != "auto" && r != "fp32" && r != "bf16") bad_value(e, "residual_dtype", "auto, fp32 or bf16");
         c.residual_dtype = parse_residual_dtype(r, "residual_dtype");
       }},
      {"adapter",
       [&](const Entry& e) {
         const std::string a = get_string(e, "adapter");
         if (a == "qlora")
           set_quantised_base(c, WeightFormat::Nf4, "adapter: qlora", e.where);  // Axolotl: LoRA over NF4
         else if (a != "lora")
           bad_value(e, "adapter", "lora or qlora");
         c.lora.enabled = true;
       }},
      {"lora", [&](const Entry& e) { c.lora.enabled = get_bool(e, "lora"); }},
      {"qlora_nf4",
       [&](const Entry& e) {
         if (get_bool(e, "qlora_nf4")) set_quantised_base(c, WeightFormat::Nf4, "qlora_nf4", e.where);
       }},
      {"qlora_fp8",
       [&](const Entry& e) {
         if (get_bool(e, "qlora_fp8")) set_quantised_base(c, WeightFormat::Fp8Block, "qlora_fp8", e.where);
       }},
      {"lora_rank", [&](const Entry& e) { c.lora.rank = get_int32(e, "lora_rank", 1); }},
      {"lora_r", [&](const Entry& e) { c.lora.rank = get_int32(e, "lora_r", 1); }},
      {"lora_alpha", [&](const Entry& e) { c.lora.alpha = get_double(e, "lora_alpha", 0, 1e6, true); }},
      {"lora_dropout", [&](const Entry& e) { c.lora.dropout = get_double(e, "lora_dropout", 0, 0.99); }},
      {"lora_target_modules",
       [&](const Entry& e) {
         static const std::vector<std::string> known = all_lora_module_names();
         c.lora.target_modules = get_string_list(e, "lora_target_modules");
         if (c.lora.target_modules.empty()) bad_value(e, "lora_target_modules", "a non-empty list");
         // PEFT's (and Surogate's) shorthand for every linear layer of the blocks.
         if (c.lora.target_modules == std::vector<std::string>{"all-linear"}) c.lora.target_modules = known;
         for (const std::string& m : c.lora.target_modules)
           if (std::find(known.begin(), known.end(), m) == known.end())
             unknown_key(e.where, m, known, "lora_target_modules entry");
       }},
      {"use_rslora", [&](const Entry& e) { c.lora.use_rslora = get_bool(e, "use_rslora"); }},
      {"save_steps", [&](const Entry& e) { c.save_steps = get_int(e, "save_steps", 0); }},
      {"save_total_limit", [&](const Entry& e) { c.save_total_limit = get_int32(e, "save_total_limit", 0); }},
      {"resume_from_checkpoint",
       [&](const Entry& e) {
         if (!e.node.IsScalar()) bad_value(e, "resume_from_checkpoint", "true, false or a checkpoint folder");
         const std::string s = e.node.Scalar();
         if (s == "true" || s == "True")
           c.resume_from_checkpoint = {ResumeFrom::kLatest, {}};
         else if (s == "false" || s == "False" || s.empty() || s == "null" || s == "~")
           c.resume_from_checkpoint = {ResumeFrom::kFresh, {}};
         else
           c.resume_from_checkpoint = {ResumeFrom::kFolder, path_value(e, "resume_from_checkpoint")};
       }},
      {"loss_watchdog_threshold",
       [&](const Entry& e) { c.loss_watchdog_threshold = get_double(e, "loss_watchdog_threshold", 0, 1e9, true); }},
      {"loss_watchdog_patience",
       [&](const Entry& e) { c.loss_watchdog_patience = get_int32(e, "loss_watchdog_patience", 1); }},
      {"eval_steps", [&](const Entry& e) { c.eval_steps = get_int(e, "eval_steps", 0); }},
      {"logging_steps", [&](const Entry& e) { c.logging_steps = get_int(e, "logging_steps", 1); }},
      {"device",
       [&](const Entry& e) {
         const std::string d = get_string(e, "device");
         if (d != "cpu" && d != "cuda") bad_value(e, "device", "cpu or cuda");
         c.device = d == "cuda" ? Device::CUDA : Device::CPU;
       }},
      {"bad_records",
       [&](const Entry& e) {
         const std::string s = get_string(e, "bad_records");
         if (s != "skip" && s != "error") bad_value(e, "bad_records", "skip or error");
         c.bad_records = parse_bad_record_policy(s);
       }},
  };
  std::vector<std::string> names;
  for (const auto& [k, v] : keys) names.push_back(k);
  for (const std::string& k : peer_key_names()) names.push_back(k);
  std::map<std::string, size_t> feature_error;  // a missing feature's text -> its entry in `errors`
  for (const std::string& key : order) {
    const Entry& e = entries.at(key);
    try {
      const auto it = keys.find(key);
      if (it != keys.end()) {
        if (!e.node.IsNull()) it->second(e);  // `key:` with nothing keeps the default
        continue;
      }
      try {
        if (apply_peer_key(key, e.node, c)) continue;
      } catch (const UserError& p) {
        // Keys asking for the same missing feature (fsdp and fsdp_config) make one problem, not one each.
        const std::string what = p.what();
        const std::string feature = what.rfind(key + ": ", 0) == 0 ? what.substr(key.size() + 2) : what;
        if (const auto same = feature_error.find(feature); same != feature_error.end()) {
          errors[same->second] += cat(" (also asked for by ", key, " at ", e.where, ")");
          failed.insert(key);
          continue;
        }
        feature_error[feature] = errors.size();
        user_error(e.where, ": ", what);
      }
      unknown_key(e.where, key, names, "key");
    } catch (const DatasetErrors& err) {
      errors.insert(errors.end(), err.all.begin(), err.all.end());
      failed.insert(key);
    } catch (const UserError& err) {
      errors.push_back(err.what());
      failed.insert(key);
    }
  }
  auto given = [&](std::initializer_list<const char*> ks) {
    for (const char* k : ks)
      if (entries.count(k) && (failed.count(k) || !entries.at(k).node.IsNull())) return true;
    return false;
  };
  if (entries.count("save_path") && entries.count("output_dir") && !entries.at("save_path").node.IsNull() &&
      !entries.at("output_dir").node.IsNull())
    errors.push_back(cat(entries.at("save_path").where, ": save_path and output_dir (", entries.at("output_dir").where,
                         ") are the same setting; keep one"));
  // LoRA settings without `adapter: lora` / `lora: true`: the user meant LoRA (Surogate turns it on by
  // default); training the full model instead would be a silent, expensive surprise.
  if (!given({"adapter", "lora"}) &&
      (given({"lora_r", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules"}) ||
       (given({"lora_target_linear"}) && entries.at("lora_target_linear").node.Scalar() == "true"))) {
    c.lora.enabled = true;
    c.notes.push_back("LoRA settings are given without `adapter: lora` or `lora: true`: training a LoRA adapter");
  }
  // A quantised base is frozen: only adapters can train over it.
  if (c.lora.base != WeightFormat::Dense && !c.lora.enabled)
    errors.push_back(
        cat(where, ": ", c.lora.base_key,
            ": a quantised base is frozen, so it trains LoRA adapters only (QLoRA): add `adapter: lora`, or "
            "drop it for full fine-tuning in bf16/fp32"));
  // The FP8 recipe's GEMMs read a bf16 base (Transformer::enable_fp8 says the same at run time).
  if (c.fp8_hybrid && c.lora.base != WeightFormat::Dense)
    errors.push_back(cat(where, ": recipe fp8-hybrid runs on a bf16 base; a quantised QLoRA base (",
                         weight_format_name(c.lora.base), ", ", c.lora.base_key,
                         ") dequantises into bf16 GEMMs: use recipe: bf16 with it"));
  // Axolotl's scheduler is cosine unless the config says otherwise (Surogate's and HF's: linear, soltrain's
  // default); a config written for Axolotl (its base_model key) gets Axolotl's, and the run says so.
  if (entries.count("base_model") && !given({"lr_scheduler", "lr_scheduler_type"})) {
    c.lr_scheduler_type = ScheduleType::kCosine;
    c.notes.push_back("lr_scheduler is not given: cosine, Axolotl's default (the config uses Axolotl's base_model)");
  }
  // Axolotl's constant tail after the cosine floor (get_cosine_schedule_with_warmup_decay_constant), used when
  // both ratios are non-zero.
  if (c.cosine_min_lr_ratio > 0 && c.cosine_constant_lr_ratio > 0)
    errors.push_back(cat(entries.at("cosine_constant_lr_ratio").where,
                         ": cosine_constant_lr_ratio: a constant learning rate at the cosine floor for the last part "
                         "of training is not built yet; drop it (the cosine then reaches its floor at the end)"));
  // A key whose value was refused is reported once, not again as missing.
  auto refused = [&](std::initializer_list<const char*> ks) {
    for (const char* k : ks)
      if (failed.count(k)) return true;
    return false;
  };
  if (c.model.empty() && !refused({"model", "base_model"}))
    errors.push_back(cat(where, ": `model` is required (a Hugging Face model folder)"));
  if (c.output_dir.empty() && !refused({"output_dir", "save_path"}))
    errors.push_back(cat(where, ": `output_dir` is required"));
  if (c.datasets.empty() && !refused({"datasets"}))
    errors.push_back(cat(where, ": `datasets` is required (a list of {path, type})"));
  // Offload streams the whole-model update (fp32 or 8-bit moments); the sharded (ZeRO) one keeps its on the device.
  for (const auto& [k, on] :
       {std::pair{"offload_master", c.offload.master}, std::pair{"offload_optimizer", c.offload.optimizer}}) {
    if (!on || !entries.count(k)) continue;
    if (c.zero_stage >= 1)
      errors.push_back(cat(entries.at(k).where, ": ", k, " with zero_stage ", c.zero_stage,
                           " is not built yet (the sharded update keeps its state on the device): use zero_stage: 0 "
                           "or drop ",
                           k));
  }
  // Offloaded checkpoints are recompute full's (the only activations it keeps across the pass).
  if (c.offload_activations && entries.count("offload_activations")) {
    const std::string& at = entries.at("offload_activations").where;
    if (c.recompute != Recompute::Full)
      errors.push_back(cat(at,
                           ": offload_activations needs recompute: full (it moves the layer-input checkpoints, "
                           "the only activations full recompute keeps, to host memory); got recompute: ",
                           recompute_name(c.recompute)));
  }
  if (c.offload_weights_resident_layers > 0 && !c.offload_weights)
    errors.push_back(cat(entries.at("offload_weights_resident_layers").where,
                         ": offload_weights_resident_layers keeps some of a streamed base's layers on the device: it "
                         "needs offload_weights: true"));
  // Streamed weights are a frozen base's (LoRA); its own copies elsewhere (quantised, FP8) would stay resident.
  // (Data parallel is fine: each rank streams its own copy of the base on the upload stream, apart from the
  // collectives on the side stream.)
  if (c.offload_weights && entries.count("offload_weights")) {
    const std::string& at = entries.at("offload_weights").where;
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
  // Every problem at once, so a config is fixed in one edit rather than one rerun per key.
  if (errors.size() == 1) throw UserError(errors[0]);
  if (!errors.empty()) {
    std::string all = cat(where, ": ", errors.size(), " problems: ");
    for (size_t i = 0; i < errors.size(); ++i) all += (i ? "; " : "") + errors[i];
    throw UserError(all);
  }
  if (c.dataset_prepared_path.empty()) c.dataset_prepared_path = c.output_dir / "prepared";
  return c;
}

TrainConfig load_train_config(const fs::path& file, const std::vector<std::string>& overrides, TrainMode mode) {
  std::ifstream in(file, std::ios::binary);
  if (!in) user_error(file.string(), ": config file not found or unreadable");
  std::stringstream s;
  s << in.rdbuf();
  return parse_train_config(s.str(), file.string(), overrides, mode);
}

}  // namespace soltrain
