// The peer-key table. Three kinds of row: a rename (the value sets a soltrain setting), an accepted setting
// (its value is empty, false, or what soltrain does anyway: saying nothing is right), and a missing feature
// (any other value is refused with a line naming the feature, so a run never silently differs from what the
// user's config asked for).
#include "cli/peer_keys.h"

#include <functional>
#include <map>

#include "core/error.h"

namespace soltrain {

namespace {

std::string text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

// Empty, null or false: "this feature is off", which is soltrain's behaviour for every feature it lacks.
bool is_off(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return true;
  if (n.IsSequence() || n.IsMap()) return n.size() == 0;
  const std::string& s = n.Scalar();
  return s.empty() || s == "false" || s == "False" || s == "null" || s == "~" || s == "none" || s == "None";
}

bool as_bool(const std::string& key, const YAML::Node& n) {
  if (n.IsScalar()) try {
      return n.as<bool>();
    } catch (const YAML::Exception&) {
    }
  user_error(key, ": \"", text(n), "\" is not valid: expected true or false");
}

double as_positive(const std::string& key, const YAML::Node& n) {
  double v = 0;
  if (n.IsScalar()) try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
    }
  if (!(v > 0 && v <= 1e6)) user_error(key, ": \"", text(n), "\" is not valid: expected a number > 0");
  return v;
}

using Apply = std::function<void(const std::string&, const YAML::Node&, TrainConfig&)>;

// Accepted with any value: the setting picks something soltrain has no choice about (attention kernel,
// tf32, logging integrations, compile flags) and the run is the same either way.
Apply any() {
  return [](const std::string&, const YAML::Node&, TrainConfig&) {};
}

// Accepted when off; otherwise refused with `feature` (which says what to use instead).
Apply off_or(const std::string& feature) {
  return [feature](const std::string& key, const YAML::Node& n, TrainConfig&) {
    if (!is_off(n)) user_error(key, ": ", feature);
  };
}

// Accepted when one of `ok` (or empty); otherwise refused with `feature`.
Apply one_of(std::vector<std::string> ok, const std::string& feature) {
  return [ok, feature](const std::string& key, const YAML::Node& n, TrainConfig&) {
    if (!n.IsDefined() || n.IsNull()) return;
    const std::string s = text(n);
    for (const std::string& o : ok)
      if (s == o) return;
    user_error(key, ": \"", s, "\": ", feature);
  };
}

const std::string kMultiGpu = "not supported; soltrain runs multi-GPU itself (gpus: N or mpirun, zero_stage)";

const std::map<std::string, Apply>& table() {
  static const std::map<std::string, Apply> t = {
      // Renames.
      {"gradient_checkpointing",  // Axolotl; "unsloth" is its offloaded variant, the same recompute here
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         const bool on = n.IsScalar() && n.Scalar() == "unsloth" ? true : as_bool(k, n);
         c.recompute = on ? Recompute::Full : Recompute::None;
       }},
      {"lora_target_linear",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) c.lora.target_modules = all_lora_module_names();
       }},
      {"optimizer",  // HF Trainer's names: the fp32 AdamW ones, and bitsandbytes' 8-bit AdamW
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         const std::string s = text(n);
         for (const char* o : {"adamw_torch", "adamw_torch_fused", "adamw", "adamw_hf"})
           if (s == o) return void(c.moments = Moments::F32);
         for (const char* o : {"adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit"})
           if (s == o) return void(c.moments = Moments::Blockwise8);
         user_error(k, ": \"", s,
                    "\": not supported; soltrain trains with AdamW: use optimizer: adamw_torch "
                    "(fp32 moments) or adamw_8bit");
       }},
      {"recipe", one_of({"bf16"}, "not built yet (FP8/FP4 training); use recipe: bf16")},
      {"saves_per_epoch",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) { c.saves_per_epoch = as_positive(k, n); }},
      {"evals_per_epoch",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) { c.evals_per_epoch = as_positive(k, n); }},
      // What soltrain does anyway.
      {"flash_attention", any()},                // soltrain's attention is a flash (tiled, online-softmax) kernel
      {"attn_implementation", any()},            // transformers' attention backend: the same choice
      {"gradient_checkpointing_kwargs", any()},  // torch's use_reentrant: recompute is the same either way
      {"sdp_attention", any()},
      {"xformers_attention", any()},
      {"fused_attn_kernel", any()},
      {"use_fused_rope", any()},
      {"cut_cross_entropy", any()},  // soltrain never materialises the full logits either
      {"torch_compile", any()},
      {"use_cuda_graphs", any()},
      {"tf32", any()},  // matmuls are bf16 on GPU; tf32 would only touch fp32 matmuls soltrain does not run
      {"strict", any()},
      {"debug", any()},
      {"local_rank", any()},
      {"run_name", any()},
      {"report_to", any()},
      {"use_tensorboard", any()},  // metrics.jsonl and training_curves.svg are always written
      {"eval_sample_packing", any()},
      {"pad_to_sequence_len", any()},  // batches are always sequence_len wide
      {"dataset_processes", any()},
      {"dataset_num_proc", any()},
      {"shuffle_merged_datasets", any()},
      {"eval_batch_size", any()},
      {"per_device_eval_batch_size", any()},
      {"eval_table_size", any()},
      {"eval_max_new_tokens", any()},
      {"trust_remote_code", any()},
      {"tokenizer_type", any()},
      {"model_type", any()},
      {"is_llama_derived_model", any()},
      {"is_qwen_derived_model", any()},
      {"is_mistral_derived_model", any()},
      {"auto_resume_from_checkpoints", any()},
      {"apply_recommended_values", any()},
      {"dataloader_num_workers", any()},
      {"merge_adapter", off_or("merging is a separate step: `soltrain merge` after training")},
      {"special_tokens",  // kept to be compared with the tokenizer's when the data is prepared
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (!n.IsDefined() || n.IsNull()) return;
         if (!n.IsMap()) user_error(k, ": \"", text(n), "\" is not valid: expected a map like {eos_token: ...}");
         for (const auto& kv : n) {
           if (!kv.second.IsScalar()) user_error(k, ".", text(kv.first), ": expected a token (a string)");
           c.special_tokens[text(kv.first)] = kv.second.Scalar();
         }
       }},
      {"bf16", one_of({"true", "True", "auto"},
                      "soltrain computes in bf16 with fp32 masters; fp32-only training "
                      "is not offered (use bf16: true)")},
      {"recompute_full", any()},
      {"save_safetensors", one_of({"true", "True"}, "soltrain writes safetensors only (use save_safetensors: true)")},
      {"chat_template",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (!n.IsDefined() || n.IsNull()) return;
         const std::string s = text(n);
         if (s != "tokenizer_default" && s != "chatml")
           user_error(k, ": \"", s,
                      "\": named templates other than chatml (llama3, qwen3, ...) are not built yet; soltrain renders "
                      "with the model's own template (chat_template: tokenizer_default)");
         c.chat_template = s;
       }},
      {"zero_level",
       one_of({"1"}, "Surogate's ZeRO levels are not read; soltrain's is zero_stage: 0-2 (DeepSpeed's meaning)")},
      // Features soltrain lacks: accepted when off.
      {"deepspeed", off_or(kMultiGpu)},
      {"fsdp", off_or(kMultiGpu)},
      {"fsdp_config", off_or(kMultiGpu)},
      {"fsdp_version", off_or(kMultiGpu)},
      {"load_in_4bit",  // transformers' BitsAndBytesConfig: NF4 is what QLoRA configs ask for
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) set_quantised_base(c, WeightFormat::Nf4, k);
       }},
      {"load_in_8bit",
       off_or("8-bit (LLM.int8) base weights are not built; use load_in_4bit: true (NF4) or qlora_fp8: true")},
      {"gptq", off_or("GPTQ-quantised base weights are not supported")},
      {"fp16", off_or("fp16 training is not supported; soltrain computes in bf16 (bf16: true)")},
      {"fp8", off_or("FP8 training is not built yet; drop it for bf16")},
      {"peft_use_dora", off_or("DoRA adapters are not built yet; drop it for plain LoRA")},
      {"lora_model_dir", off_or("continuing from an existing LoRA adapter is not built yet")},
      {"lora_modules_to_save", off_or("training full modules next to LoRA is not built yet")},
      {"lora_fan_in_fan_out", off_or("fan-in/fan-out (Conv1D) weights are not in the models soltrain loads")},
      {"lora_on_cpu", off_or("LoRA on the CPU next to a GPU run is not supported; use device: cpu for a CPU run")},
      {"early_stopping_patience",
       off_or("early stopping is not built yet; loss_watchdog_threshold stops a diverging run")},
      {"neftune_noise_alpha", off_or("NEFTune noise is not built yet")},
      {"s2_attention", off_or("shifted-sparse attention is not built yet")},
      {"group_by_length", off_or("length-grouped batches are not built; sample_packing fills batches instead")},
      {"hub_model_id", off_or("pushing to the Hugging Face hub is not built; upload output_dir yourself")},
      {"hub_strategy", off_or("pushing to the Hugging Face hub is not built; upload output_dir yourself")},
      {"push_dataset_to_hub", off_or("pushing to the Hugging Face hub is not built")},
      {"plugins", off_or("Axolotl plugins are not supported")},
      {"unfrozen_parameters", off_or("training a chosen subset of weights is not built yet")},
      {"checkpoint_dir", off_or("checkpoints are written into output_dir; drop checkpoint_dir")},
      {"from_scratch", off_or("training from random weights is not built yet")},
      {"offload_master", off_or("offloading to host memory is not built yet")},
      {"offload_optimizer", off_or("offloading to host memory is not built yet")},
      {"offload_residual", off_or("offloading to host memory is not built yet")},
      {"offload_grads", off_or("offloading to host memory is not built yet")},
      {"qlora",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) set_quantised_base(c, WeightFormat::Nf4, k);
       }},
  };
  return t;
}

// Whole families whose settings never change the training: logging integrations, and Liger's fused kernels
// (soltrain fuses its own).
bool is_logging_family(const std::string& key) {
  for (const char* p : {"wandb_", "mlflow_", "comet_", "swanlab_", "liger_"})
    if (key.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace

void set_quantised_base(TrainConfig& c, WeightFormat f, const std::string& key, const std::string& where) {
  if (c.lora.base != WeightFormat::Dense && c.lora.base != f)
    user_error(where, where.empty() ? "" : ": ", key, " asks for a ", weight_format_name(f), " base but ",
               c.lora.base_key, " for ", weight_format_name(c.lora.base), "; keep one");
  c.lora.base = f;
  c.lora.base_key = key;
}

bool apply_peer_key(const std::string& key, const YAML::Node& value, TrainConfig& c) {
  if (is_logging_family(key)) return true;
  const auto it = table().find(key);
  if (it == table().end()) return false;
  it->second(key, value, c);
  return true;
}

std::vector<std::string> peer_key_names() {
  std::vector<std::string> out;
  for (const auto& [k, v] : table()) out.push_back(k);
  return out;
}

}  // namespace soltrain
