// The subcommands of the soltrain binary; each registers its flags and runs.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

// Each returns the function that runs the subcommand once its flags are parsed.
std::function<int()> add_dump_command(CLI::App& app);
std::function<int()> add_train_command(CLI::App& app);
std::function<int()> add_merge_command(CLI::App& app);
std::function<int()> add_encode_command(CLI::App& app);
std::function<int()> add_tokenize_command(CLI::App& app);
std::function<int()> add_chat_template_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);
std::function<int()> add_bench_attention_command(CLI::App& app);
std::function<int()> add_bench_grouped_gemm_command(CLI::App& app);
std::function<int()> add_bench_decode_command(CLI::App& app);
// The benchmarks' model settings (bench, bench-decode): LoRA of `lora_rank` on all seven projections, alpha 2r, no
// dropout, its base stored as --qlora says (none, nf4, int8, fp8); seed 1. One line, exit 2, for --qlora without
// a rank.
TrainConfig bench_model_settings(int lora_rank, const std::string& qlora, const char* command);
std::function<int()> add_sft_command(CLI::App& app);
std::function<int()> add_pt_command(CLI::App& app);
std::function<int()> add_dpo_command(CLI::App& app);         // also what `rl: dpo` in an sft config runs
std::function<int()> add_grpo_command(CLI::App& app);        // also what `rl: grpo` in a config runs
std::function<int()> add_merge_lora_command(CLI::App& app);  // Axolotl's `merge-lora config.yaml`
std::function<int()> add_chat_command(CLI::App& app);
std::function<int()> add_inference_command(CLI::App& app);  // Axolotl's `inference config.yaml`
std::function<int()> add_serve_command(CLI::App& app);      // an OpenAI-compatible endpoint
// What `soltrain sft|pt|dpo config.yaml` (and Axolotl's `train config.yaml`) runs; the exit code.
int run_config_job(const std::string& config, const std::vector<std::string>& set, TrainMode mode,
                   const std::string& dump_batches = "", int gpus = 0, bool verbose = false);
std::function<int()> add_demo_setup_command(CLI::App& app);
std::function<int()> add_generate_command(CLI::App& app);
std::function<int()> add_config_keys_command(CLI::App& app);
std::function<int()> add_quantize_command(CLI::App& app);  // hidden: a test tool

}  // namespace soltrain
