// A dataset entry's keys (Axolotl's, Surogate's and TRL's names for the same fields), as tables of readers.
#include "cli/dataset_keys.h"

#include <map>

#include "cli/config.h"
#include "cli/peer_keys.h"
#include "data/llama_factory.h"
#include "data/named_templates.h"
#include "data/preference.h"
#include "hub/hub_cache.h"
#include "tokenizer/chat_template.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

DatasetType dataset_type(const Entry& e, TrainMode mode) {
  const std::string s = get_string(e, "type");
  const auto t = find_dataset_type(s);
  if (!t)
    bad_value(e, "type",
              "text, completion, instruction, alpaca, alpaca_chat, jeopardy, input_output, conversation, chat_template "
              "or auto");
  if (mode == TrainMode::kPretrain && *t != DatasetType::kText && *t != DatasetType::kAuto)
    user_error(e.where, ": type: \"", s, "\": pt trains on text datasets (use `soltrain sft` for ", s, ")");
  return *t;
}

// One entry being read: the spec, and the keys whose meaning depends on others, resolved after every key.
struct DatasetRead {
  DatasetSpec d;
  DatasetFields& f = d.fields;
  TrainMode mode;
  std::string file;
  std::string system_prompt_type, system_prompt_type_where, system_prompt_field;
  std::vector<std::string> roles_to_train;
  std::string roles_to_train_where, type_name;
  std::string chat_template_where, chat_template_jinja_where;
  DatasetRead(TrainMode m, std::string fl) : mode(m), file(std::move(fl)) {
    if (mode == TrainMode::kPretrain) d.type = DatasetType::kText;
  }
  DatasetRead(const DatasetRead&) = delete;
};

using DatasetKey = void (*)(const Entry&, DatasetRead&);

// Axolotl's `type:` as a mapping (prompt_strategies/user_defined.py): its field names and prompt formats, defaults
// as UserDefinedDatasetConfig's. A format's placeholders are checked here, not at the first record.
void read_user_defined_type(const Entry& e, DatasetRead& r) {
  if (r.mode != TrainMode::kSft)
    user_error(e.where, ": type: a mapping (Axolotl's user-defined prompt) is an sft dataset's");
  r.type_name = "user_defined";
  r.d.type = DatasetType::kUserDefined;
  UserDefinedFormat u;
  r.f.system = "system";
  for (const auto& kv : e.node) {
    const std::string k = scalar_text(kv.first);
    const Entry v{kv.second, e.where};
    const std::string name = cat("type.", k);
    // (the prompts and formats may be empty: Axolotl's system_format "" leaves the system text out)
    const auto text = [&] {
      if (!v.node.IsScalar()) bad_value(v, name, "a string");
      return v.node.Scalar();
    };
    if (k == "system_prompt")
      u.system_prompt = text();
    else if (k == "field_system")
      r.f.system = get_string(v, name);
    else if (k == "field_instruction")
      r.f.instruction = get_string(v, name);
    else if (k == "field_input")
      r.f.input = get_string(v, name);
    else if (k == "field_output")
      r.f.output = get_string(v, name);
    else if (k == "format")
      u.format = text();
    else if (k == "no_input_format")
      u.no_input_format = text();
    else if (k == "system_format")
      u.system_format = text();
    else
      user_error(e.where, ": ", name, " is not a key of Axolotl's user-defined prompt (system_prompt, field_system, ",
                 "field_instruction, field_input, field_output, format, no_input_format, system_format)");
  }
  const std::string w = e.where + ": type";
  format_placeholders(u.format, {{"instruction", ""}, {"input", ""}}, w + ".format");
  format_placeholders(u.no_input_format, {{"instruction", ""}}, w + ".no_input_format");
  format_placeholders(u.system_format, {{"system", ""}}, w + ".system_format");
  r.f.user_defined = u;
}
using DatasetKeys = std::map<std::string, DatasetKey>;

// Where the records are and what shape they have, and which of their fields hold what.
void add_field_keys(DatasetKeys& keys) {
  keys.insert({
      {"path", [](const Entry& e, DatasetRead& r) { r.d.path = get_string(e, "path"); }},
      {"type",
       [](const Entry& e, DatasetRead& r) {
         if (e.node.IsMap()) return read_user_defined_type(e, r);
         r.type_name = e.node.Scalar();
         if (r.mode == TrainMode::kDpo) {  // preference records: their shape (data/preference.h)
           const std::string t = get_string(e, "type");
           if (!find_preference_format(t) && !is_unpaired_format(t))  // (rl: kto reads the unpaired ones)
             bad_value(e, "type",
                       "a preference shape: auto, prompt_pairs (chatml.prompt_pairs), intel (chatml.intel), "
                       "chatml.icr, chatml.argilla, chatml.ultra, chat_template.default, chat_template.argilla or "
                       "conversational; for rl: kto, "
                       "<template>.ultra, .argilla, .argilla_chat or .intel");
           r.d.preference_type = r.type_name;
           return;
         }
         r.d.type = dataset_type(e, r.mode);
         if (r.type_name == "jeopardy") {  // Axolotl's JeopardyPromptTokenizingStrategy.parse_instruction_fields
           r.f.instruction = "question", r.f.input = "category", r.f.output = "answer";
           r.f.output_prefix = "what is ";
         }
       }},
      {"field_prompt", [](const Entry& e, DatasetRead& r) { r.f.prompt = get_string(e, "field_prompt"); }},
      {"field_chosen", [](const Entry& e, DatasetRead& r) { r.f.chosen = get_string(e, "field_chosen"); }},
      {"field_rejected", [](const Entry& e, DatasetRead& r) { r.f.rejected = get_string(e, "field_rejected"); }},
      {"revision",
       [](const Entry& e, DatasetRead& r) { r.d.revision = get_revision(e, "revision"); }},  // of a hub dataset
      // datasets.load_dataset(path, name=..., data_files=...): a config of the dataset card, or chosen files
      {"name", [](const Entry& e, DatasetRead& r) { r.d.name = get_string(e, "name"); }},
      {"subset", [](const Entry& e, DatasetRead& r) { r.d.name = get_string(e, "subset"); }},  // Surogate's
      {"data_files",
       [](const Entry& e, DatasetRead& r) {
         r.d.data_files = get_string_list(e, "data_files");
         if (r.d.data_files.empty()) bad_value(e, "data_files", "a file, a glob or a list of them");
       }},
      {"field", [](const Entry& e, DatasetRead& r) { r.f.text = get_string(e, "field"); }},
      // TRL's PRMConfig settings in an Axolotl stepwise_supervised entry (examples/qwen2/prm.yaml)
      {"step_separator",
       [](const Entry& e, DatasetRead& r) {
         if (!e.node.IsScalar() || e.node.Scalar().empty()) bad_value(e, "step_separator", "a non-empty string");
         r.d.step_separator = e.node.Scalar();
       }},
      {"train_on_last_step_only",
       [](const Entry& e, DatasetRead& r) { r.d.train_on_last_step_only = get_bool(e, "train_on_last_step_only"); }},
      {"max_completion_length",  // (TRL's PRM cut of the completion: empty = none, as the example has it)
       [](const Entry& e, DatasetRead&) {
         if (!is_off(e.node))
           user_error(e.where,
                      ": max_completion_length: cutting a process reward model's completions is not built "
                      "yet; sequence_len bounds each document (leave it empty)");
       }},
      // Axolotl's pretraining_dataset entries name their text column so (streaming.py's text_column)
      {"text_column", [](const Entry& e, DatasetRead& r) { r.f.text = get_string(e, "text_column"); }},
      // A translated LLaMA-Factory config's dataset (cli/llama_factory_config.h): its dataset_info.json entry, the
      // template, cutoff_len and train_on_prompt
      {"llama_factory",
       [](const Entry& e, DatasetRead& r) {
         if (!e.node.IsMap()) bad_value(e, "llama_factory", "a LLaMA-Factory dataset_info.json entry (a mapping)");
         r.f.llama_factory = read_lf_format(yaml_to_json(e.node), e.where);
         if (r.mode != TrainMode::kDpo) r.d.type = DatasetType::kLlamaFactory;
       }},
      {"field_text", [](const Entry& e, DatasetRead& r) { r.f.text = get_string(e, "field_text"); }},
      {"field_instruction",
       [](const Entry& e, DatasetRead& r) { r.f.instruction = get_string(e, "field_instruction"); }},
      {"field_input", [](const Entry& e, DatasetRead& r) { r.f.input = get_string(e, "field_input"); }},
      {"field_output", [](const Entry& e, DatasetRead& r) { r.f.output = get_string(e, "field_output"); }},
      {"field_messages",
       [](const Entry& e, DatasetRead& r) { r.f.messages = r.f.conversations = get_string(e, "field_messages"); }},
      // Surogate's names for the same fields.
      {"text_field", [](const Entry& e, DatasetRead& r) { r.f.text = get_string(e, "text_field"); }},
      {"instruction_field",
       [](const Entry& e, DatasetRead& r) { r.f.instruction = get_string(e, "instruction_field"); }},
      {"input_field", [](const Entry& e, DatasetRead& r) { r.f.input = get_string(e, "input_field"); }},
      {"output_field", [](const Entry& e, DatasetRead& r) { r.f.output = get_string(e, "output_field"); }},
      {"messages_field",
       [](const Entry& e, DatasetRead& r) { r.f.messages = r.f.conversations = get_string(e, "messages_field"); }},
      {"completion_field", [](const Entry& e, DatasetRead& r) { r.f.completion = get_string(e, "completion_field"); }},
  });
}

// Axolotl's / Surogate's `split`, with Hugging Face's slice syntax: NAME[FROM:TO], each bound an integer or a
// percentage, or empty.
void read_split(const Entry& e, DatasetRead& r) {
  r.d.split = get_string(e, "split");
  // Hugging Face's slice syntax: NAME[FROM:TO], each bound an integer or a percentage, or empty.
  if (const size_t open = r.d.split.find('['); open != std::string::npos) {
    const std::string inner = r.d.split.substr(open + 1, r.d.split.size() - open - 2);
    const size_t colon = inner.find(':');
    auto bound_ok = [](const std::string& b) {
      std::string digits = b.substr(b.size() && b[0] == '-' ? 1 : 0);
      if (digits.size() && digits.back() == '%') digits.pop_back();
      return b.empty() ||
             (!digits.empty() && digits.size() <= 12 && digits.find_first_not_of("0123456789") == std::string::npos);
    };
    if (r.d.split.back() != ']' || colon == std::string::npos || open == 0 || !bound_ok(inner.substr(0, colon)) ||
        !bound_ok(inner.substr(colon + 1)))
      bad_value(e, "split", "a split name, optionally sliced as name[from:to] (e.g. train[:20%], train[10:-10])");
    r.d.slice = std::pair{inner.substr(0, colon), inner.substr(colon + 1)};
    r.d.split = r.d.split.substr(0, open);
  }
}

// Slices, system prompts, roles and templates.
void add_shape_keys(DatasetKeys& keys) {
  keys.insert({
      {"samples", [](const Entry& e, DatasetRead& r) { r.d.samples = get_int(e, "samples", 1); }},
      {"split", read_split},
      // Axolotl's ds_type names the file format; soltrain reads it from the file name.
      {"ds_type",
       [](const Entry& e, DatasetRead&) {
         const std::string s = get_string(e, "ds_type");
         if (s != "json" && s != "parquet" && s != "csv")
           bad_value(e, "ds_type", "json, parquet or csv (the format is read from the file name)");
       }},
      {"field_system", [](const Entry& e, DatasetRead& r) { r.f.system = get_string(e, "field_system"); }},
      {"drop_system_message",
       [](const Entry& e, DatasetRead& r) { r.f.drop_system_message = get_bool(e, "drop_system_message"); }},
      {"system_field", [](const Entry& e, DatasetRead& r) { r.f.system = get_string(e, "system_field"); }},  // Surogate
      {"system_prompt_field",
       [](const Entry& e, DatasetRead& r) { r.system_prompt_field = get_string(e, "system_prompt_field"); }},
      {"system_prompt_type",
       [](const Entry& e, DatasetRead& r) {
         r.system_prompt_type = get_string(e, "system_prompt_type");
         if (r.system_prompt_type != "fixed" && r.system_prompt_type != "field")
           bad_value(e, "system_prompt_type", "fixed (system_prompt) or field (system_prompt_field)");
         r.system_prompt_type_where = e.where;
       }},
      {"message_property_mappings",
       [](const Entry& e, DatasetRead& r) {
         if (!e.node.IsMap()) bad_value(e, "message_property_mappings", "a map like {role: from, content: value}");
         for (const auto& kv : e.node) {
           const std::string prop = scalar_text(kv.first);
           const std::string field = get_string({kv.second, where_of(r.file, kv.second)}, "message_property_mappings");
           if (prop == "role") {
             r.f.role = r.f.from = field;
           } else if (prop == "content") {
             r.f.content = r.f.value = field;
           } else if (prop != field) {
             // Other message keys pass to the template under their own names.
             user_error(where_of(r.file, kv.first), ": message_property_mappings: renaming \"", field, "\" to \"", prop,
                        "\" is not built yet (role and content can be renamed; other keys pass as they are)");
           }
         }
       }},
      {"roles_to_train",
       [](const Entry& e, DatasetRead& r) {
         r.roles_to_train = get_string_list(e, "roles_to_train");
         r.roles_to_train_where = e.where;
       }},
      {"train_on_eos",
       [](const Entry& e, DatasetRead& r) {
         const std::string s = get_string(e, "train_on_eos");
         if (s != "turn" && s != "all" && s != "none" && s != "last")
           bad_value(e, "train_on_eos", "turn, all, none or last");
         r.f.train_on_eos = s;
       }},
      {"chat_template",
       [](const Entry& e, DatasetRead& r) {
         const std::string s = get_string(e, "chat_template");
         if (s != "tokenizer_default" && s != "jinja" && !named_chat_template(s))
           user_error(e.where, ": chat_template: \"", s,
                      "\": not a template soltrain has; use tokenizer_default (the model's own), jinja (with "
                      "chat_template_jinja) or one of ",
                      named_chat_template_list());
         r.f.chat_template = s;
         r.chat_template_where = e.where;
       }},
      // Axolotl's dataset-level template text, read with chat_template: jinja (or none)
      {"chat_template_jinja",
       [](const Entry& e, DatasetRead& r) {
         if (!e.node.IsScalar() || e.node.Scalar().empty())
           bad_value(e, "chat_template_jinja", "a Jinja chat template");
         r.f.chat_template_jinja = e.node.Scalar();
         r.chat_template_jinja_where = e.where;
       }},
      {"message_field_role",
       [](const Entry& e, DatasetRead& r) { r.f.role = r.f.from = get_string(e, "message_field_role"); }},
      {"message_field_content",
       [](const Entry& e, DatasetRead& r) { r.f.content = r.f.value = get_string(e, "message_field_content"); }},
      {"system_prompt",
       [](const Entry& e, DatasetRead& r) {
         if (!e.node.IsScalar()) bad_value(e, "system_prompt", "a string");
         r.f.system_prompt = e.node.Scalar();
       }},
      // Axolotl's form: template role → the names it has in the data.
      {"roles",
       [](const Entry& e, DatasetRead& r) {
         if (!e.node.IsMap()) bad_value(e, "roles", "a map like {user: [human], assistant: [gpt]}");
         for (const auto& kv : e.node) {
           const std::string role = scalar_text(kv.first);
           if (role != "user" && role != "assistant" && role != "system" && role != "tool")
             user_error(where_of(r.file, kv.first), ": roles: \"", role, "\" is not a role: expected user, assistant, ",
                        "system or tool");
           for (const std::string& name : get_string_list({kv.second, where_of(r.file, kv.second)}, "roles." + role))
             r.f.roles[name] = role;
         }
       }},
  });
}

const DatasetKeys& dataset_keys() {
  static const DatasetKeys keys = [] {
    DatasetKeys k;
    add_field_keys(k);
    add_shape_keys(k);
    return k;
  }();
  return keys;
}

// The keys whose meaning depends on others; each problem joins `errors`.
void resolve_dependent_keys(DatasetRead& r, const std::map<std::string, std::string>& seen,
                            std::vector<std::string>& errors) {
  DatasetFields& f = r.f;
  // Surogate: system_prompt_type: field takes each record's system_prompt_field (no system message where it
  // is missing); otherwise the fixed system_prompt applies and system_prompt_field is unused.
  if (r.system_prompt_type == "field") {
    if (r.system_prompt_field.empty())
      errors.push_back(cat(r.system_prompt_type_where, ": system_prompt_type: field needs system_prompt_field"));
    f.system = r.system_prompt_field;
    f.system_prompt.clear();
  }
  // chat_template: jinja and chat_template_jinja come together (Axolotl's extract_chat_template_args reads a dataset's
  // text only with its chat_template, and silently uses the top-level choice without: refused here)
  if (!f.chat_template_jinja.empty()) {
    if (f.chat_template != "jinja")
      errors.push_back(cat(r.chat_template_jinja_where, ": chat_template_jinja is read with the dataset's ",
                           "chat_template: jinja",
                           f.chat_template.empty() ? "" : ", not chat_template: ", f.chat_template));
    try {
      ChatTemplate check(f.chat_template_jinja);
    } catch (const std::exception& e) {
      errors.push_back(
          cat(r.chat_template_jinja_where, ": chat_template_jinja is not a template soltrain can render: ", e.what()));
    }
  } else if (f.chat_template == "jinja") {
    errors.push_back(cat(r.chat_template_where, ": chat_template: jinja needs chat_template_jinja (the template)"));
  }
  if ((r.d.step_separator || r.d.train_on_last_step_only) && r.d.type != DatasetType::kStepwiseSupervised)
    errors.push_back(cat(r.file, ": step_separator / train_on_last_step_only in a dataset are a stepwise_supervised ",
                         "dataset's (a process reward model's)"));
  // Axolotl's chat_template reads a record's "system" column as its system message unless told another
  // field (ChatTemplatePrompter field_system="system", prompt_strategies/chat_template.py).
  if ((r.type_name == "chat_template" || r.type_name == "chat_template.default") && !seen.count("field_system"))
    f.system = "system";
  // Axolotl maps the names through `roles` (human -> user) before comparing with the turns' roles.
  if (!r.roles_to_train_where.empty()) {
    f.roles_to_train.clear();
    for (const std::string& name : r.roles_to_train) {
      const auto it = f.roles.find(name);
      const std::string role = it == f.roles.end() ? name : it->second;
      if (role != "user" && role != "assistant" && role != "system" && role != "tool")
        errors.push_back(cat(r.roles_to_train_where, ": roles_to_train: \"", name,
                             "\" is not a role: expected user, assistant, system or tool"));
      f.roles_to_train.push_back(role);
    }
  }
}

}  // namespace

std::vector<std::string> dataset_key_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : dataset_keys()) names.push_back(k);
  return names;
}

DatasetSpec parse_dataset(const YAML::Node& n, const std::string& where, const std::string& file, TrainMode mode) {
  DatasetRead r(mode, file);
  if (n.IsScalar()) {  // a bare path
    r.d.path = n.Scalar();
    return std::move(r.d);
  }
  if (!n.IsMap()) user_error(where, ": a dataset is a path or a map with at least `path`");
  const DatasetKeys& keys = dataset_keys();
  std::map<std::string, std::string> seen;  // key -> where, for repeated keys
  // Every problem of the dataset, as for the top-level keys.
  std::vector<std::string> errors;
  for (const auto& kv : n) {
    const std::string key = scalar_text(kv.first);
    try {
      if (seen.count(key))
        user_error(where_of(file, kv.first), ": dataset key \"", key, "\" appears twice (also at ", seen[key],
                   "); keep one");
      seen[key] = where_of(file, kv.first);
      const auto it = keys.find(key);
      if (it == keys.end()) unknown_key(where_of(file, kv.first), key, dataset_key_names(), "dataset key");
      it->second({kv.second, where_of(file, kv.second)}, r);
    } catch (const UserError& e) {
      errors.push_back(e.what());
    }
  }
  if (r.d.path.empty() && !seen.count("path")) errors.push_back(cat(where, ": a dataset needs `path`"));
  resolve_dependent_keys(r, seen, errors);
  if (!errors.empty()) throw DatasetErrors(errors);
  return std::move(r.d);
}

std::vector<DatasetSpec> parse_datasets(const Entry& e, const std::string& key, const std::string& file, TrainMode mode,
                                        const fs::path& base) {
  std::vector<DatasetSpec> out;
  if (e.node.IsScalar() || e.node.IsMap())
    out.push_back(parse_dataset(e.node, e.where, file, mode));
  else if (!e.node.IsSequence())
    bad_value(e, key, "a list of datasets");
  std::vector<std::string> errors;
  for (const YAML::Node& n : e.node.IsSequence() ? e.node : YAML::Node()) try {
      out.push_back(parse_dataset(n, where_of(file, n), file, mode));
    } catch (const DatasetErrors& d) {
      errors.insert(errors.end(), d.all.begin(), d.all.end());
    } catch (const UserError& u) {
      errors.push_back(u.what());
    }
  if (!errors.empty()) throw DatasetErrors(errors);
  // Relative dataset paths are relative to the config file, so a config works from any directory. An
  // `org/name` that is not a local file is a hub dataset.
  for (DatasetSpec& d : out) {
    std::error_code ec;
    if (looks_like_hub_id(d.path.string()) && !fs::exists(base / d.path, ec) && !fs::exists(d.path, ec))
      d.hub_id = d.path.string();
    else if (d.path.is_relative() && !base.empty())
      d.path = (base / d.path).lexically_normal();
  }
  return out;
}

}  // namespace soltrain
