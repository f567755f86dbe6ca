// The peer-key table. Three kinds of row: a rename (the value sets a soltrain setting), an accepted setting
// (its value is empty, false, or what soltrain does anyway: saying nothing is right), and a missing feature
// (any other value is refused with a line naming the feature, so a run never silently differs from what the
// user's config asked for).
#include "cli/peer_keys.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>

#include "cli/peer_sharding.h"
#include "core/error.h"

namespace soltrain {

namespace {
std::string text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

}  // namespace

// Empty, null or false: "this feature is off", which is soltrain's behaviour for every feature it lacks.
bool is_off(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return true;
  if (n.IsSequence() || n.IsMap()) return n.size() == 0;
  const std::string& s = n.Scalar();
  return s.empty() || s == "false" || s == "False" || s == "null" || s == "~" || s == "none" || s == "None";
}

// An empty value (`merge_adapter:`) is off, as it is for Axolotl's and Surogate's readers.
bool as_bool(const std::string& key, const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull() || (n.IsScalar() && n.Scalar().empty())) return false;
  if (n.IsScalar()) try {
      return n.as<bool>();
    } catch (const YAML::Exception&) {
    }
  user_error(key, ": \"", text(n), "\" is not valid: expected true or false");
}

namespace {

using Apply = std::function<void(const std::string&, const YAML::Node&, TrainConfig&)>;

// Accepted with any value: the setting picks something soltrain has no choice about (attention kernel,
// tf32, logging integrations, compile flags) and the run is the same either way.
Apply any() {
  return [](const std::string&, const YAML::Node&, TrainConfig&) {};
}

// Accepted with any value but an empty one, which is said in a note (`what`: why it changes nothing).
Apply noted(const std::string& what) {
  return [what](const std::string& key, const YAML::Node& n, TrainConfig& c) {
    if (!n.IsNull() && !(n.IsScalar() && n.Scalar().empty())) c.notes.push_back(cat(key, ": ", what));
  };
}

// Accepted when true or empty; false is refused with `feature` (what is not built and what soltrain does instead).
Apply true_or(const std::string& feature) {
  return [feature](const std::string& key, const YAML::Node& n, TrainConfig&) {
    if (n.IsNull() || (n.IsScalar() && n.Scalar().empty()) || as_bool(key, n)) return;
    user_error(key, ": false: ", feature);
  };
}

// An integer in [lo, hi], else one line naming `key` and what was `expected`.
long integer_in(const std::string& key, const YAML::Node& n, long lo, long hi, const std::string& expected) {
  const std::string v = text(n);
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < lo || x > hi) user_error(key, ": \"", v, "\" is not valid: expected ", expected);
  return x;
}
// Accepted when off; otherwise refused with `feature` (which says what to use instead).
Apply off_or(const std::string& feature) {
  return [feature](const std::string& key, const YAML::Node& n, TrainConfig&) {
    if (!is_off(n)) user_error(key, ": ", feature);
  };
}

// Accepted when the number `value` (or empty); otherwise refused with `feature`.
Apply at_or(double value, const std::string& feature) {
  return [value, feature](const std::string& key, const YAML::Node& n, TrainConfig&) {
    if (!n.IsDefined() || n.IsNull()) return;
    const std::string s = n.IsScalar() ? text(n) : "";
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (s.empty() || *end || x != value) user_error(key, ": ", feature);
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

using Table = std::map<std::string, Apply>;

// Renames: the value sets a soltrain setting.
void add_renames(Table& t) {
  t.insert({
      // Renames.
      // Axolotl: the checkpointed activations in host memory (it requires gradient_checkpointing): soltrain's
      // offload_activations with recompute full; "disk" is not built.
      {"activation_offloading",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         const std::string v = n.IsScalar() ? n.Scalar() : "";
         if (is_off(n)) return;
         if (v == "disk") user_error(k, ": \"disk\": offloading activations to disk is not built; use true");
         if (v != "legacy" && v != "hidden_states" && !as_bool(k, n)) return;
         c.recompute = Recompute::Full;
         c.offload_activations = true;
       }},
      // HF's save_strategy: steps (save_steps / saves_per_epoch decide), epoch (one a epoch), no (only the end)
      {"save_strategy",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         const std::string v = n.IsScalar() ? n.Scalar() : "";
         if (is_off(n) || v == "steps") return;
         if (v == "epoch") {
           if (c.save_steps == 0 && c.saves_per_epoch == 0) c.saves_per_epoch = 1;
         } else if (v == "no") {
           c.save_steps = 0, c.saves_per_epoch = 0;
         } else {
           user_error(k, ": \"", text(n),
                      "\": soltrain saves by steps, epoch or no (keeping the best checkpoint by a "
                      "metric is not built yet)");
         }
       }},
      {"gradient_checkpointing",  // Axolotl; "unsloth" and "offload" keep the checkpoints in host memory
       // there, as offload_activations does here (the same recompute, the same results)
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         const bool host = n.IsScalar() && (n.Scalar() == "unsloth" || n.Scalar() == "offload");
         const bool on = host || as_bool(k, n);
         c.recompute = on ? Recompute::Full : Recompute::None;
         if (host) c.offload_activations = true;  // (activation_offloading may have asked already)
       }},
      {"lora_target_linear",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) {
           c.lora.target_modules = all_lora_module_names();
           c.lora.all_linear = true;
         }
       }},
      // Axolotl: documents in the datasets' order every epoch instead of shuffled.
      {"curriculum_sampling",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) { c.shuffle = !as_bool(k, n); }},
      {"plugins",  // Axolotl plugins: those whose work soltrain does itself are accepted
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n)) return;
         if (!n.IsSequence()) user_error(k, ": \"", text(n), "\" is not valid: expected a list of plugin classes");
         for (const YAML::Node& p : n) {
           const std::string name = text(p);
           // Cut Cross Entropy: soltrain's loss never materialises the full logits either; Liger: fused
           // kernels (norms, SwiGLU, RoPE, loss) that soltrain has its own of.
           if (name == "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin" ||
               name == "axolotl.integrations.liger.LigerPlugin")
             continue;
           // SwanLab: its swanlab_* settings and use_swanlab go to the trackers' bridge (train/trackers.h)
           if (name == "axolotl.integrations.swanlab.SwanLabPlugin") {
             c.trackers.swanlab_plugin = true;
             continue;
           }
           user_error(k, ": \"", name, "\": Axolotl plugins are not supported");
         }
       }},
  });
}

// Accepted: settings that pick what soltrain does anyway, or whose value changes nothing.
void add_accepted(Table& t) {
  t.insert({
      // What soltrain does anyway.
      {"flash_attention", any()},                // soltrain's attention is a flash (tiled, online-softmax) kernel
      {"attn_implementation", any()},            // transformers' attention backend: the same choice
      {"gradient_checkpointing_kwargs", any()},  // torch's use_reentrant: recompute is the same either way
      {"sdp_attention", any()},
      {"xformers_attention", any()},
      {"fused_attn_kernel", any()},
      // Axolotl's Triton LoRA kernels (MLP, QKV, O): soltrain's LoRA layers are its own fused code, same math.
      {"lora_mlp_kernel", any()},
      {"lora_qkv_kernel", any()},
      {"lora_o_kernel", any()},
      // Axolotl's next-fit packing in sampler order: how soltrain always packs (data/loader.cpp).
      {"sample_packing_sequentially", any()},
      // A key of one Axolotl example (llama-3/lora-1b-sample-packing-sequentially.yml) that no Axolotl code
      // reads (its schema ignores unknown keys): accepted so that example runs as Axolotl runs it.
      {"test_value", any()},
      // Tune Surogate's qlora_bnb, which is refused itself when on: one line for the one missing feature.
      {"qlora_bnb_block_size", any()},
      {"qlora_bnb_double_quant", any()},
      {"use_fused_rope", any()},
      // Surogate's keys that its code (invergent-ai/surogate at 524fb77) stores but never reads: documents
      // longer than sequence_len and the chat template follow soltrain's own rules either way.
      {"truncation_strategy", any()},
      {"use_chat_template", any()},
      // Surogate's loss_scale: "default" trains the assistant turns, "all" every token (its pt forces "all").
      {"loss_scale",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n) || text(n) == "default") return;
         if (text(n) != "all")
           user_error(k, ": \"", text(n), "\": not supported; use default (the assistant turns) or all (every token)");
         c.train_on_inputs = true;
       }},
      {"torch_compile_mode", any()},
      // transformers' dataset column pruning: soltrain reads only the columns a dataset type names.
      {"remove_unused_columns", any()},
      // Axolotl's old flash-attn fused-kernel switches: soltrain's kernels (its own fused norms, MLP, loss) run
      // the same math either way.
      {"flash_attn_cross_entropy", any()},
      {"flash_attn_rms_norm", any()},
      {"flash_attn_fuse_qkv", any()},
      {"flash_attn_fuse_mlp", any()},
      // Axolotl's ALST tiled MLP: soltrain's MLP already runs in token tiles where the sequence asks for it
      // (token_tile, automatic by default): the same math.
      {"tiled_mlp", any()},
      // A key of Axolotl's QAT examples (qat_nvfp4/*) that no Axolotl code reads.
      {"eta_min", any()},
      {"flex_attn_compile_kwargs", any()},
      // Checkpoints without the optimizer state: soltrain's keep it (resumable); the training is the same.
      {"save_only_model", any()},
      // Settings of features refused themselves when on (fp8, use_ray, cosine_min_lr_ratio): one line each.
      {"fp8_enable_fsdp_float8_all_gather", any()},
      {"fp4_backend", any()},  // Surogate's NVFP4 kernels' backend: recipe nvfp4 is refused itself
      // Old Axolotl examples' GPTQ settings (no current Axolotl code reads them; `gptq: true` is refused itself)
      // and torchdistx's path (only for the adamw_anyprecision optimizer, refused itself)
      {"gptq_groupsize", any()},
      {"gptq_model_v1", any()},
      {"torchdistx_path", any()},
      // Axolotl's total batch per GPU: gradient_accumulation_steps = batch_size // micro_batch_size when the
      // accumulation is not given (cli/config.cpp's rule_batch_size), as its normalize_config does
      {"batch_size", any()},
      {"cut_cross_entropy", any()},  // soltrain never materialises the full logits either
      {"torch_compile", any()},
      {"use_cuda_graphs", any()},
      {"tf32", any()},  // matmuls are bf16 on GPU; tf32 would only touch fp32 matmuls soltrain does not run
      {"strict", any()},
      {"debug", any()},
      {"local_rank", any()},
      {"run_name", [](const std::string&, const YAML::Node& n, TrainConfig& c) { c.trackers.run_name = text(n); }},
      // HF's report_to: TensorBoard (output_dir/tensorboard) is soltrain's own; wandb and mlflow through their
      // Python libraries (train/trackers.h); the others are refused rather than silently not reported to.
      {"report_to",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (!n.IsDefined() || n.IsNull()) return;
         std::vector<std::string> to;
         if (n.IsSequence())
           for (const auto& e : n) to.push_back(text(e));
         else
           to.push_back(text(n));
         c.tensorboard = false;
         for (const std::string& t : to) {
           if (t == "none") continue;
           if (t == "tensorboard" || t == "all") {
             c.tensorboard = true;
             continue;
           }
           if (t == "wandb" || t == "mlflow" || t == "swanlab") {
             (t == "wandb" ? c.trackers.wandb : t == "mlflow" ? c.trackers.mlflow : c.trackers.swanlab) = true;
             continue;
           }
           user_error(k, ": \"", t, "\": reporting to it is not built yet; metrics.jsonl and TensorBoard ",
                      "(output_dir/tensorboard, report_to: tensorboard) hold every metric");
         }
       }},
      {"use_swanlab",  // the SwanLab plugin's switch (on by default once the plugin is listed)
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (n.IsDefined() && !n.IsNull()) c.trackers.use_swanlab = as_bool(k, n);
       }},
      {"use_tensorboard",  // Axolotl's; metrics.jsonl and training_curves.svg are written either way
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) { c.tensorboard = as_bool(k, n); }},
      {"eval_sample_packing", any()},
      {"pad_to_sequence_len", any()},  // batches are always sequence_len wide
      {"dataset_processes", any()},
      {"dataset_num_proc", any()},
      {"shuffle_merged_datasets", any()},  // (a streamed run says it reads in order: config.cpp rule_streaming)
      // Axolotl's streaming buffer (rows shuffled and packed per buffer) and its deprecated name: a stream here is
      // read and packed in order, said in a note when shuffling was asked for
      {"streaming_multipack_buffer_size", any()},
      {"pretrain_multipack_buffer_size", any()},
      // pretraining_sample_concatenation: Axolotl's packing of pretraining rows without sample_packing; soltrain
      // packs as sample_packing says either way
      {"pretraining_sample_concatenation", any()},
      {"pretrain_multipack_attn",
       one_of({"true", "True"},
              "attention across packed documents is not offered: soltrain keeps attention within each document "
              "(pretrain_multipack_attn: true)")},
      {"eval_batch_size", any()},
      {"per_device_eval_batch_size", any()},
      {"eval_table_size", any()},
      {"eval_max_new_tokens", any()},
      {"trust_remote_code", any()},
      {"tokenizer_type", any()},
      {"model_type", any()},  // (AutoModelFor*Classification: reward_model / process_reward_model say it)
      {"is_llama_derived_model", any()},
      {"is_qwen_derived_model", any()},
      {"is_mistral_derived_model", any()},
      {"apply_recommended_values", any()},
      {"dataloader_num_workers", any()},
  });
}

// Settings with their own readers (tokens, templates, precision, ZeRO levels).
void add_settings(Table& t) {
  t.insert({
      {"bf16", one_of({"true", "True", "auto"},
                      "soltrain computes in bf16 with fp32 masters; fp32-only training "
                      "is not offered (use bf16: true)")},
      {"recompute_full",  // Surogate's switch for whole-layer recompute: accepted and ignored before, a silent
                          // difference in memory; false leaves `recompute` as set
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) c.recompute = Recompute::Full;
       }},
      {"save_safetensors", one_of({"true", "True"}, "soltrain writes safetensors only (use save_safetensors: true)")},
      {"zero_level",
       one_of({"1"}, "Surogate's ZeRO levels are not read; soltrain's is zero_stage: 0-3 (DeepSpeed's meaning)")},
  });
}

// TRL GRPO's generation_kwargs (passed to vLLM's SamplingParams or transformers' GenerationConfig): its stop
// strings (vLLM's `stop`, transformers' `stop_strings`) become soltrain's stop_strings; the sampling settings it
// may also hold are top-level keys in both, named in one line; anything else is refused.
void read_generation_kwargs(const std::string& key, const YAML::Node& n, TrainConfig& c) {
  if (!n.IsDefined() || n.IsNull()) return;
  if (!n.IsMap()) user_error(key, ": expected a mapping of generation settings");
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (k == "stop" || k == "stop_strings") {
      std::vector<std::string> s;
      if (v.IsScalar())
        s.push_back(v.as<std::string>());
      else if (v.IsSequence())
        for (const auto& x : v) {
          if (!x.IsScalar()) user_error(key, ".", k, ": expected a string or a list of strings");
          s.push_back(x.as<std::string>());
        }
      else if (!v.IsNull())
        user_error(key, ".", k, ": expected a string or a list of strings");
      for (const std::string& x : s)
        if (x.empty()) user_error(key, ".", k, ": an empty stop string would end every completion at its first token");
      c.grpo.stop_strings = s;
      continue;
    }
    for (const char* top : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens"})
      if (k == top)
        user_error(key, ".", k, ": give it as the top-level key ",
                   k == "max_tokens" ? std::string("max_completion_length") : k, " (TRL's GRPOConfig has it too)");
    user_error(key, ".", k, ": not read by soltrain (it reads stop / stop_strings there)");
  }
}

// Features soltrain lacks: accepted when off, refused with a line naming the feature otherwise.
void add_missing_features(Table& t) {
  t.insert({
      // Features soltrain lacks: accepted when off.
      // TRL GRPO's entropy bonus (its top_entropy_quantile is a grpo key: cli/config_schema.cpp).
      {"entropy_coef", at_or(0.0, "the entropy bonus is not built yet; leave it at 0")},
      {"use_adaptive_entropy", off_or("the adaptive entropy bonus is not built yet")},
      {"generation_kwargs", read_generation_kwargs},
      // FSDP and DeepSpeed: their sharding and offload as soltrain's zero_stage and offload switches
      // (cli/peer_sharding.h), one note saying what they became
      {"deepspeed", read_deepspeed},
      {"fsdp", read_fsdp},
      {"fsdp_config", read_fsdp_config},
      {"fsdp_version", read_fsdp_version},
      {"load_in_4bit",  // transformers' BitsAndBytesConfig: NF4 is what QLoRA configs ask for
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) set_quantised_base(c, WeightFormat::Nf4, k);
       }},
      {"load_in_8bit",  // transformers' BitsAndBytesConfig(load_in_8bit): LLM.int8's row-wise int8 base
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) set_quantised_base(c, WeightFormat::Int8Row, k);
       }},
      {"gptq", off_or("GPTQ-quantised base weights are not supported")},
      // Axolotl's context (sequence) and tensor parallelism: one line each rather than a run that silently
      // places the sequence or the weights otherwise; ring attention's settings go with the first.
      {"context_parallel_size", at_or(1,
                                      "context parallelism is not built yet; soltrain fits long sequences on "
                                      "one GPU (recompute, offload_activations, token tiles)")},
      {"sequence_parallel_degree", at_or(1,
                                         "context (sequence) parallelism is not built yet; soltrain fits long "
                                         "sequences on one GPU (recompute, offload_activations, token tiles)")},
      {"heads_k_stride", any()},
      {"ring_attn_func", any()},
      {"tensor_parallel_size", at_or(1,
                                     "tensor parallelism is not built yet; zero_stage: 3 (fsdp) shards the "
                                     "weights over the GPUs")},
      {"dp_replicate_size", at_or(1,
                                  "hybrid (replicated + sharded) data parallelism is not built yet; use "
                                  "zero_stage 0-3 over all the GPUs")},
      // Axolotl's torchao quantization-aware training block (weight_dtype, group_size, fake_quant_after_n_steps)
      // Axolotl's QAT block (model/qat.h): its schema's defaults (weight_dtype int8, group_size 32)
      {"qat",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n)) return;
         if (!n.IsMap())
           user_error(k, ": \"", text(n),
                      "\" is not valid: expected {weight_dtype: int4, activation_dtype: int8, ...}");
         std::string weight = "int8", activation;
         long group = 32, after = 0;
         bool group_given = false;
         for (const auto& kv : n) {
           const std::string name = kv.first.Scalar();
           const YAML::Node& v = kv.second;
           if (name == "weight_dtype") {
             if (!is_off(v)) weight = text(v);
           } else if (name == "activation_dtype") {
             if (!is_off(v)) activation = text(v);
           } else if (name == "group_size") {
             if (is_off(v)) continue;
             group = integer_in(k + ".group_size", v, 1, 1 << 20, "a positive integer");
             group_given = true;
           } else if (name == "fake_quant_after_n_steps") {
             if (!is_off(v)) after = integer_in(k + "." + name, v, 0, 1L << 40, "0 or a positive integer");
           } else if (name == "quantize_embedding") {
             if (!is_off(v) && as_bool(k + "." + name, v))
               user_error(k,
                          ".quantize_embedding: fake-quantising the embedding is not built (the projections and the "
                          "LM head are)");
           } else {
             user_error(k, ".", name,
                        ": not a QAT setting (weight_dtype, activation_dtype, group_size, "
                        "fake_quant_after_n_steps, quantize_embedding)");
           }
         }
         c.qat = parse_qat(weight, activation, group, group_given, after, k + ": ");
       }},
      {"fp16", off_or("fp16 training is not supported; soltrain computes in bf16 (bf16: true)")},
      // Axolotl's torchao float8 training: per-tensor dynamic scales, E4M3 forward and E5M2 gradients: our
      // fp8-hybrid recipe with current scaling.
      {"fp8",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (!as_bool(k, n)) return;
         c.fp8_hybrid = true;
         c.fp8.delayed = false;
         c.notes.push_back(
             "fp8: true (torchao float8, dynamic scales) runs as recipe: fp8-hybrid, fp8_scaling: current");
       }},
      {"peft_use_dora", off_or("DoRA adapters are not built yet; drop it for plain LoRA")},
      {"lora_model_dir", off_or("continuing from an existing LoRA adapter is not built yet")},
      {"peft_ensure_weight_tying",
       off_or("one trained copy of a tied embedding and LM head (PEFT's ensure_weight_tying) is not built yet; left "
              "unset, lora_modules_to_save trains two untied copies as PEFT does by default")},
      {"lora_fan_in_fan_out", off_or("fan-in/fan-out (Conv1D) weights are not in the models soltrain loads")},
      {"lora_on_cpu", off_or("LoRA on the CPU next to a GPU run is not supported; use device: cpu for a CPU run")},
      {"neftune_noise_alpha", off_or("NEFTune noise is not built yet")},
      {"s2_attention", off_or("shifted-sparse attention is not built yet")},
      {"group_by_length", off_or("length-grouped batches are not built; sample_packing fills batches instead")},
      {"push_dataset_to_hub", off_or("pushing to the Hugging Face hub is not built")},
      {"unfrozen_parameters", off_or("training a chosen subset of weights is not built yet")},
      {"checkpoint_dir", off_or("checkpoints are written into output_dir; drop checkpoint_dir")},
      {"from_scratch", off_or("training from random weights is not built yet")},
      // (offload_master, offload_optimizer and offload_grads are soltrain's own keys, cli/config.cpp.)
      // Surogate's residual offload keeps its other activations on the device unless it recomputes blocks;
      // soltrain's key is the recompute-full form, stated rather than guessed.
      {"offload_residual", off_or("use offload_activations: true with recompute: full (soltrain's name; it "
                                  "offloads the layer-input checkpoints, the residual stream full recompute keeps)")},
      {"qlora",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) set_quantised_base(c, WeightFormat::Nf4, k);
       }},
      // Axolotl's Ray launch (its TorchTrainer over ray_num_workers workers of resources_per_worker): the command
      // hands the job to soltrain's Python Ray launcher (python/soltrain/ray.py)
      {"use_ray", [](const std::string& k, const YAML::Node& n, TrainConfig& c) { c.ray.enabled = as_bool(k, n); }},
      {"ray_num_workers",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (!is_off(n)) c.ray.num_workers = int(integer_in(k, n, 1, 1 << 16, "a number of workers (1 or more)"));
       }},
      {"resources_per_worker",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n)) return;
         if (!n.IsMap()) user_error(k, ": expected a map of Ray resources to amounts, e.g. {GPU: 1}");
         c.ray.resources.clear();
         for (const auto& kv : n) {
           const std::string name = kv.first.as<std::string>(), v = text(kv.second);
           char* end = nullptr;
           const double x = std::strtod(v.c_str(), &end);
           if (v.empty() || *end || !(x >= 0) || x > 1e9)
             user_error(k, ".", name, ": \"", v, "\" is not valid: expected a non-negative amount");
           c.ray.resources[name] = x;
         }
       }},
      {"ray_run_name", any()},  // (Ray Train's run name: soltrain's actors are not a Ray Train run)
      // Axolotl's keys for the loading it does through transformers; soltrain loads and places the model itself.
      // torch_dtype: Axolotl sets it from bf16 / fp16, over the YAML's value; adam_eps: Axolotl reads adam_epsilon,
      // not this (two examples carry it); ddp: in its schema, read nowhere; hf_use_auth_token: the hub token is the
      // one huggingface_hub would use (HF_TOKEN, the login's file) either way; flash_optimum: BetterTransformer's
      // attention, the same math; gptq_disable_exllama: a GPTQ kernel switch (gptq is refused itself).
      {"torch_dtype",
       noted("no effect, as in Axolotl (it sets the dtype from bf16 / fp16); soltrain computes in bf16")},
      {"adam_eps", noted("no effect, as in Axolotl (its key is adam_epsilon); the default epsilon stands")},
      {"ddp", any()},
      {"hf_use_auth_token", any()},
      {"flash_optimum", any()},
      {"gptq_disable_exllama", any()},
      {"lr_quadratic_warmup",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) { c.quadratic_warmup = as_bool(k, n); }},
      // transformers' fast tokenizer is tokenizer.json, which is what soltrain reads; the slow (sentencepiece) one
      // and its non-legacy handling of text after special tokens are not built
      {"tokenizer_use_fast",
       true_or("the slow (sentencepiece) tokenizer is not built; soltrain tokenizes with the model's tokenizer.json, "
               "the fast tokenizer's file")},
      {"tokenizer_legacy",
       true_or("the sentencepiece tokenizer's non-legacy mode is not built; soltrain tokenizes as the model's "
               "tokenizer.json says")},
      {"device_map",
       [](const std::string& k, const YAML::Node& n, TrainConfig&) {
         if (n.IsNull() || (n.IsScalar() && (n.Scalar().empty() || n.Scalar() == "auto"))) return;
         user_error(k, ": ", text(n),
                    ": soltrain places the model itself (device, gpus, offload_params); a device map is not built");
       }},
      // Axolotl features soltrain lacks, each named in one line (found by bench/peer_sweep over its examples)
      {"dp_shard_size",
       off_or("Axolotl's N-D parallelism is not built; zero_stage: 3 shards over every GPU (gpus: N)")},
      {"dp_replicate_size",
       off_or("Axolotl's N-D parallelism is not built; zero_stage: 3 shards over every GPU (gpus: N)")},
      {"lisa_n_layers", off_or("LISA (layerwise importance sampling) is not built yet")},
      {"lisa_step_interval", off_or("LISA (layerwise importance sampling) is not built yet")},
      {"lisa_layers_attribute", off_or("LISA (layerwise importance sampling) is not built yet")},
      {"relora", off_or("ReLoRA is not built yet")},
      {"relora_steps", off_or("ReLoRA is not built yet")},
      {"relora_warmup_steps", off_or("ReLoRA is not built yet")},
      {"relora_anneal_steps", off_or("ReLoRA is not built yet")},
      {"relora_prune_ratio", off_or("ReLoRA is not built yet")},
      {"relora_cpu_offload", off_or("ReLoRA is not built yet")},
      // Axolotl's PEFT block: LoftQ's initialisation (model/loftq.h), 4-bit as PEFT's LoftQConfig defaults it
      {"peft",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n)) return;
         if (!n.IsMap()) user_error(k, ": \"", text(n), "\" is not valid: expected {loftq_config: {loftq_bits: 4}}");
         for (const auto& kv : n) {
           const std::string name = kv.first.Scalar();
           if (name != "loftq_config")
             user_error(k, ".", name, ": not read (soltrain reads peft: {loftq_config: ...})");
           if (is_off(kv.second)) continue;
           const YAML::Node bits = kv.second["loftq_bits"], iter = kv.second["loftq_iter"];
           if (bits.IsDefined() && !bits.IsNull() && text(bits) != "4")
             user_error(k, ".loftq_config.loftq_bits: \"", text(bits),
                        "\": LoftQ over 8-bit (LLM.int8) quantisation is not built; 4 is");
           c.lora.loftq_iter = 1;
           if (iter.IsDefined() && !iter.IsNull()) {
             c.lora.loftq_iter =
                 int(integer_in(k + ".loftq_config.loftq_iter", iter, 1, 100, "an integer from 1 to 100"));
           }
         }
       }},
      // Axolotl's OpenTelemetry callback: a Prometheus endpoint of the training metrics (train/trackers.h)
      {"use_otel_metrics", [](const std::string& k, const YAML::Node& n,
                              TrainConfig& c) { c.trackers.otel = !is_off(n) && as_bool(k, n); }},
      {"otel_metrics_host",
       [](const std::string&, const YAML::Node& n, TrainConfig& c) {
         if (!is_off(n)) c.trackers.otel_host = text(n);
       }},
      {"otel_metrics_port",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n)) return;
         c.trackers.otel_port = int(integer_in(k, n, 1, 65535, "a port from 1 to 65535"));
       }},
      {"use_wandb",  // Axolotl's switch: false keeps wandb off even with a wandb_project, true turns it on
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (n.IsDefined() && !n.IsNull() && !(n.IsScalar() && n.Scalar().empty()))
           c.trackers.use_wandb = as_bool(k, n);
       }},
      {"float16", off_or("fp16 training is not supported; soltrain computes in bf16 (bf16: true)")},
      {"max_packed_sequence_len", off_or("no longer supported (Axolotl deprecated it): use sequence_len with "
                                         "sample_packing: true")},
      // Surogate's: the vision encoder of a multimodal model (soltrain's models are text-only), and a memory
      // breakdown printed after allocation (soltrain prints its memory plan at the start of every run)
      {"train_vision", off_or("training a vision encoder is not built (soltrain trains text-only models)")},
      {"debug_memory_breakdown", any()},
      // Axolotl's loaders/tokenizer.py: with chat_template: chatml, "You are a helpful assistant." in the template
      // becomes this text; its chatml template (as soltrain's) has no such text, so the key changes nothing there
      {"default_system_message",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (n.IsNull() || (n.IsScalar() && n.Scalar().empty())) return;
         c.notes.push_back(cat(k, ": no effect, as in Axolotl (it edits only a chatml template's \"You are a helpful ",
                               "assistant.\", which the chatml template does not have); a dataset's system_prompt ",
                               "gives its records a system message"));
       }},
      // Surogate's Ray cluster block (ray_address, num_nodes, gpus_per_node)
      // Surogate's Ray cluster block: num_nodes > 1 runs num_nodes x gpus_per_node (0: gpus) Ray workers of a GPU
      // each, on the cluster at ray_address (default "auto"); one node is a local run, as there.
      {"distributed",
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (is_off(n)) return;
         if (!n.IsMap()) user_error(k, ": expected a map (ray_address, num_nodes, gpus_per_node)");
         int nodes = 1, per_node = 0;
         std::string address = "auto";
         for (const auto& kv : n) {
           const std::string name = kv.first.as<std::string>();
           if (name == "num_nodes")
             nodes = int(integer_in(k + ".num_nodes", kv.second, 1, 1 << 16, "a number of nodes (1 or more)"));
           else if (name == "gpus_per_node")
             per_node = int(integer_in(k + ".gpus_per_node", kv.second, 0, 1 << 10, "a number of GPUs (0: gpus)"));
           else if (name == "ray_address")
             address = text(kv.second);
           else
             user_error(k, ".", name, ": unknown key (Surogate's distributed block has ray_address, num_nodes, ",
                        "gpus_per_node)");
         }
         if (nodes <= 1) return;
         c.ray.enabled = true;
         c.ray.address = address;
         c.ray.num_workers = nodes * per_node;
         c.ray.nodes = per_node > 0 ? 0 : nodes;  // (x gpus, once every key is read)
         c.ray.resources = {{"GPU", 1.0}};
       }},
      {"qlora_bnb",  // Surogate: LoRA over a bitsandbytes NF4 base
       [](const std::string& k, const YAML::Node& n, TrainConfig& c) {
         if (as_bool(k, n)) set_quantised_base(c, WeightFormat::Nf4, k);
       }},
  });
}

const Table& table() {
  static const Table t = [] {
    Table all;
    add_renames(all);
    add_accepted(all);
    add_settings(all);
    add_missing_features(all);
    return all;
  }();
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
  if (is_logging_family(key)) {
    // An empty wandb_project: (Axolotl's examples have them) asks for nothing.
    const bool given = value.IsDefined() && !value.IsNull() && !(value.IsScalar() && text(value).empty());
    if (key.rfind("liger_", 0) == 0 || !given) return true;
    const std::string family = key.substr(0, key.find('_')), what = key.substr(key.find('_') + 1);
    // wandb and mlflow through their Python libraries (train/trackers.h): the settings it passes on; Axolotl
    // turns wandb on with wandb_project, mlflow with mlflow_tracking_uri (rule_trackers in config.cpp).
    static const std::vector<std::string> wandb_keys = {"project", "entity", "name", "mode", "run_id"};
    static const std::vector<std::string> mlflow_keys = {"tracking_uri", "experiment_name", "run_name"};
    // Axolotl's SwanLab plugin passes these to swanlab.init; its completion tables need completions in the
    // trainer's logs, which preference runs do not log (its own callback's placeholder): accepted, nothing sent
    static const std::vector<std::string> swanlab_keys = {"project",
                                                          "experiment_name",
                                                          "description",
                                                          "mode",
                                                          "workspace",
                                                          "api_key",
                                                          "web_host",
                                                          "api_host",
                                                          "log_completions",
                                                          "completion_log_interval",
                                                          "completion_max_buffer"};
    const std::vector<std::string>* known = family == "wandb"     ? &wandb_keys
                                            : family == "mlflow"  ? &mlflow_keys
                                            : family == "swanlab" ? &swanlab_keys
                                                                  : nullptr;
    if (known && std::find(known->begin(), known->end(), what) != known->end()) {
      (family == "wandb"    ? c.trackers.wandb_settings
       : family == "mlflow" ? c.trackers.mlflow_settings
                            : c.trackers.swanlab_settings)[what] = text(value);
      return true;
    }
    if (known && value.IsScalar() && (text(value) == "false" || text(value) == "False")) return true;
    user_error(key, ": ",
               known ? "this " + family + " setting is not built yet (soltrain passes on " + family + "_" +
                           (*known)[0] + " and the others of its table)"
                     : "sending metrics to " + family +
                           " is not built yet; report_to: wandb, mlflow or swanlab, metrics.jsonl "
                           "and TensorBoard (output_dir/tensorboard) hold every metric",
               "; leave it empty");
  }
  const auto it = table().find(key);
  if (it == table().end()) return false;
  it->second(key, value, c);
  return true;
}

bool is_peer_key(const std::string& key) {
  return is_logging_family(key) || table().count(key) > 0;
}

std::vector<std::string> peer_key_names() {
  std::vector<std::string> out;
  for (const auto& [k, v] : table()) out.push_back(k);
  return out;
}

}  // namespace soltrain
