#include "cli/peer_sharding.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/config_values.h"
#include "cli/peer_keys.h"
#include "core/error.h"
#include "core/format.h"
#include "io/input_file.h"

namespace soltrain {

namespace {

namespace fs = std::filesystem;
using PeerSharding = TrainConfig::PeerSharding;

std::string scalar(const YAML::Node& n) {
  return n.IsScalar() ? n.Scalar() : std::string();
}
std::string upper(std::string s) {
  for (char& ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}
void asked(PeerSharding& p, const std::string& key) {
  if (std::find(p.keys.begin(), p.keys.end(), key) == p.keys.end()) p.keys.push_back(key);
}
void say(PeerSharding& p, const std::string& what) {
  if (std::find(p.said.begin(), p.said.end(), what) == p.said.end()) p.said.push_back(what);
}

// torch FSDP's ShardingStrategy by name or number: FULL_SHARD shards parameters, gradients and optimizer state
// (ZeRO-3), SHARD_GRAD_OP gradients and optimizer state (ZeRO-2), NO_SHARD nothing (plain data parallel); the
// hybrid forms shard within a node, all of soltrain's ranks.
int sharding_stage(const std::string& key, const std::string& v) {
  static const std::map<std::string, int> stages = {{"FULL_SHARD", 3},
                                                    {"1", 3},
                                                    {"SHARD_GRAD_OP", 2},
                                                    {"2", 2},
                                                    {"NO_SHARD", 0},
                                                    {"3", 0},
                                                    {"HYBRID_SHARD", 3},
                                                    {"4", 3},
                                                    {"_HYBRID_SHARD_ZERO2", 2},
                                                    {"HYBRID_SHARD_ZERO2", 2},
                                                    {"5", 2}};
  const auto it = stages.find(upper(v));
  if (it == stages.end())
    user_error(key, ": \"", v,
               "\" is not valid: expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or _HYBRID_SHARD_ZERO2");
  return it->second;
}

// One DeepSpeed JSON: zero_optimization's stage and offloads; its optimizer / scheduler only with "auto" values
// (what HF fills in from the config); batch settings given as numbers are checked against the config's later.
void read_deepspeed_json(const nlohmann::json& j, const std::string& key, const std::string& source, PeerSharding& p) {
  auto fail = [&](const std::string& what) { user_error(key, ": ", source, ": ", what); };
  if (!j.is_object()) fail("expected a JSON object (DeepSpeed's config)");
  const nlohmann::json zero = j.value("zero_optimization", nlohmann::json::object());
  if (!zero.is_object()) fail("zero_optimization is not an object");
  if (zero.contains("stage")) {
    const nlohmann::json& s = zero["stage"];
    if (!s.is_number_integer() || s.get<int>() < 0 || s.get<int>() > 3)
      fail(cat("zero_optimization.stage ", s.dump(), " is not valid: expected 0, 1, 2 or 3"));
    p.stage = s.get<int>();
    say(p, cat("ZeRO-", p.stage));
  } else {
    p.stage = 0;
  }
  for (const char* what : {"offload_optimizer", "offload_param"}) {
    if (!zero.contains(what) || zero[what].is_null()) continue;
    const std::string device = zero[what].is_object() ? zero[what].value("device", std::string("none")) : "?";
    if (device == "none") continue;
    if (device == "nvme") fail(cat("zero_optimization.", what, ".device nvme: NVMe offload is not built (use cpu)"));
    if (device != "cpu") fail(cat("zero_optimization.", what, ".device \"", device, "\": expected cpu or none"));
    (std::string(what) == "offload_param" ? p.offload_params : p.offload_optimizer) = true;
    say(p, what);
  }
  auto on = [&](const char* block) {
    if (!j.contains(block) || !j[block].is_object()) return false;
    const nlohmann::json& e = j[block].value("enabled", nlohmann::json(false));
    return e == true || e == "true";
  };
  if (on("fp16")) fail("fp16.enabled: fp16 training is not supported; soltrain computes in bf16 (bf16: true)");
  for (const char* block : {"optimizer", "scheduler"}) {
    if (!j.contains(block)) continue;
    const nlohmann::json params = j[block].value("params", nlohmann::json::object());
    for (const auto& [name, v] : params.items())
      if (v != "auto")
        fail(cat(block, ".params.", name, " is ", v.dump(),
                 ": soltrain takes the optimizer and schedule from the config (set them there; \"auto\" here)"));
    const std::string type = j[block].value("type", std::string());
    if (std::string(block) == "optimizer" && !type.empty() && upper(type) != "ADAMW" && upper(type) != "ADAM")
      fail(cat("optimizer.type ", type, ": soltrain's optimizer is the config's (AdamW); drop the block"));
  }
  for (const char* name :
       {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping"})
    if (j.contains(name) && j[name].is_number()) p.fixed.emplace_back(name, j[name].get<double>());
  p.source = source;
}

// Axolotl's deepspeed_configs/*.json as it ships them (axolotl fetch deepspeed_configs): what each sets that
// soltrain reads, for a config that names one which is not in the working folder.
const nlohmann::json* axolotl_deepspeed(const std::string& path) {
  static const std::map<std::string, nlohmann::json> known = [] {
    auto stage = [](int s) { return nlohmann::json{{"zero_optimization", {{"stage", s}}}}; };
    nlohmann::json params = stage(3), all = stage(3);
    params["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
    all["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
    all["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    return std::map<std::string, nlohmann::json>{{"zero1.json", stage(1)},
                                                 {"zero1_torch_compile.json", stage(1)},
                                                 {"zero2.json", stage(2)},
                                                 {"zero2_torch_compile.json", stage(2)},
                                                 {"zero3.json", stage(3)},
                                                 {"zero3_bf16.json", stage(3)},
                                                 {"zero3_cpuoffload.json", all},
                                                 {"zero3_bf16_cpuoffload_all.json", all},
                                                 {"zero3_bf16_cpuoffload_params.json", params}};
  }();
  const fs::path p(path);
  if (p.parent_path().filename() != "deepspeed_configs") return nullptr;
  const auto it = known.find(p.filename().string());
  return it == known.end() ? nullptr : &it->second;
}

}  // namespace

void read_fsdp(const std::string& key, const YAML::Node& n, TrainConfig& c) {
  if (is_off(n)) return;
  // HF TrainingArguments' fsdp: a list of options, or one string of them separated by spaces
  std::vector<std::string> options;
  if (n.IsSequence()) {
    for (const YAML::Node& o : n) options.push_back(scalar(o));
  } else {
    std::string s = scalar(n), word;
    for (char ch : s + " ")
      if (ch == ' ' || ch == ',') {
        if (!word.empty()) options.push_back(word);
        word.clear();
      } else {
        word += ch;
      }
  }
  PeerSharding& p = c.peer_sharding;
  for (const std::string& o : options) {
    const std::string u = upper(o);
    if (u == "AUTO_WRAP") continue;  // soltrain shards and gathers layer by layer anyway
    if (u == "OFFLOAD") {            // parameters, gradients and the optimizer's step in host memory
      p.offload_params = p.offload_optimizer = true;
      say(p, "offload");
      continue;
    }
    if (u == "TRUE") {  // (Axolotl: `fsdp: true` with fsdp_config saying how)
      if (p.stage < 0) p.stage = 3;
      continue;
    }
    p.stage = sharding_stage(key, u);
    say(p, u);
  }
  asked(p, key);
}

void read_fsdp_config(const std::string& key, const YAML::Node& n, TrainConfig& c) {
  if (is_off(n)) return;
  if (!n.IsMap()) user_error(key, ": expected a mapping of FSDP settings (fsdp_sharding_strategy: FULL_SHARD, ...)");
  PeerSharding& p = c.peer_sharding;
  // What changes nothing soltrain computes or saves: wrapping (soltrain's unit is the decoder layer), prefetch,
  // loading on one rank, the state dict's form (soltrain writes whole HF checkpoints), torch's parameter views.
  static const char* accepted[] = {"auto_wrap_policy",
                                   "transformer_layer_cls_to_wrap",
                                   "min_num_params",
                                   "state_dict_type",
                                   "sync_module_states",
                                   "use_orig_params",
                                   "cpu_ram_efficient_loading",
                                   "limit_all_gathers",
                                   "backward_prefetch",
                                   "backward_prefetch_policy",
                                   "forward_prefetch",
                                   "version",
                                   "cpu_offload_pin_memory",
                                   "activation_cpu_offload"};
  for (const auto& kv : n) {
    const std::string full = kv.first.Scalar(), name = full.rfind("fsdp_", 0) == 0 ? full.substr(5) : full;
    const YAML::Node& v = kv.second;
    const std::string at = cat(key, ".", full);
    if (name == "sharding_strategy") {
      p.stage = sharding_stage(at, scalar(v));
      say(p, upper(scalar(v)));
    } else if (name == "reshard_after_forward") {  // FSDP2: parameters freed after forward = ZeRO-3
      p.stage = as_bool(at, v) ? 3 : 2;
      say(p, cat("reshard_after_forward: ", p.stage == 3 ? "true" : "false"));
    } else if (name == "offload_params") {
      if (as_bool(at, v)) p.offload_params = p.offload_optimizer = true, say(p, "offload_params");
    } else if (name == "activation_checkpointing") {
      if (as_bool(at, v)) c.recompute = Recompute::Full;
    } else if (std::find_if(std::begin(accepted), std::end(accepted), [&](const char* a) { return name == a; }) ==
               std::end(accepted)) {
      user_error(at,
                 ": not an FSDP setting soltrain knows (it reads sharding_strategy, reshard_after_forward, "
                 "offload_params, activation_checkpointing)");
    }
  }
  if (p.stage < 0) p.stage = 3;  // FSDP's default strategy: FULL_SHARD
  asked(p, key);
}

void read_fsdp_version(const std::string& key, const YAML::Node& n, TrainConfig& c) {
  if (is_off(n)) return;
  const std::string v = scalar(n);
  if (v != "1" && v != "2") user_error(key, ": \"", v, "\" is not valid: expected 1 or 2");
  asked(c.peer_sharding, key);
}

void read_deepspeed(const std::string& key, const YAML::Node& n, TrainConfig& c) {
  if (is_off(n)) return;
  PeerSharding& p = c.peer_sharding;
  if (n.IsMap()) {  // the JSON inline, as TrainingArguments takes a dict
    read_deepspeed_json(yaml_to_json(n), key, "inline", p);
  } else {
    const std::string path = scalar(n);
    std::error_code ec;
    if (fs::exists(path, ec)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(read_input_file(path, "a DeepSpeed config"));
      } catch (const nlohmann::json::parse_error& err) {
        user_error(key, ": ", path, ": not valid JSON (", err.what(), ")");
      }
      read_deepspeed_json(j, key, path, p);
    } else if (const nlohmann::json* known = axolotl_deepspeed(path)) {
      read_deepspeed_json(*known, key, path + " (Axolotl's, as it ships it)", p);
    } else {
      user_error(key, ": ", path,
                 ": no such file (soltrain reads its zero_optimization stage and offloads; paths open from the "
                 "working folder)");
    }
  }
  asked(p, key);
}

void apply_peer_sharding(TrainConfig& c, bool explicit_stage, const std::string& stage_where,
                         std::vector<std::string>& errors) {
  const PeerSharding& p = c.peer_sharding;
  if (p.keys.empty()) return;
  std::string keys;
  for (const std::string& k : p.keys) keys += (keys.empty() ? "" : ", ") + k;
  const int stage = std::max(p.stage, 0);
  if (explicit_stage && c.zero_stage != stage)
    errors.push_back(cat(stage_where, ": zero_stage ", c.zero_stage, " differs from the ZeRO-", stage, " that ", keys,
                         " ask", p.keys.size() > 1 ? "" : "s", " for: keep one of them"));
  c.zero_stage = stage;
  for (const auto& [name, v] : p.fixed) {
    const double want = name == "train_micro_batch_size_per_gpu" ? double(c.per_device_train_batch_size)
                        : name == "gradient_accumulation_steps"  ? double(c.gradient_accumulation_steps)
                        : name == "gradient_clipping"            ? c.max_grad_norm
                                                                 : double(c.per_device_train_batch_size) *
                                                            double(c.gradient_accumulation_steps) * double(c.gpus);
    if (std::abs(v - want) > 1e-9 * std::max(1.0, std::abs(want)))
      errors.push_back(cat(p.source, ": ", name, " ", v, " differs from the config's ", want,
                           " (micro_batch_size, gradient_accumulation_steps, gpus, max_grad_norm): set \"auto\" "
                           "there or make them agree"));
  }
  // FSDP's offload_params keeps parameters, gradients and the optimizer's step in host memory (read as both
  // below); DeepSpeed's offload_param the parameters, offload_optimizer the optimizer state. soltrain's switches
  // for the same: the fp32 masters and the moments, and a LoRA run's frozen bf16 base streamed from host memory
  // (a quantised base stays on the device, as soltrain streams only bf16 ones).
  std::vector<std::string> offloads;
  if (p.offload_params) c.offload.master = true, offloads.push_back("offload_master");
  if (p.offload_optimizer) c.offload.optimizer = true, offloads.push_back("offload_optimizer");
  if (p.offload_params && c.lora.enabled && c.lora.base == WeightFormat::Dense && !c.fp8_hybrid)
    c.offload_weights = true, offloads.push_back("offload_weights");
  std::string said;
  for (const std::string& s : p.said) said += (said.empty() ? "" : ", ") + s;
  std::string offload_text;
  for (const std::string& o : offloads) offload_text += (offload_text.empty() ? "" : ", ") + o + ": true";
  c.notes.push_back(cat(keys, said.empty() ? "" : cat(" (", said, ")"), " run as zero_stage: ", stage,
                        offload_text.empty() ? "" : cat(", ", offload_text),
                        c.gpus > 1 ? cat(" over the ", c.gpus, " ranks of gpus: ", c.gpus)
                                   : " (the ranks are soltrain's own: gpus: N or mpirun; one rank shards nothing)"));
}

}  // namespace soltrain
