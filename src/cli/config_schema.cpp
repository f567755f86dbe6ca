#include "cli/config_schema.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <type_traits>

#include "cli/dataset_keys.h"
#include "cli/peer_keys.h"
#include "data/dataset.h"
#include "data/named_templates.h"
#include "hub/hub_cache.h"
#include "model/activation_plan.h"
#include "model/dpo_objective.h"
#include "train/schedule.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// Longer than any model's context (the largest are ~10^7): a bigger value is a typo, not a plan.
constexpr int64_t kMaxSequenceLen = int64_t(1) << 24;

#define FIELD(member)    \
  [](auto& c) -> auto& { \
    return c.member;     \
  }  // const for the defaults, writable to read

using Reader = std::function<void(const Entry&, const std::string&, ReadContext&)>;

std::string choices_text(const std::vector<std::string>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); ++i) s += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return s;
}

// The defaults a key documents are TrainConfig's own (a fresh one's fields), so docs and code cannot differ.
const TrainConfig& defaults() {
  static const TrainConfig d;
  return d;
}

KeySpec key(std::string name, std::string type, std::string expected, std::string def, std::string doc, Reader read) {
  return KeySpec{std::move(name), {}, std::move(type), std::move(expected), std::move(def), std::move(doc),
                 kEveryCommand,   "", std::move(read)};
}

template <typename F>
KeySpec flag(std::string name, F field, std::string doc) {
  const bool d = field(defaults());
  return key(std::move(name), "bool", "true or false", d ? "true" : "false", std::move(doc),
             [field](const Entry& e, const std::string& k, ReadContext& x) { field(x.c) = get_bool(e, k); });
}

// An integer field; an `int` one is bounded by INT32_MAX (refused by name rather than wrapped).
template <typename F>
KeySpec integer(std::string name, F field, int64_t min, std::string doc, int64_t max = INT64_MAX) {
  using T = std::remove_reference_t<decltype(field(std::declval<TrainConfig&>()))>;
  if (std::is_same_v<T, int> && max == INT64_MAX) max = INT32_MAX;
  const std::string expected =
      max == INT64_MAX ? cat("an integer >= ", min) : cat("an integer from ", min, " to ", max);
  return key(std::move(name), "integer", expected, cat(field(defaults())), std::move(doc),
             [field, min, max](const Entry& e, const std::string& k, ReadContext& x) {
               field(x.c) = T(get_int(e, k, min, max));
             });
}

template <typename F>
KeySpec number(std::string name, F field, double min, double max, bool open_min, std::string doc) {
  const std::string expected = cat("a number in ", open_min ? "(" : "[", min, ", ", max, "]");
  return key(std::move(name), "number", expected, cat(field(defaults())), std::move(doc),
             [field, min, max, open_min](const Entry& e, const std::string& k, ReadContext& x) {
               field(x.c) = get_double(e, k, min, max, open_min);
             });
}

// A decay in [0, 1) (AdamW's betas, as torch.optim.AdamW checks them): 1 would never forget, and every
// step's update would be the first one's.
template <typename F>
KeySpec decay(std::string name, F field, std::string doc) {
  return key(std::move(name), "number", "a number in [0, 1)", cat(field(defaults())), std::move(doc),
             [field](const Entry& e, const std::string& k, ReadContext& x) {
               const double v = get_double(e, k, 0, 1);
               if (v >= 1) bad_value(e, k, "a number in [0, 1)");
               field(x.c) = v;
             });
}

// One of `choices`, then `set` turns it into the setting.
KeySpec choice(std::string name, std::vector<std::string> choices, std::string def, std::string doc,
               std::function<void(ReadContext&, const std::string&, const Entry&)> set) {
  const std::string expected = choices_text(choices);
  return key(std::move(name), "choice", expected, std::move(def), std::move(doc),
             [choices, expected, set](const Entry& e, const std::string& k, ReadContext& x) {
               const std::string s = get_string(e, k);
               if (std::find(choices.begin(), choices.end(), s) == choices.end()) bad_value(e, k, expected);
               set(x, s, e);
             });
}

KeySpec aka(KeySpec k, std::vector<std::string> aliases) {
  k.aliases = std::move(aliases);
  return k;
}

KeySpec only(KeySpec k, unsigned commands) {
  k.commands = commands;
  return k;
}

fs::path path_value(const Entry& e, const std::string& k, const ReadContext& x) {
  fs::path p = get_string(e, k);
  return p.is_relative() && !x.base.empty() && e.where.rfind("--set", 0) != 0 ? (x.base / p).lexically_normal() : p;
}

KeySpec path(std::string name, std::function<fs::path&(TrainConfig&)> field, std::string def, std::string doc) {
  return key(std::move(name), "path", "a path", std::move(def), std::move(doc),
             [field](const Entry& e, const std::string& k, ReadContext& x) { field(x.c) = path_value(e, k, x); });
}

// `Org/Name` that is no local folder (next to the config or from here) is a hub model id.
void read_model(const Entry& e, const std::string& k, ReadContext& x) {
  const std::string s = get_string(e, k);
  std::error_code ec;
  if (looks_like_hub_id(s) && !fs::exists(x.base / s, ec) && !fs::exists(s, ec)) {
    x.c.model_hub_id = s;
    x.c.model = s;
  } else {
    x.c.model_hub_id.clear();
    x.c.model = path_value(e, k, x);
  }
}

void add_model_keys(std::vector<KeySpec>& v) {
  v.push_back(aka(key("model", "path", "a Hugging Face model folder or hub id (Org/Name)", "",
                      "the model to train: an HF folder (config.json + safetensors) or a hub id, required", read_model),
                  {"base_model"}));
  v.push_back(
      aka(key("revision", "string", "a branch, tag or commit name", "main", "the hub model's branch, tag or commit",
              [](const Entry& e, const std::string& k, ReadContext& x) { x.c.revision = get_revision(e, k); }),
          {"revision_of_model"}));
  v.push_back(aka(path("output_dir", FIELD(output_dir), "",
                       "where checkpoints, metrics and the final model or adapter go, required"),
                  {"save_path"}));
  v.push_back(choice("save_dtype", {"auto", "bfloat16", "float16", "float32"}, "auto",
                     "a full fine-tune's saved model: auto is the base's own dtype (bf16 for a bf16 base, as HF "
                     "Trainer saves it); checkpoints keep the fp32 masters",
                     [](ReadContext& x, const std::string& s, const Entry&) {
                       x.c.save_dtype = s == "auto" ? std::nullopt : dtype_from_torch_name(s);
                     }));
  v.push_back(flag("push_to_hub", FIELD(hub.enabled),
                   "upload the trained model or adapter to hub_model_id on the Hugging Face hub (HF_TOKEN)"));
  v.push_back(key("hub_model_id", "string", "a hub repository id (Org/Name)", "",
                  "where push_to_hub uploads; giving it pushes (as Axolotl does)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const std::string id = get_string(e, k);
                    if (!looks_like_hub_id(id)) bad_value(e, k, "a hub repository id: Org/Name");
                    x.c.hub.model_id = id;  // (rule_hub_push: it pushes unless push_to_hub: false)
                  }));
  v.push_back(choice("hub_strategy", {"end", "every_save", "checkpoint", "all_checkpoints"}, "every_save",
                     "what is pushed when (HF's): every_save the model at each checkpoint and the end; checkpoint "
                     "also the latest checkpoint in last-checkpoint/; all_checkpoints each in checkpoint-N/",
                     [](ReadContext& x, const std::string& s, const Entry&) { x.c.hub.strategy = s; }));
  v.push_back(flag("hub_private_repo", FIELD(hub.private_repo), "push_to_hub creates the repository private"));
  v.push_back(flag("overwrite_output_dir", FIELD(overwrite_output_dir),
                   "write into a non-empty folder soltrain did not create"));
  v.push_back(path("dataset_prepared_path", FIELD(dataset_prepared_path), "output_dir/prepared",
                   "the tokenized shards' cache, reused by runs with the same data"));
  v.push_back(choice("device", {"cpu", "cuda"}, "cpu", "the backend: cpu (fp32, the reference) or cuda (bf16)",
                     [](ReadContext& x, const std::string& s, const Entry&) {
                       x.c.device = s == "cuda" ? Device::CUDA : Device::CPU;
                     }));
}

// special_tokens: {bos_token: ..., additional_special_tokens: [...]}, in the file's order.
void read_special_tokens(const Entry& e, const std::string& k, ReadContext& x) {
  if (!e.node.IsMap()) bad_value(e, k, "a map like {eos_token: ...}");
  for (const auto& kv : e.node) {
    const std::string role = scalar_text(kv.first);
    if (role == "additional_special_tokens") {
      x.c.tokenizer_edits.has_additional = true;
      if (!kv.second.IsSequence() && !kv.second.IsNull())
        user_error(e.where, ": ", k, ".", role, ": expected a list of tokens");
      for (const auto& t : kv.second) {
        if (!t.IsScalar()) user_error(e.where, ": ", k, ".", role, ": expected a list of tokens");
        x.c.tokenizer_edits.additional_special.push_back(t.Scalar());
      }
      continue;
    }
    if (!kv.second.IsScalar()) user_error(e.where, ": ", k, ".", role, ": expected a token (a string)");
    x.c.tokenizer_edits.special.emplace_back(role, kv.second.Scalar());  // (the file's order)
  }
}

void add_data_keys(std::vector<KeySpec>& v) {
  v.push_back(key("datasets", "datasets", "a list of datasets", "",
                  "training data: paths or {path, type, field_*, ...} entries (see Datasets), required",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    x.c.datasets = parse_datasets(e, k, x.file, x.mode, x.base);
                  }));
  // Axolotl's pretraining_dataset: its entries (type: pretrain, text_column) streamed as a pt run's text
  v.push_back(key("pretraining_dataset", "datasets", "a list of datasets", "",
                  "Axolotl's: text datasets streamed in order as a pt run trains (streaming: true; needs max_steps)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (is_off(e.node)) return;  // (an empty pretraining_dataset: is Axolotl's "none")
                    x.c.datasets = parse_datasets(e, k, x.file, x.mode, x.base);
                    x.c.streaming = x.c.pretraining_dataset = true;
                  }));
  v.push_back(key("streaming", "bool", "true or false", "false",
                  "read the training datasets as training goes, in order, never tokenized ahead nor whole in memory "
                  "(needs max_steps: a stream's length is not known)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    // (pretraining_dataset streams whatever this says, as Axolotl's does)
                    x.c.streaming = get_bool(e, k) || x.c.pretraining_dataset;
                  }));
  v.push_back(aka(key("validation_datasets", "datasets", "a list of datasets", "",
                      "held-out data evaluated every eval_steps (one document per row)",
                      [](const Entry& e, const std::string& k, ReadContext& x) {
                        x.c.validation_datasets = parse_datasets(e, k, x.file, x.mode, x.base);
                      }),
                  {"test_datasets"}));
  v.push_back(number("validation_split_ratio", FIELD(validation_split_ratio), 0, 0.9, false,
                     "without validation_datasets: this share of the training documents held out"));
  // Axolotl's val_set_size: a fraction below 1, a number of documents from 1 on.
  v.push_back(key("val_set_size", "number", "a fraction in [0, 0.9] or a count of documents", "0",
                  "Axolotl's: a fraction of the documents held out, or from 1 on a count of them",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const double d = get<double>(e, k, "a fraction in [0, 0.9] or a count of documents");
                    if (d >= 1 && d == double(int64_t(d)))
                      x.c.validation_count = int64_t(d);
                    else
                      x.c.validation_split_ratio = get_double(e, k, 0, 0.9);
                  }));
  v.push_back(integer("sequence_len", FIELD(sequence_len), 2,
                      "tokens per row; longer documents are cut (or left out: excess_length_strategy)",
                      kMaxSequenceLen));
  v.push_back(
      flag("sample_packing", FIELD(sample_packing), "pack several documents into a row (attention stays within each)"));
  v.push_back(key("train_on_inputs", "bool", "true or false", "false",
                  "train the prompt's tokens too, not only the answers' (pt: always)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    x.c.train_on_inputs = get_bool(e, k);
                    if (x.mode == TrainMode::kPretrain && !x.c.train_on_inputs)
                      user_error(e.where,
                                 ": train_on_inputs: false has no meaning for pt (every token of text is "
                                 "trained)");
                  }));
  v.push_back(
      choice("bad_records", {"skip", "error"}, "error",
             "a record that cannot be read or rendered: stop with its line, or skip it and count it",
             [](ReadContext& x, const std::string& s, const Entry&) { x.c.bad_records = parse_bad_record_policy(s); }));
  v.push_back(flag("dataset_exact_deduplication", FIELD(dataset_exact_deduplication),
                   "Axolotl's: tokenized documents identical to an earlier one are kept once"));
  v.push_back(
      choice("excess_length_strategy", {"truncate", "drop", "raise"}, "truncate",
             "documents longer than sequence_len: cut, left out, or refused (Axolotl's key; a config with "
             "Axolotl's base_model gets its default, drop)",
             [](ReadContext& x, const std::string& s, const Entry&) { x.c.overlong = parse_overlong_policy(s); }));
  v.push_back(integer("min_sample_len", FIELD(min_sample_len), 0,
                      "Axolotl's: tokenized documents shorter than this many tokens are dropped (0: none)"));
  v.push_back(key("chat_template", "string", "tokenizer_default, jinja or a template soltrain has", "tokenizer_default",
                  "the chat template of datasets without their own: the model's, a named one (chatml, llama3, ...) "
                  "or jinja (chat_template_jinja's)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const std::string s = get_string(e, k);
                    if (s != "tokenizer_default" && s != "jinja" && !named_chat_template(s))
                      user_error(e.where, ": ", k, ": \"", s,
                                 "\": not a template soltrain has; use tokenizer_default (the model's own) or one of ",
                                 named_chat_template_list());
                    x.c.chat_template = s;
                  }));
  v.push_back(key("chat_template_jinja", "string", "a Jinja chat template", "",
                  "Axolotl's: the chat template itself (with chat_template: jinja or none), written into the run's "
                  "tokenizer_config.json and saved with it",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    x.c.tokenizer_edits.chat_template = get_string(e, k);
                    if (x.c.tokenizer_edits.chat_template.empty()) bad_value(e, k, "a Jinja chat template");
                  }));
  v.push_back(key("special_tokens", "map", "a map like {eos_token: ...}", "",
                  "Axolotl's: sets the tokenizer's bos/eos/unk/pad/... token (adding it when new) and "
                  "additional_special_tokens; the run tokenizes with and saves that tokenizer",
                  read_special_tokens));
  v.push_back(key("tokens", "list", "a list of tokens", "",
                  "Axolotl's: tokens added to the tokenizer (each matched whole; the embedding grows when the model "
                  "has no spare rows)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (e.node.IsMap()) {  // Axolotl's first releases: special tokens under this key
                      read_special_tokens(e, k, x);
                      x.c.notes.push_back(cat(k,
                                              ": a map of special tokens (an early Axolotl form) is read as "
                                              "special_tokens"));
                      return;
                    }
                    x.c.tokenizer_edits.tokens = get_string_list(e, k);
                  }));
  v.push_back(key("added_tokens_overrides", "map", "a map of added-token ids to new strings", "",
                  "Axolotl's: renames reserved added tokens (id: new text) in the run's tokenizer",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (!e.node.IsMap()) bad_value(e, k, "a map of added-token ids to new strings");
                    for (const auto& kv : e.node) {
                      const std::string id = scalar_text(kv.first);
                      char* end = nullptr;
                      const long v = std::strtol(id.c_str(), &end, 10);
                      if (id.empty() || *end || v < 0 || v > INT32_MAX || !kv.second.IsScalar())
                        user_error(e.where, ": ", k, ".", id, ": expected an added token's id and its new string");
                      x.c.tokenizer_edits.overrides[int32_t(v)] = kv.second.Scalar();
                    }
                  }));
  v.push_back(flag("reinit_weights", FIELD(reinit_weights),
                   "Axolotl's: the base weights drawn afresh from the seed as transformers initialises a model from "
                   "its config (pretraining from scratch; the checkpoint's weights are not used)"));
  v.push_back(flag("resize_token_embeddings_to_32x", FIELD(resize_to_32x),
                   "Axolotl's: the embedding's rows rounded up to a multiple of 32 when it is resized"));
  v.push_back(flag("shrink_embeddings", FIELD(shrink_embeddings),
                   "Axolotl's: an embedding with more rows than the tokenizer has tokens is cut to the tokenizer"));
  v.push_back(flag("tokenizer_use_mistral_common", FIELD(mistral_common),
                   "Axolotl's: tokenize with the model's tekken.json and mistral-common's chat format for its "
                   "version (Devstral, Magistral, Ministral), converted to the tokenizer.json the run saves"));
  v.push_back(flag("mean_resizing_embeddings", FIELD(mean_resizing),
                   "transformers' mean_resizing: new embedding rows start at the mean of the others (else "
                   "normal(0, initializer_range))"));
}

void add_objective_keys(std::vector<KeySpec>& v) {
  v.push_back(key("rl", "choice", "dpo, ipo, orpo, simpo, kto or grpo", "",
                  "Axolotl's: makes an sft config a preference run (dpo, ipo; orpo and simpo without a reference; "
                  "kto on unpaired examples) or online RL (grpo)",
                  [](const Entry& e, const std::string& k, ReadContext&) {
                    const std::string s = get_string(e, k);
                    if (s != "dpo" && s != "ipo" && s != "orpo" && s != "simpo" && s != "kto" && s != "grpo")
                      user_error(e.where, ": rl: \"", s,
                                 "\": soltrain trains dpo, ipo, orpo, simpo, kto and grpo (other methods are not built "
                                 "yet)");
                  }));
  // loss_type and beta are TRL's names in both trainers: what they set follows the run.
  v.push_back(only(
      key("loss_type", "choice",
          "sigmoid, ipo, hinge or simpo (dpo); kto or apo_zero_unpaired (rl: kto); grpo, bnpo, dr_grpo or dapo (grpo)",
          "sigmoid (dpo), dapo (grpo)", "the loss (TRL's names)",
          [](const Entry& e, const std::string& k, ReadContext& x) {
            const std::string s = get_string(e, k);
            if (x.mode == TrainMode::kGrpo)
              x.c.grpo.loss.loss_type = parse_grpo_loss_type(s, e.where);
            else if (s == "apo_zero_unpaired")  // TRL's KTO variant without the KL estimate
              x.c.dpo.loss = PreferenceLoss::Kto, x.c.dpo.loss_given = x.c.dpo.apo_zero_unpaired = true;
            else
              x.c.dpo.loss = parse_preference_loss(s, e.where), x.c.dpo.loss_given = true;
          }),
      kDpoBit | kGrpoBit));
  v.push_back(only(aka(key("beta", "number", "a number >= 0 (dpo: > 0)", "0.1 (dpo), 0 (grpo)",
                           "DPO's temperature on the log-ratio margin; GRPO's weight on the KL to the reference",
                           [](const Entry& e, const std::string& k, ReadContext& x) {
                             if (x.mode == TrainMode::kGrpo)
                               x.c.grpo.loss.beta = float(get_double(e, k, 0, 1e6));
                             else
                               x.c.dpo.beta = get_double(e, k, 0, 1e6, true), x.c.dpo.beta_given = true;
                           }),
                       {"rl_beta"}),
                   kDpoBit | kGrpoBit));
  // Surogate's DPO block (surogate/dpo/config.py DPOLossConfig): its sigmoid DPO is TRL's; the variants it adds are
  // refused by name rather than dropped.
  v.push_back(only(
      key("loss", "map", "Surogate's DPO block {type: dpo, dpo_beta: ...}", "",
          "Surogate's: type dpo and dpo_beta (= beta); length_norm, span_mask, reference_free and target_margin are "
          "not built (each refused)",
          [](const Entry& e, const std::string& k, ReadContext& x) {
            if (!e.node.IsMap())
              bad_value(e, k, "Surogate's DPO block {type: dpo, dpo_beta: ...} (TRL's loss_type names the loss)");
            for (const auto& kv : e.node) {
              const std::string name = scalar_text(kv.first);
              const Entry v{kv.second, e.where};
              const std::string sub = cat(k, ".", name);
              if (name == "type") {
                if (get_string(v, sub) != "dpo") bad_value(v, sub, "dpo (Surogate's one DPO loss)");
              } else if (name == "dpo_beta") {
                x.c.dpo.beta = get_double(v, sub, 0, 1e6, true), x.c.dpo.beta_given = true;
              } else if (name == "length_norm" || name == "span_mask" || name == "reference_free") {
                if (get_bool(v, sub))
                  user_error(e.where, ": ", sub, ": true is not built (Surogate's DPO variant; TRL's sigmoid DPO is)");
              } else if (name == "target_margin") {
                if (get_double(v, sub, 0, 1e6) != 0) user_error(e.where, ": ", sub, " is not built (0 is)");
              } else {
                user_error(e.where, ": ", sub, " is not a key of Surogate's DPO block (type, dpo_beta, length_norm, ",
                           "span_mask, reference_free, target_margin)");
              }
            }
          }),
      kDpoBit));
  v.push_back(only(aka(number("label_smoothing", FIELD(dpo.label_smoothing), 0, 0.49, false,
                              "the share of pairs assumed flipped (conservative DPO)"),
                       {"dpo_label_smoothing"}),
                   kDpoBit));
  v.push_back(
      only(number("rpo_alpha", FIELD(dpo.rpo_alpha), 0, 1e6, false, "adds rpo_alpha x the chosen answers' NLL (RPO)"),
           kDpoBit));
  v.push_back(
      only(key("orpo_alpha", "number", "a number > 0", "0.1",
               "Axolotl's: beta when beta (rl_beta) is not given (ORPO's odds-ratio weight; Axolotl reads it as "
               "any preference method's beta)",
               [](const Entry& e, const std::string& k, ReadContext& x) {
                 x.c.dpo.orpo_alpha = get_double(e, k, 0, 1e6, true);
               }),
           kDpoBit));
  v.push_back(only(number("cpo_alpha", FIELD(dpo.cpo_alpha), 0, 1e6, false,
                          "SimPO: the chosen answers' NLL term's weight (TRL's CPOConfig)"),
                   kDpoBit));
  v.push_back(only(number("simpo_gamma", FIELD(dpo.simpo_gamma), -1e6, 1e6, false, "SimPO: the target reward margin"),
                   kDpoBit));
  v.push_back(only(aka(number("desirable_weight", FIELD(dpo.desirable_weight), 0, 1e6, true,
                              "KTO: the desirable examples' loss weight"),
                       {"kto_desirable_weight"}),
                   kDpoBit));
  v.push_back(only(aka(number("undesirable_weight", FIELD(dpo.undesirable_weight), 0, 1e6, true,
                              "KTO: the undesirable examples' loss weight"),
                       {"kto_undesirable_weight"}),
                   kDpoBit));
  v.push_back(only(flag("precompute_ref_log_probs", FIELD(dpo.precompute_ref),
                        "LoRA: the reference's log-probs computed once before training instead of every step"),
                   kDpoBit));
  v.push_back(only(integer("max_prompt_len", FIELD(dpo.max_prompt_len), 1,
                           "prompts are cut to their last this many tokens (0: not cut)"),
                   kDpoBit));
  v.push_back(key("reward_model", "bool", "true or false", "false",
                  "Axolotl's: the preference pairs train a Bradley-Terry reward model (TRL's RewardTrainer): the "
                  "model as its *ForSequenceClassification with one label, saved so",
                  [](const Entry& e, const std::string& k, ReadContext&) { get_bool(e, k); }));  // (preference_mode)
  v.push_back(only(flag("process_reward_model", FIELD(process_reward_model),
                        "Axolotl's: stepwise_supervised rows train a process reward model (TRL's PRMTrainer): the "
                        "model as its *ForTokenClassification, each step's label at its last token"),
                   kSftBit));
  v.push_back(only(key("step_separator", "string", "a string", "\\n",
                       "process reward models: the text after each step (TRL's PRMConfig)",
                       [](const Entry& e, const std::string& k, ReadContext& x) {
                         x.c.step_separator = get_string(e, k);
                         if (x.c.step_separator.empty()) user_error(e.where, ": ", k, ": must not be empty");
                       }),
                   kSftBit));
  v.push_back(only(flag("train_on_last_step_only", FIELD(train_on_last_step_only),
                        "process reward models: only each row's last step is labelled in the training data (TRL's)"),
                   kSftBit));
  v.push_back(integer("num_labels", FIELD(num_labels), 1,
                      "a classifier's labels: 1 for a reward model, 2 (the default) or more for a process reward model",
                      254));
  v.push_back(only(number("center_rewards_coefficient", FIELD(dpo.center_rewards_coefficient), 0, 1e6, false,
                          "reward models: adds this x the mean of (r_chosen + r_rejected)^2 (TRL's)"),
                   kDpoBit));
}

void add_schedule_keys(std::vector<KeySpec>& v) {
  v.push_back(aka(integer("per_device_train_batch_size", FIELD(per_device_train_batch_size), 1,
                          "rows of sequence_len tokens per micro-batch (DPO: pairs)"),
                  {"micro_batch_size"}));
  v.push_back(integer("gradient_accumulation_steps", FIELD(gradient_accumulation_steps), 1,
                      "micro-batches per optimizer update"));
  v.push_back(aka(number("num_epochs", FIELD(num_epochs), 0, 1e6, true, "passes over the training data"),
                  {"num_train_epochs"}));
  v.push_back(integer("max_steps", FIELD(max_steps), 0, "updates to run; > 0 overrides num_epochs"));
  v.push_back(number("learning_rate", FIELD(learning_rate), 0, 10, true, "the peak learning rate"));
  v.push_back(aka(key("lr_scheduler_type", "choice", "constant, constant_with_warmup, linear, cosine or wsd",
                      to_string(defaults().lr_scheduler_type),
                      "transformers' schedules (wsd: warmup, stable, decay); update k runs at lr x factor(k)",
                      [](const Entry& e, const std::string& k, ReadContext& x) {
                        try {
                          x.c.lr_scheduler_type = parse_schedule_type(get_string(e, k));
                        } catch (const UserError&) {
                          bad_value(e, k, "constant, constant_with_warmup, linear, cosine or wsd");
                        }
                      }),
                  {"lr_scheduler"}));
  // transformers reads a warmup_steps below 1 as a ratio of the updates (Axolotl's examples write 0.1)
  v.push_back(key("warmup_steps", "number", "an integer >= 0, or a ratio in (0, 1)", "0",
                  "updates of linear warmup from 0 (a number below 1: that share of the updates, as warmup_ratio)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const double v = get_double(e, k, 0, 1e15);
                    if (v > 0 && v < 1) {
                      x.c.warmup_ratio = v;
                      x.c.warmup_steps = 0;
                    } else if (v != std::floor(v)) {
                      bad_value(e, k, "an integer >= 0, or a ratio in (0, 1)");
                    } else {
                      x.c.warmup_steps = int64_t(v);
                    }
                  }));
  v.push_back(number("warmup_ratio", FIELD(warmup_ratio), 0, 1, false,
                     "without warmup_steps: this share of the updates warms up"));
  v.push_back(
      number("wsd_decay_ratio", FIELD(wsd_decay_ratio), 0, 1, false, "wsd: the last share of the updates decays to 0"));
  v.push_back(number("cosine_min_lr_ratio", FIELD(cosine_min_lr_ratio), 0, 1, false,
                     "cosine: decays to this share of the learning rate instead of 0 (Axolotl's)"));
  v.push_back(number("cosine_constant_lr_ratio", FIELD(cosine_constant_lr_ratio), 0, 1, false,
                     "Axolotl's constant tail at the cosine floor: not built yet, refused when both ratios are set"));
}

}  // namespace

bool set_optimizer(TrainConfig& c, const std::string& s) {
  if (s == "none" || s == "None" || s == "false" || s == "False") return true;  // the default
  // paged_adamw_32bit is bitsandbytes' fp32 AdamW in paged (unified) memory: the same updates.
  for (const char* o : {"adamw_torch", "adamw_torch_fused", "adamw", "adamw_hf", "paged_adamw_32bit"})
    if (s == o) return c.moments = Moments::F32, true;
  if (s == "adamw_torch_4bit") return c.moments = Moments::Torchao4, true;  // torchao's AdamW4bit
  for (const char* o : {"adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit"})
    if (s == o) return c.moments = Moments::Blockwise8, true;
  if (s == "muon") return c.muon = true, true;
  if (s == "normuon") return c.muon = c.normuon = true, true;  // Surogate's
  // HF's adamw_torch_8bit: torchao's AdamW8bit (bitsandbytes' maps and blocks, whole blocks only)
  if (s == "adamw_torch_8bit") return c.moments = Moments::Torchao8, true;
  return false;
}

std::string optimizer_refusal(const std::string& s) {
  if (s == "muon_8bit" || s == "dist_muon") return "not built yet; optimizer: muon is";
  return "not supported; use optimizer: adamw_torch (fp32 moments), adamw_8bit, adamw_torch_8bit, adamw_torch_4bit, "
         "muon or normuon";
}

namespace {

void add_optimizer_keys(std::vector<KeySpec>& v) {
  v.push_back(
      key("optimizer", "choice",
          "adamw_torch (adamw, adamw_torch_fused, adamw_hf, paged_adamw_32bit), adamw_8bit (adamw_bnb_8bit, "
          "paged_adamw_8bit), adamw_torch_8bit / adamw_torch_4bit (torchao's), muon or normuon",
          "adamw_torch",
          "AdamW with fp32 moments, or bitsandbytes' 8-bit blockwise moments (HF Trainer's names), or Muon on the "
          "hidden matrices with AdamW on the rest (Axolotl's muon), or NorMuon there (Surogate's normuon)",
          [](const Entry& e, const std::string& k, ReadContext& x) {
            const std::string s = get_string(e, k);
            if (!set_optimizer(x.c, s)) user_error(e.where, ": ", k, ": \"", s, "\": ", optimizer_refusal(s));
          }));
  v.push_back(number("weight_decay", FIELD(weight_decay), 0, 10, false, "AdamW's decoupled weight decay"));
  v.push_back(number("normuon_momentum", FIELD(normuon_momentum), 0, 1, true,
                     "Surogate's: optimizer: normuon's momentum on the hidden matrices"));
  v.push_back(number("normuon_beta2", FIELD(normuon_beta2), 0, 1, true,
                     "Surogate's: optimizer: normuon's variance EMA factor"));
  v.push_back(flag("normuon_cautious_wd", FIELD(normuon_cautious_wd),
                   "Surogate's: optimizer: normuon decays a weight only where its update agrees in sign (false: no "
                   "weight decay on its matrices, as Surogate)"));
  v.push_back(number("max_grad_norm", FIELD(max_grad_norm), 0, 1e9, false,
                     "clip the global gradient norm to this (0: no clipping)"));
  // (torchao's AdamW8bit / AdamWFp8 argument)
  v.push_back(flag("bf16_stochastic_round", FIELD(bf16_stochastic_round),
                   "the trained weights kept in bf16 only (no fp32 masters: 4 bytes a parameter less), each update "
                   "rounded stochastically"));
  // (torchtune's optimizer_in_bwd)
  v.push_back(aka(flag("optimizer_in_backward", FIELD(optimizer_in_backward),
                       "update each decoder layer as soon as its backward ends: no whole-model gradients (needs "
                       "max_grad_norm: 0 and gradient_accumulation_steps: 1; one process)"),
                  {"optimizer_in_bwd"}));
  // (adam_*: HF TrainingArguments' and Axolotl's names for the same)
  v.push_back(aka(decay("adamw_beta1", FIELD(adamw_beta1), "AdamW's first-moment decay"), {"adam_beta1"}));
  v.push_back(aka(decay("adamw_beta2", FIELD(adamw_beta2), "AdamW's second-moment decay"), {"adam_beta2"}));
  v.push_back(aka(number("adamw_epsilon", FIELD(adamw_epsilon), 0, 1, true, "AdamW's epsilon"), {"adam_epsilon"}));
  v.push_back(integer("seed", FIELD(seed), 0, "the data order's, LoRA's initialisation and dropout's seed"));
}

void add_adapter_keys(std::vector<KeySpec>& v) {
  v.push_back(key("adapter", "choice", "lora or qlora", "", "Axolotl's: lora, or qlora (LoRA over an NF4 base)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const std::string a = get_string(e, k);
                    if (a == "qlora")
                      set_quantised_base(x.c, WeightFormat::Nf4, "adapter: qlora", e.where);  // LoRA over NF4
                    else if (a != "lora")
                      bad_value(e, k, "lora or qlora");
                    x.c.lora.enabled = true;
                  }));
  v.push_back(flag("lora", FIELD(lora.enabled), "train LoRA adapters over a frozen base (PEFT's format)"));
  v.push_back(key("qlora_nf4", "bool", "true or false", "false", "the frozen base in NF4 (bitsandbytes' format)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (get_bool(e, k)) set_quantised_base(x.c, WeightFormat::Nf4, k, e.where);
                  }));
  v.push_back(key("qlora_fp8", "bool", "true or false", "false", "the frozen base in FP8 (128x128 blocks)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (get_bool(e, k)) set_quantised_base(x.c, WeightFormat::Fp8Block, k, e.where);
                  }));
  v.push_back(key("qlora_fp4", "bool", "true or false", "false",
                  "the frozen base in NVFP4 (E2M1 codes, an E4M3 scale per 16 and a tensor scale: ModelOpt's format)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (get_bool(e, k)) set_quantised_base(x.c, WeightFormat::Nvfp4, k, e.where);
                  }));
  v.push_back(aka(integer("lora_rank", FIELD(lora.rank), 1, "the adapters' rank"), {"lora_r"}));
  v.push_back(number("lora_alpha", FIELD(lora.alpha), 0, 1e6, true, "scale alpha / rank (alpha / sqrt(rank) rsLoRA)"));
  v.push_back(number("lora_dropout", FIELD(lora.dropout), 0, 0.99, false, "dropout on the adapters' input"));
  v.push_back(key("lora_target_modules", "list", "a list of projections, or all-linear",
                  "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "which projections get adapters",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    static const std::vector<std::string> known = all_lora_module_names();
                    std::vector<std::string> m = get_string_list(e, k);
                    if (m.empty()) bad_value(e, k, "a non-empty list");
                    // PEFT's (and Surogate's) shorthand for every linear layer of the blocks.
                    x.c.lora.all_linear = m == std::vector<std::string>{"all-linear"};
                    if (x.c.lora.all_linear) m = known;
                    for (const std::string& s : m)
                      if (std::find(known.begin(), known.end(), s) == known.end())
                        unknown_key(e.where, s, known, "lora_target_modules entry");
                    x.c.lora.target_modules = m;
                  }));
  v.push_back(key("lora_modules_to_save", "list", "a list of embed_tokens, lm_head", "",
                  "Axolotl's (PEFT's modules_to_save): the embedding / LM head trained in full beside the adapters "
                  "and saved with them (on a tied model two untied copies, as PEFT makes them)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    static const std::vector<std::string> known = {"embed_tokens", "lm_head"};
                    for (const std::string& s : get_string_list(e, k))
                      if (std::find(known.begin(), known.end(), s) == known.end())
                        unknown_key(e.where, s, known, "lora_modules_to_save entry");
                      else if (std::find(x.c.lora.modules_to_save.begin(), x.c.lora.modules_to_save.end(), s) ==
                               x.c.lora.modules_to_save.end())
                        x.c.lora.modules_to_save.push_back(s);
                  }));
  v.push_back(flag("use_rslora", FIELD(lora.use_rslora), "rank-stabilised scale alpha / sqrt(rank)"));
  v.push_back(flag("merge_adapter", FIELD(merge_adapter),
                   "Surogate's: the trained adapter also folded into the base, written to output_dir/merged"));
}

void add_precision_keys(std::vector<KeySpec>& v) {
  v.push_back(key("recipe", "choice", "bf16 or fp8-hybrid", "bf16",
                  "fp8-hybrid: the projections' GEMMs in FP8 (E4M3 forward, E5M2 gradients)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const std::string r = get_string(e, k);
                    if (r != "bf16" && r != "fp8-hybrid")
                      user_error(e.where, ": recipe: \"", r, "\": soltrain's recipes are bf16 and fp8-hybrid",
                                 r == "nvfp4" ? " (NVFP4 needs a Blackwell GPU and is not built)" : "");
                    x.c.fp8_hybrid = r == "fp8-hybrid";
                  }));
  v.push_back(choice("fp8_scaling", {"delayed", "current"}, "delayed",
                     "FP8 scales from an amax history (delayed) or each tensor's own amax (current)",
                     [](ReadContext& x, const std::string& s, const Entry&) { x.c.fp8.delayed = s == "delayed"; }));
  v.push_back(integer("fp8_amax_history", FIELD(fp8.amax_history), 1, "delayed scaling's history length", 8192));
  v.push_back(integer("fp8_margin", FIELD(fp8.margin), 0, "FP8 scales leave 2^margin of headroom", 64));
  v.push_back(integer("skip_quant_first_layers", FIELD(fp8.skip_first_layers), 0,
                      "fp8-hybrid: this many first layers stay in bf16"));
  v.push_back(integer("skip_quant_last_layers", FIELD(fp8.skip_last_layers), 0,
                      "fp8-hybrid: this many last layers stay in bf16"));
  v.push_back(choice("residual_dtype", {"auto", "fp32", "bf16"}, "auto",
                     "the GPU's residual stream: auto is fp32 with LoRA (as PEFT), bf16 for full fine-tuning",
                     [](ReadContext& x, const std::string& s, const Entry&) {
                       x.c.residual_dtype = parse_residual_dtype(s, "residual_dtype");
                     }));
  v.push_back(choice("attention_backward", {"split", "ordered", "atomic"}, "split",
                     "how attention's backward forms dQ on Hopper (split and ordered are bitwise repeatable)",
                     [](ReadContext& x, const std::string& s, const Entry&) {
                       x.c.attention_backward = parse_attention_backward(s, "attention_backward");
                     }));
}

void add_memory_keys(std::vector<KeySpec>& v) {
  // Surogate's recompute is a bool (its default true): everything in a block but the residual stream recomputed,
  // soltrain's full; false keeps everything, none.
  v.push_back(key("recompute", "choice", "none, elementwise, selective or full (or true / false)", "none",
                  "activations recomputed in backward instead of kept (results are bitwise the same); Surogate's "
                  "true / false: full / none",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    const std::string s = get_string(e, k);
                    if (s == "true" || s == "True") {
                      x.c.recompute = Recompute::Full;
                    } else if (s == "false" || s == "False") {
                      x.c.recompute = Recompute::None;
                    } else {
                      try {
                        x.c.recompute = parse_recompute(s, k);
                      } catch (const UserError&) {
                        bad_value(e, k, "none, elementwise, selective or full (or true / false)");
                      }
                    }
                  }));
  v.push_back(integer("token_tile", FIELD(token_tile), 0,
                      "the MLP runs over at most this many tokens at a time (0: sized at 512 MiB a buffer)"));
  v.push_back(flag("offload_master", FIELD(offload.master), "the fp32 master weights in host memory"));
  v.push_back(flag("offload_optimizer", FIELD(offload.optimizer), "AdamW's moments in host memory"));
  v.push_back(flag("offload_grads", FIELD(offload.grads),
                   "the decoder layers' fp32 gradients in host memory (two layers' worth on the device)"));
  v.push_back(flag("offload_activations", FIELD(offload_activations),
                   "recompute full's layer-input checkpoints in host memory"));
  v.push_back(flag("offload_weights", FIELD(offload_weights), "a LoRA run's frozen base streamed from host memory"));
  v.push_back(integer("offload_weights_resident_layers", FIELD(offload_weights_resident_layers), 0,
                      "offload_weights: this many of the base's layers stay on the device", 1 << 20));
  v.push_back(
      integer("gpus", FIELD(gpus), 1, "worker processes on this machine, one per GPU (CPU ranks on cpu)", 1024));
  v.push_back(integer("zero_stage", FIELD(zero_stage), 0, "ZeRO's stage with several ranks (DeepSpeed's meaning)", 3));
  v.push_back(integer("ep_size", FIELD(ep_size), 1,
                      "Mixture-of-Experts: each group of this many ranks splits the experts among its ranks", 1024));
  v.push_back(flag("ep_llep", FIELD(ep_balance.on),
                   "ep_size: least-loaded expert parallelism (LLEP): an imbalanced layer's busiest experts run part "
                   "of their rows on the least loaded ranks (every rank then holds every expert's weights)"));
  v.push_back(number("ep_llep_threshold", FIELD(ep_balance.threshold), 1, 1e9, false,
                     "ep_llep: re-place a layer's rows only when its busiest rank would run more than this times "
                     "the group's mean (LLEP's lambda)"));
  v.push_back(number("ep_llep_capacity", FIELD(ep_balance.capacity), 1, 1e9, false,
                     "ep_llep: a rank takes at most this times the group's mean rows before the rest spills to "
                     "others (LLEP's alpha)"));
  v.push_back(integer("ep_llep_min_rows", FIELD(ep_balance.min_rows), 1,
                      "ep_llep: a spilled piece of an expert smaller than this goes to a roomier rank (LLEP's m)"));
  v.push_back(integer("ddp_timeout", FIELD(ddp_timeout), 1,
                      "seconds a rank waits for another (rendezvous, CPU collectives) before the job ends naming it",
                      1 << 24));
}

void add_run_keys(std::vector<KeySpec>& v) {
  v.push_back(integer("save_steps", FIELD(save_steps), 0, "a checkpoint every this many updates (0: at the end)"));
  v.push_back(flag("background_checkpoints", FIELD(background_checkpoints),
                   "checkpoints written from a host snapshot while training goes on (not ZeRO-3)"));
  v.push_back(integer("save_total_limit", FIELD(save_total_limit), 0, "checkpoints kept, the oldest removed (0: all)"));
  v.push_back(key("resume_from_checkpoint", "string", "true, false or a checkpoint folder", "false",
                  "continue a checkpoint: true for the newest in output_dir, or its folder",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (!e.node.IsScalar()) bad_value(e, k, "true, false or a checkpoint folder");
                    const std::string s = e.node.Scalar();
                    if (s == "true" || s == "True")
                      x.c.resume_from_checkpoint = {ResumeFrom::kLatest, {}};
                    else if (s == "false" || s == "False" || s.empty() || s == "null" || s == "~")
                      x.c.resume_from_checkpoint = {ResumeFrom::kFresh, {}};
                    else
                      x.c.resume_from_checkpoint = {ResumeFrom::kFolder, path_value(e, k, x)};
                  }));
  v.push_back(flag("auto_resume", FIELD(auto_resume),
                   "a job whose rank died restarts by itself from its last complete checkpoint"));
  v.push_back(integer("max_restarts", FIELD(max_restarts), 0, "auto_resume: restarts at most this many times", 1000));
  v.push_back(key("auto_resume_from_checkpoints", "bool", "true or false", "false",
                  "Axolotl's: start from the newest checkpoint in output_dir (resume_from_checkpoint: true)",
                  [](const Entry& e, const std::string& k, ReadContext& x) {
                    if (get_bool(e, k)) x.c.resume_from_checkpoint = {ResumeFrom::kLatest, {}};
                  }));
  v.push_back(number("saves_per_epoch", FIELD(saves_per_epoch), 0, 1e6, false,
                     "Axolotl's: checkpoints per epoch, when save_steps is not given (0: none)"));
  v.push_back(integer("eval_steps", FIELD(eval_steps), 0, "evaluate every this many updates (0: first and last)"));
  v.push_back(number("evals_per_epoch", FIELD(evals_per_epoch), 0, 1e6, false,
                     "Axolotl's: evaluations per epoch, when eval_steps is not given (0: none)"));
  v.push_back(integer("early_stopping_patience", FIELD(early_stopping_patience), 0,
                      "stop after this many evaluations in a row without a lower validation loss (0: never)", 1000000));
  v.push_back(number("early_stopping_threshold", FIELD(early_stopping_threshold), 0, 1e9, false,
                     "... lower by more than this (transformers' EarlyStoppingCallback)"));
  v.push_back(
      key("load_best_model_at_end", "bool", "true or false", "early stopping with a checkpoint per evaluation",
          "the final model is the checkpoint with the lowest validation loss",
          [](const Entry& e, const std::string& k, ReadContext& x) { x.c.load_best_model_at_end = get_bool(e, k); }));
  v.push_back(integer("logging_steps", FIELD(logging_steps), 1, "log the loss every this many updates"));
  v.push_back(integer("skip_bad_batches", FIELD(skip_bad_batches), 0,
                      "a NaN/inf loss restores the last checkpoint and skips the update's batches, this many times"));
  v.push_back(number("loss_watchdog_threshold", FIELD(loss_watchdog_threshold), 0, 1e9, true,
                     "stop when the loss stays above this (Axolotl's watchdog)"));
  v.push_back(
      integer("loss_watchdog_patience", FIELD(loss_watchdog_patience), 1, "... for this many logged steps in a row"));
}

void add_grpo_keys(std::vector<KeySpec>& v) {
  auto g = [](KeySpec k) { return only(std::move(k), kGrpoBit); };
  v.push_back(g(integer("num_generations", FIELD(grpo.num_generations), 2,
                        "completions per prompt (a group): the advantages compare them")));
  v.push_back(g(integer("max_prompt_length", FIELD(grpo.max_prompt_length), 1,
                        "prompts are cut to their last this many tokens")));
  v.push_back(g(integer("max_completion_length", FIELD(grpo.loss.max_completion_length), 1,
                        "tokens generated per completion at most")));
  v.push_back(g(integer("num_iterations", FIELD(grpo.num_iterations), 1,
                        "updates on each batch of completions (the sampling policy's log-probs kept)")));
  v.push_back(g(number("epsilon", FIELD(grpo.loss.epsilon), 0, 0.99, false, "the ratio's lower clip: 1 - epsilon")));
  v.push_back(g(key("epsilon_high", "number", "a number >= 0", "epsilon", "the ratio's upper clip: 1 + epsilon_high",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.loss.epsilon_high = float(get_double(e, k, 0, 100));
                      x.c.grpo.epsilon_high_given = true;
                    })));
  v.push_back(g(key("delta", "number", "a number > 1", "none", "caps the importance ratio (two-sided clipping)",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      const double d = get_double(e, k, 1, 1e6, true);
                      x.c.grpo.loss.delta = float(d);
                    })));
  v.push_back(g(choice("scale_rewards", {"group", "batch", "none"}, "group",
                       "advantages divided by the group's reward std, the batch's, or not",
                       [](ReadContext& x, const std::string& s, const Entry& e) {
                         x.c.grpo.loss.scale_rewards = parse_scale_rewards(s, e.where);
                       })));
  v.push_back(g(choice(
      "importance_sampling_level", {"token", "sequence"}, "token",
      "one importance ratio per token, or per completion (GSPO)",
      [](ReadContext& x, const std::string& s, const Entry&) { x.c.grpo.loss.sequence_level = s == "sequence"; })));
  v.push_back(g(flag("use_bias_correction_kl", FIELD(grpo.loss.kl_ratio),
                     "the KL term times the importance ratio (its unbiased gradient)")));
  v.push_back(g(key("top_entropy_quantile", "number", "a number in [0, 1]", "1",
                    "the policy term counts only at each micro-batch's completion tokens whose entropy is in this top "
                    "share (TRL's; the KL term counts everywhere)",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.loss.top_entropy_quantile = float(get_double(e, k, 0, 1));
                    })));
  v.push_back(g(flag("use_vllm", FIELD(grpo.use_vllm),
                     "TRL's: soltrain generates in its own engine either way (no vLLM); true turns on "
                     "vllm_importance_sampling_correction when that is not given, as TRL's default does")));
  v.push_back(g(key("vllm_importance_sampling_correction", "bool", "true or false", "use_vllm",
                    "weigh each completion token by pi_old / pi_sampling (the trainer's log-prob over the generation "
                    "engine's), TRL's correction for the engine's numerics",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.sampling_correction_given = get_bool(e, k) ? 1 : 0;
                    })));
  v.push_back(
      g(choice("vllm_importance_sampling_mode", {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"},
               "sequence_mask",
               "the correction's ratio per token or per completion, clipped (truncate) or zeroed outside "
               "[clip_min, clip_max] (mask)",
               [](ReadContext& x, const std::string& s, const Entry&) { x.c.grpo.sampling_correction_mode = s; })));
  for (const char* name : {"vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap"})
    v.push_back(g(key(name, "number", "a number > 0", "3",
                      std::string(name) == "vllm_importance_sampling_cap"
                          ? "TRL's older name of vllm_importance_sampling_clip_max"
                          : "the correction's upper bound",
                      [](const Entry& e, const std::string& k, ReadContext& x) {
                        x.c.grpo.sampling_clip_max = get_double(e, k, 0, 1e30, true);
                      })));
  v.push_back(g(key("vllm_importance_sampling_clip_min", "number", "a number >= 0", "none",
                    "the correction's lower bound", [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.sampling_clip_min = get_double(e, k, 0, 1e30);
                    })));
  v.push_back(g(flag("mask_truncated_completions", FIELD(grpo.mask_truncated_completions),
                     "completions cut by max_completion_length count nothing in the loss")));
  v.push_back(g(key("reward_funcs", "list", "a list of names", "",
                    "the reward functions: built-in (accuracy, think_format), module.path:function (Python), an "
                    "http(s):// endpoint or command:CMD (JSON in, scores out)",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.reward_funcs = get_string_list(e, k);
                      if (x.c.grpo.reward_funcs.empty()) bad_value(e, k, "a non-empty list of reward functions");
                    })));
  v.push_back(g(integer("reward_timeout", FIELD(grpo.reward_timeout), 1,
                        "seconds a reward endpoint or command may take per batch")));
  v.push_back(g(key("reward_weights", "list", "a list of numbers", "1 each", "each reward function's weight",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.reward_weights.clear();
                      for (const std::string& s : get_string_list(e, k)) {
                        char* end = nullptr;
                        const double w = std::strtod(s.c_str(), &end);
                        if (s.empty() || *end != 0 || !std::isfinite(w)) bad_value(e, k, "a list of numbers");
                        x.c.grpo.reward_weights.push_back(w);
                      }
                    })));
  v.push_back(g(number("temperature", FIELD(grpo.temperature), 0, 100, true,
                       "sampling temperature (the trained log-probs use it too)")));
  v.push_back(g(number("top_p", FIELD(grpo.top_p), 0, 1, true, "nucleus sampling's mass")));
  v.push_back(g(integer("top_k", FIELD(grpo.top_k), 0, "sample among the k likeliest tokens (0: all)")));
  v.push_back(g(number("min_p", FIELD(grpo.min_p), 0, 1, false,
                       "drop tokens below min_p x the likeliest token's probability (0: off)")));
  v.push_back(g(number("repetition_penalty", FIELD(grpo.repetition_penalty), 0, 100, true,
                       "divides the logits of tokens already in the prompt or completion (1: off)")));
  v.push_back(g(key("stop_strings", "list", "a list of strings", "",
                    "a completion ends at the token that completes one of these in its text (kept, as "
                    "transformers' stop_strings; counted as terminated)",
                    [](const Entry& e, const std::string& k, ReadContext& x) {
                      x.c.grpo.stop_strings = get_string_list(e, k);
                      for (const std::string& s : x.c.grpo.stop_strings)
                        if (s.empty()) bad_value(e, k, "a list of non-empty strings");
                    })));
  v.push_back(g(number("generation_memory_gib", FIELD(grpo.generation_memory_gib), 0, 1e6, false,
                       "the most memory generation may take (KV cache, activations, logits), GiB (0: what is free)")));
  v.push_back(g(number("generation_memory_fraction", FIELD(grpo.generation_memory_fraction), 0, 1, false,
                       "the same as a share of the device's memory (0: not set)")));
  v.push_back(g(flag("generation_overlap", FIELD(grpo.generation_overlap),
                     "one step off-policy: the next batch generates from the update's starting weights while the "
                     "update trains (the importance ratio to the weights that sampled carries the staleness)")));
  v.push_back(g(flag("log_completions", FIELD(grpo.log_completions),
                     "print a sample of completions and their rewards at each logged step")));
  v.push_back(g(integer("num_completions_to_print", FIELD(grpo.num_completions_to_print), 1,
                        "how many completions log_completions prints")));
}

std::vector<KeySpec> make_keys() {
  std::vector<KeySpec> v;
  const std::pair<const char*, void (*)(std::vector<KeySpec>&)> sections[] = {
      {"Model and outputs", add_model_keys},           {"Data", add_data_keys},
      {"Preference training", add_objective_keys},     {"Online RL (GRPO)", add_grpo_keys},
      {"Batches and schedule", add_schedule_keys},     {"Optimizer", add_optimizer_keys},
      {"Adapters and base storage", add_adapter_keys}, {"Precision", add_precision_keys},
      {"Memory and parallelism", add_memory_keys},     {"Checkpoints, evaluation and logging", add_run_keys}};
  for (const auto& [name, add] : sections) {
    const size_t first = v.size();
    add(v);
    for (size_t i = first; i < v.size(); ++i) v[i].section = name;
  }
  return v;
}

}  // namespace

const std::vector<KeySpec>& config_keys() {
  static const std::vector<KeySpec> keys = make_keys();
  return keys;
}

const KeySpec* find_config_key(const std::string& name) {
  static const std::map<std::string, const KeySpec*> index = [] {
    std::map<std::string, const KeySpec*> m;
    for (const KeySpec& k : config_keys()) {
      m[k.name] = &k;
      for (const std::string& a : k.aliases) m[a] = &k;
    }
    return m;
  }();
  const auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  for (const KeySpec& k : config_keys()) {
    names.push_back(k.name);
    names.insert(names.end(), k.aliases.begin(), k.aliases.end());
  }
  return names;
}

namespace {
std::string commands_text(unsigned c) {
  if (c == kEveryCommand) return "all";
  std::string s;
  for (const auto& [bit, name] :
       {std::pair{kSftBit, "sft"}, std::pair{kPtBit, "pt"}, std::pair{kDpoBit, "dpo"}, std::pair{kGrpoBit, "grpo"}})
    if (c & bit) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}
}  // namespace

std::string config_keys_markdown() {
  std::string out, section;
  for (const KeySpec& k : config_keys()) {
    if (k.section != section) {
      section = k.section;
      out += cat(out.empty() ? "" : "\n", "#### ", section,
                 "\n\n| key | value | default | what it does |\n|---|---|---|---|\n");
    }
    std::string names = "`" + k.name + "`";
    for (const std::string& a : k.aliases) names += " (`" + a + "`)";
    out += cat("| ", names, " | ", k.expected, " | ", k.default_value.empty() ? "" : "`" + k.default_value + "`", " | ",
               k.doc, k.commands == kEveryCommand ? "" : cat(" (", commands_text(k.commands), " only)"), " |\n");
  }
  return out;
}

nlohmann::json config_keys_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const KeySpec& k : config_keys())
    out.push_back({{"name", k.name},
                   {"aliases", k.aliases},
                   {"type", k.type},
                   {"expected", k.expected},
                   {"default", k.default_value},
                   {"doc", k.doc},
                   {"commands", commands_text(k.commands)},
                   {"section", k.section}});
  return out;
}

}  // namespace soltrain
