// YAML configs: defaults, every error a user can make named with key, line and what is expected, --set.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "cli/config.h"
#include "core/error.h"
#include "core/format.h"

namespace soltrain {
namespace {

const std::string kBase = "model: m\noutput_dir: out\ndatasets:\n  - path: d.jsonl\n    type: conversation\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& set = {},
                     TrainMode mode = TrainMode::kSft) {
  try {
    parse_train_config(yaml, "cfg.yaml", set, mode);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Config, MinimalConfigGetsDefaults) {
  const TrainConfig c = parse_train_config(kBase, "dir/cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.model, "dir/m");  // relative to the config file
  EXPECT_EQ(c.output_dir, "dir/out");
  ASSERT_EQ(c.datasets.size(), 1u);
  EXPECT_EQ(c.datasets[0].path, "dir/d.jsonl");
  EXPECT_EQ(c.datasets[0].type, DatasetType::kConversation);
  EXPECT_EQ(c.dataset_prepared_path, "dir/out/prepared");
  EXPECT_EQ(c.lr_scheduler_type, ScheduleType::kLinear);
  EXPECT_EQ(c.per_device_train_batch_size, 1);
  EXPECT_FALSE(c.train_on_inputs);
  EXPECT_FALSE(c.lora.enabled);
  EXPECT_EQ(c.device, Device::CPU);
}

// optimizer: muon as Axolotl's factory builds it: betas (0.9, 0.95) unless both are given, the second one Muon's
// momentum.
TEST(Config, MuonTakesAxolotlsBetas) {
  const TrainConfig c = parse_train_config(kBase + "optimizer: muon\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(c.muon);
  EXPECT_EQ(c.adamw_beta1, 0.9);
  EXPECT_EQ(c.adamw_beta2, 0.95);
  const TrainConfig one =
      parse_train_config(kBase + "optimizer: muon\nadamw_beta2: 0.99\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(one.adamw_beta2, 0.95);  // (Axolotl passes its betas only when both are given)
  const TrainConfig both = parse_train_config(kBase + "optimizer: muon\nadamw_beta1: 0.8\nadamw_beta2: 0.99\n",
                                              "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(both.adamw_beta1, 0.8);
  EXPECT_EQ(both.adamw_beta2, 0.99);
  // Axolotl's (and HF TrainingArguments') names for them
  const TrainConfig axolotl =
      parse_train_config(kBase + "optimizer: muon\nadam_beta1: 0.85\nadam_beta2: 0.98\nadam_epsilon: 1e-6\n",
                         "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(axolotl.adamw_beta1, 0.85);
  EXPECT_EQ(axolotl.adamw_beta2, 0.98);
  EXPECT_EQ(axolotl.adamw_epsilon, 1e-6);
  EXPECT_FALSE(parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft).muon);
}

TEST(Config, UnknownKeyNamesLineAndSuggests) {
  EXPECT_EQ(error_of(kBase + "learning_rat: 1e-4\n"),
            "cfg.yaml:6: unknown key \"learning_rat\" (did you mean \"learning_rate\"?)");
  EXPECT_EQ(error_of(kBase + "gradient_acumulation_steps: 2\n"),
            "cfg.yaml:6: unknown key \"gradient_acumulation_steps\" (did you mean \"gradient_accumulation_steps\"?)");
  EXPECT_EQ(error_of(kBase + "zzzzzz: 1\n"), "cfg.yaml:6: unknown key \"zzzzzz\"");
  EXPECT_EQ(error_of("model: m\noutput_dir: o\ndatasets:\n  - path: d\n    typ: text\n"),
            "cfg.yaml:5: unknown dataset key \"typ\" (did you mean \"type\"?)");
}

TEST(Config, RepeatedKeysAndDeepNestingAreClearErrors) {
  EXPECT_EQ(error_of(kBase + "model: other\n"),
            "cfg.yaml:6: key \"model\" appears twice (also at cfg.yaml:1); keep one");
  EXPECT_EQ(error_of("model: m\noutput_dir: o\ndatasets:\n  - path: a\n    path: b\n"),
            "cfg.yaml:5: dataset key \"path\" appears twice (also at cfg.yaml:4); keep one");
  const std::string deep = kBase + "lora_target_modules: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  EXPECT_NE(error_of(deep).find("cfg.yaml:6: not valid YAML: nested more than"), std::string::npos) << error_of(deep);
  // --set replaces a key on purpose: not a repetition
  EXPECT_EQ(error_of(kBase, {"model=other"}), "no error");
  // a key that is not a string is an unknown key, not a crash
  EXPECT_NE(error_of(kBase + "[a]: 1\n").find("unknown key \"[a]\""), std::string::npos);
}

TEST(Config, BadValuesSayWhatIsExpected) {
  EXPECT_EQ(error_of(kBase + "learning_rate: fast\n"),
            "cfg.yaml:6: learning_rate: \"fast\" is not valid: expected a number in (0, 10]");
  EXPECT_EQ(error_of(kBase + "per_device_train_batch_size: 0\n"),
            "cfg.yaml:6: per_device_train_batch_size: \"0\" is not valid: expected an integer from 1 to 2147483647");
  // values past what the key's int holds name the key instead of wrapping around
  EXPECT_EQ(error_of(kBase + "sequence_len: 3000000000\n"),
            "cfg.yaml:6: sequence_len: \"3000000000\" is not valid: expected an integer from 2 to 16777216");
  EXPECT_EQ(error_of(kBase + "sequence_len: 1e11\n"),
            "cfg.yaml:6: sequence_len: \"1e11\" is not valid: expected an integer from 2 to 16777216");
  EXPECT_EQ(error_of(kBase + "gradient_accumulation_steps: 99999999999\n"),
            "cfg.yaml:6: gradient_accumulation_steps: \"99999999999\" is not valid: expected an integer from 1 to "
            "2147483647");
  EXPECT_EQ(error_of(kBase + "lr_scheduler_type: exponential\n"),
            "cfg.yaml:6: lr_scheduler_type: \"exponential\" is not valid: expected constant, "
            "constant_with_warmup, linear, cosine or wsd");
  EXPECT_EQ(error_of(kBase + "sample_packing: maybe\n"),
            "cfg.yaml:6: sample_packing: \"maybe\" is not valid: expected true or false");
  EXPECT_EQ(error_of(kBase + "recompute: some\n"),
            "cfg.yaml:6: recompute: \"some\" is not valid: expected none, elementwise, selective or full (or true / "
            "false)");
  // Surogate's bool: true is full, false none
  EXPECT_EQ(parse_train_config(kBase + "recompute: true\n", "cfg.yaml", {}, TrainMode::kSft).recompute,
            Recompute::Full);
  EXPECT_EQ(parse_train_config(kBase + "recompute: false\n", "cfg.yaml", {}, TrainMode::kSft).recompute,
            Recompute::None);
  EXPECT_EQ(error_of(kBase + "lora_target_modules: [q_proj, qkv_proj]\n"),
            "cfg.yaml:6: unknown lora_target_modules entry \"qkv_proj\" (did you mean \"q_proj\"?)");
  EXPECT_EQ(error_of("output_dir: o\ndatasets: [d.jsonl]\n"),
            "cfg.yaml: `model` is required (a Hugging Face model folder)");
  EXPECT_EQ(error_of("model: [unclosed\n").rfind("cfg.yaml:", 0), 0u);
}

// Axolotl's pretraining_dataset (and streaming: true) stream the datasets: a pt run, with Axolotl's own checks (a
// max_steps, no val_set_size) and what needs a whole dataset refused by name; an empty one is no dataset.
TEST(Config, StreamedDatasetsAreAPtRunWithMaxSteps) {
  const std::string pre =
      "model: m\noutput_dir: out\npretraining_dataset:\n  - path: allenai/c4\n    name: en\n    type: pretrain\n"
      "    text_column: body\n";
  const TrainConfig c = parse_train_config(pre + "max_steps: 5\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.mode, TrainMode::kPretrain);
  EXPECT_TRUE(c.streaming);
  EXPECT_TRUE(c.train_on_inputs);
  ASSERT_EQ(c.datasets.size(), 1u);
  EXPECT_EQ(c.datasets[0].hub_id, "allenai/c4");
  EXPECT_EQ(c.datasets[0].name, "en");
  EXPECT_EQ(c.datasets[0].type, DatasetType::kText);
  EXPECT_EQ(c.datasets[0].fields.text, "body");
  EXPECT_EQ(error_of(pre),
            "cfg.yaml:3: pretraining_dataset: max_steps is required (a stream's length is not known before it is "
            "read, so num_epochs cannot set the schedule)");
  EXPECT_EQ(error_of(pre + "max_steps: 5\nval_set_size: 0.1\n"),
            "cfg.yaml:3: pretraining_dataset: val_set_size holds documents out of the training data, which a stream "
            "does not have at hand; give test_datasets instead");
  EXPECT_EQ(error_of(pre + "max_steps: 5\ndatasets: [d.jsonl]\n"),
            "cfg.yaml:3: pretraining_dataset and datasets: give one (Axolotl trains on pretraining_dataset alone)");
  EXPECT_EQ(error_of(pre + "max_steps: 5\npretrain_multipack_attn: false\n"),
            "cfg.yaml:9: pretrain_multipack_attn: \"false\": attention across packed documents is not offered: "
            "soltrain keeps "
            "attention within each document (pretrain_multipack_attn: true)");
  EXPECT_EQ(error_of("model: m\noutput_dir: out\ndatasets: [d.jsonl]\nstreaming: true\nrl: dpo\nmax_steps: 2\n"),
            "cfg.yaml:4: streaming: streamed datasets train sft and pt runs; a preference run reads its datasets "
            "whole");
  const TrainConfig sft = parse_train_config(kBase + "streaming: true\nmax_steps: 2\nshuffle_merged_datasets: true\n",
                                             "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(sft.mode, TrainMode::kSft);
  EXPECT_TRUE(sft.streaming);
  EXPECT_NE(std::find(sft.notes.begin(), sft.notes.end(),
                      "streaming: the datasets are read in order; Axolotl's shuffle buffer (shuffle_merged_datasets, "
                      "streaming_multipack_buffer_size) is not applied"),
            sft.notes.end());
  const TrainConfig none =
      parse_train_config(kBase + "pretraining_dataset:\n", "cfg.yaml", {}, TrainMode::kSft);  // Axolotl's "none"
  EXPECT_FALSE(none.streaming);
  EXPECT_EQ(none.mode, TrainMode::kSft);
}

// TRL's PRMConfig settings inside an Axolotl stepwise_supervised dataset entry (its current examples/qwen2/prm.yaml):
// read for that dataset; an empty max_completion_length is none; elsewhere one line.
TEST(Config, StepwiseDatasetsCarryTheirPrmSettings) {
  const std::string prm =
      "model: m\noutput_dir: out\nprocess_reward_model: true\nnum_labels: 2\ndatasets:\n  - path: d.jsonl\n"
      "    type: stepwise_supervised\n";
  const TrainConfig c = parse_train_config(
      prm + "    step_separator: \" ||\"\n    max_completion_length:\n    train_on_last_step_only: true\n", "cfg.yaml",
      {}, TrainMode::kSft);
  ASSERT_EQ(c.datasets.size(), 1u);
  EXPECT_EQ(c.datasets[0].step_separator, std::optional<std::string>(" ||"));
  EXPECT_EQ(c.datasets[0].train_on_last_step_only, std::optional<bool>(true));
  EXPECT_EQ(c.step_separator, "\n");  // (the top-level default, for the datasets that say nothing)
  EXPECT_EQ(error_of(prm + "    max_completion_length: 64\n"),
            "cfg.yaml:8: max_completion_length: cutting a process reward model's completions is not built yet; "
            "sequence_len bounds each document (leave it empty)");
  EXPECT_EQ(error_of(kBase + "    step_separator: \"|\"\n"),
            "cfg.yaml: step_separator / train_on_last_step_only in a dataset are a stepwise_supervised dataset's (a "
            "process reward model's)");
}

// Another tool's name for a setting is answered with its equivalent, not a spelling guess (these three used to
// suggest learning_rate, lora and hub_strategy); a LLaMA-Factory config is read as one (its dataset names then need
// dataset_info.json).
TEST(Config, OtherToolsNamesGetTheirEquivalent) {
  EXPECT_EQ(error_of(kBase + "dataset_text_field: x\n"),
            "cfg.yaml:6: unknown key \"dataset_text_field\" (TRL's name; soltrain's: a dataset's field (type: "
            "completion, field: ...))");
  EXPECT_EQ(error_of(kBase + "loss: sigmoid\n"),
            "cfg.yaml:6: loss is a preference-training key: run `soltrain dpo` or set rl: dpo");
  EXPECT_EQ(error_of(kBase + "max_step: 3\n"), "cfg.yaml:6: unknown key \"max_step\" (did you mean \"max_steps\"?)");
  const std::string factory =
      "model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
      "lora_rank: 8\nlora_target: all\ndataset: identity,alpaca_en_demo\ntemplate: llama3\ncutoff_len: 2048\n"
      "output_dir: saves/llama3-8b/lora/sft\nlearning_rate: 1.0e-4\nnum_train_epochs: 3.0\nbf16: true\n";
  // (read as LLaMA-Factory reads it: python/tests/test_llama_factory.py; here its dataset names have no
  // dataset_info.json beside them)
  const std::string e = error_of(factory);
  EXPECT_NE(e.find("LLaMA-Factory reads dataset names from data/dataset_info.json, which does not exist"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("unknown key"), std::string::npos) << e;
}

TEST(Config, SetOverridesAndIsCheckedToo) {
  const TrainConfig c = parse_train_config(
      kBase + "learning_rate: 1e-4\n", "cfg.yaml",
      {"learning_rate=3e-4", "max_steps=7", "lora=true", "lora_target_modules=[q_proj, v_proj]"}, TrainMode::kSft);
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_EQ(c.max_steps, 7);
  EXPECT_TRUE(c.lora.enabled);
  EXPECT_EQ(c.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  // The saved config holds the overrides in place of the file's values, each key once: it runs again as it is.
  EXPECT_NE(c.source_text.find("\nmax_steps: 7\n"), std::string::npos) << c.source_text;
  EXPECT_NE(c.source_text.find("\nlearning_rate: 3e-4\n"), std::string::npos) << c.source_text;
  EXPECT_EQ(c.source_text.find("1e-4"), std::string::npos) << c.source_text;
  EXPECT_EQ(parse_train_config(c.source_text, "/elsewhere/config.yaml", {}, TrainMode::kSft).max_steps, 7);
  EXPECT_EQ(error_of(kBase, {"max_step=3"}),
            "--set max_step=3: unknown key \"max_step\" (did you mean \"max_steps\"?)");
  EXPECT_EQ(error_of(kBase, {"seed=-1"}), "--set seed=-1: seed: \"-1\" is not valid: expected an integer >= 0");
  EXPECT_EQ(error_of(kBase, {"nonsense"}), "--set \"nonsense\": expected key=value");
}

TEST(Config, DatasetFieldsRolesAndModes) {
  const TrainConfig c = parse_train_config(
      "model: m\noutput_dir: o\nresume_from_checkpoint: true\ndatasets:\n"
      "  - path: a.jsonl\n    type: sharegpt\n    field_messages: convo\n    system_prompt: Be brief.\n"
      "    roles: {user: [human, person], assistant: bot}\n",
      "cfg.yaml", {}, TrainMode::kSft);
  const DatasetFields& f = c.datasets[0].fields;
  EXPECT_EQ(c.datasets[0].type, DatasetType::kConversation);
  EXPECT_EQ(f.messages, "convo");
  EXPECT_EQ(f.system_prompt, "Be brief.");
  EXPECT_EQ(f.roles.at("person"), "user");
  EXPECT_EQ(f.roles.at("bot"), "assistant");
  EXPECT_EQ(c.resume_from_checkpoint.kind, ResumeFrom::kLatest);
  // pt: text only, every token trained
  const TrainConfig p =
      parse_train_config("model: m\noutput_dir: o\ndatasets: [t.jsonl]\n", "cfg.yaml", {}, TrainMode::kPretrain);
  EXPECT_EQ(p.datasets[0].type, DatasetType::kText);
  EXPECT_TRUE(p.train_on_inputs);
  EXPECT_EQ(error_of(kBase, {}, TrainMode::kPretrain),
            "cfg.yaml:5: type: \"conversation\": pt trains on text datasets (use `soltrain sft` for conversation)");
}

TEST(Config, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("seed", "seed"), 0u);
}

TEST(Config, ResidualDtype) {
  const auto parse = [](const std::string& v) {
    return parse_train_config(kBase + "residual_dtype: " + v + "\n", "cfg.yaml", {}, TrainMode::kSft).residual_dtype;
  };
  EXPECT_EQ(parse("fp32"), DType::F32);
  EXPECT_EQ(parse("bf16"), DType::BF16);
  EXPECT_EQ(parse("auto"), std::nullopt);
  EXPECT_EQ(parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft).residual_dtype, std::nullopt);
  EXPECT_EQ(error_of(kBase + "residual_dtype: fp16\n"),
            "cfg.yaml:6: residual_dtype: \"fp16\" is not valid: expected auto, fp32 or bf16");
}

TEST(Config, AttentionBackward) {
  const auto parse = [](const std::string& v) {
    return parse_train_config(kBase + "attention_backward: " + v + "\n", "cfg.yaml", {}, TrainMode::kSft)
        .attention_backward;
  };
  EXPECT_EQ(parse("ordered"), AttentionBackward::Ordered);
  EXPECT_EQ(parse("atomic"), AttentionBackward::Atomic);
  EXPECT_EQ(parse("split"), AttentionBackward::Split);
  // the default: split (bitwise repeatable, no scratch)
  EXPECT_EQ(parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft).attention_backward, AttentionBackward::Split);
  EXPECT_EQ(error_of(kBase + "attention_backward: fast\n"),
            "cfg.yaml:6: attention_backward: \"fast\" is not valid: expected split, ordered or atomic");
  for (AttentionBackward f : {AttentionBackward::Split, AttentionBackward::Ordered, AttentionBackward::Atomic})
    EXPECT_EQ(parse_attention_backward(attention_backward_name(f), "x"), f);
}

// The fused forms' scratch as the Hopper kernels number their tiles: tokens / 64 + documents + 1 tiles of
// 64 x 128 fp32 per head, and a counter per (document, head, 64-query tile); nothing for split or other head dims.
TEST(Config, AttentionBackwardScratch) {
  EXPECT_EQ(attention_backward_scratch_bytes(AttentionBackward::Split, 8192, 4, 2048, 32, 128), 0u);
  EXPECT_EQ(attention_backward_scratch_bytes(AttentionBackward::Ordered, 8192, 4, 2048, 32, 64), 0u);
  const size_t tiles = (8192 / 64 + 4 + 1) * 32, turns = 4 * 32 * (2048 / 64);
  EXPECT_EQ(attention_backward_scratch_bytes(AttentionBackward::Ordered, 8192, 4, 2048, 32, 128),
            tiles * 32768 + turns * 4);
  EXPECT_EQ(attention_backward_scratch_bytes(AttentionBackward::Atomic, 8192, 4, 2048, 32, 128),
            tiles * 32768 + turns * 4);
  // Partial tiles: 8000 tokens in 4 documents of at most 2000: (125 + 4 + 1) x 32 tiles, 4 x 32 x 32 counters.
  EXPECT_EQ(attention_backward_scratch_bytes(AttentionBackward::Ordered, 8000, 4, 2000, 32, 128),
            size_t(4160) * 32768 + size_t(4096) * 4);
}

TEST(Config, TokenTile) {
  EXPECT_EQ(parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft).token_tile, 0);  // automatic
  EXPECT_EQ(parse_train_config(kBase + "token_tile: 4096\n", "cfg.yaml", {}, TrainMode::kSft).token_tile, 4096);
  EXPECT_EQ(error_of(kBase + "token_tile: -1\n"),
            "cfg.yaml:6: token_tile: \"-1\" is not valid: expected an integer >= 0");
}

TEST(Config, PeerKeysMapToSoltrainSettings) {
  const TrainConfig c = parse_train_config(kBase +
                                               "gradient_checkpointing: true\noptimizer: adamw_torch_fused\n"
                                               "recipe: bf16\nval_set_size: 100\nsaves_per_epoch: 2\n"
                                               "evals_per_epoch: 4\nadapter: lora\nlora_target_linear: true\n",
                                           "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.recompute, Recompute::Full);
  EXPECT_EQ(c.validation_count, 100);
  EXPECT_EQ(c.validation_split_ratio, 0);
  EXPECT_EQ(c.saves_per_epoch, 2);
  EXPECT_EQ(c.evals_per_epoch, 4);
  EXPECT_EQ(c.lora.target_modules, all_lora_module_names());
  EXPECT_EQ(parse_train_config(kBase + "gradient_checkpointing: false\n", "cfg.yaml", {}, TrainMode::kSft).recompute,
            Recompute::None);
  EXPECT_EQ(parse_train_config(kBase + "val_set_size: 0.05\n", "cfg.yaml", {}, TrainMode::kSft).validation_split_ratio,
            0.05);
  const TrainConfig g = parse_train_config(
      "model: m\nsave_path: o\nnum_train_epochs: 3\nlora_target_modules: [all-linear]\ndatasets:\n"
      "  - {path: d.jsonl, type: instruction, instruction_field: q, input_field: i, output_field: a}\n",
      "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(g.num_epochs, 3);
  EXPECT_EQ(g.lora.target_modules, all_lora_module_names());
  EXPECT_EQ(g.datasets[0].fields.instruction, "q");
  EXPECT_EQ(g.datasets[0].fields.input, "i");
  EXPECT_EQ(g.datasets[0].fields.output, "a");
  const std::string surogate = "model: m\nsave_path: out\ndatasets: [d.jsonl]\n";
  // A peer's config (save_path is Surogate's name) resolves relative paths from the working folder, as the peer
  // does; soltrain's own from the config's folder.
  EXPECT_EQ(parse_train_config(surogate, "dir/cfg.yaml", {}, TrainMode::kSft).output_dir, "out");
  EXPECT_EQ(parse_train_config("model: m\noutput_dir: out\ndatasets: [d.jsonl]\n", "dir/cfg.yaml", {}, TrainMode::kSft)
                .output_dir,
            "dir/out");
  EXPECT_EQ(error_of(surogate + "output_dir: o\n"),
            "cfg.yaml:4: output_dir (o) and save_path (out, cfg.yaml:2) are the same setting with different values; "
            "keep one");
  EXPECT_EQ(error_of(surogate + "output_dir: out\n"), "no error");  // the same value twice is no conflict
}

// The keys the second round of real peer configs brought (tests/test_peer_configs.cpp runs them).
TEST(Config, MorePeerKeys) {
  const TrainConfig c =
      parse_train_config(kBase +
                             "curriculum_sampling: true\ndataset_exact_deduplication: true\nmerge_adapter: true\n"
                             "gradient_checkpointing: offload\noptimizer: paged_adamw_32bit\nchat_template: qwen3\n"
                             "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
                             "lora_mlp_kernel: true\nsample_packing_sequentially: true\nrl:\n",
                         "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_FALSE(c.shuffle);
  EXPECT_TRUE(c.dataset_exact_deduplication);
  EXPECT_TRUE(c.merge_adapter);
  EXPECT_EQ(c.recompute, Recompute::Full);
  EXPECT_TRUE(c.offload_activations);  // "offload": the checkpoints in host memory, as Axolotl keeps them
  EXPECT_EQ(parse_train_config(kBase + "recompute_full: true\n", "cfg.yaml", {}, TrainMode::kSft).recompute,
            Recompute::Full);
  EXPECT_EQ(
      parse_train_config(kBase + "recompute: elementwise\nrecompute_full: false\n", "cfg.yaml", {}, TrainMode::kSft)
          .recompute,
      Recompute::Elementwise);
  EXPECT_EQ(c.moments, Moments::F32);
  EXPECT_EQ(c.chat_template, "qwen3");
  // Empty is off (or the default), as the peers read it.
  const TrainConfig e = parse_train_config(
      kBase + "curriculum_sampling:\nmerge_adapter:\noptimizer:\nsaves_per_epoch:\ngradient_checkpointing:\n",
      "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(e.shuffle);
  EXPECT_FALSE(e.merge_adapter);
  EXPECT_EQ(e.moments, Moments::F32);
  EXPECT_EQ(e.saves_per_epoch, 0);
  EXPECT_EQ(
      error_of(kBase + "plugins: [axolotl.integrations.kd.KDPlugin]\nrl: ebft\noptimizer: adamw_torch_4bit\n"),
      "cfg.yaml: 2 problems: cfg.yaml:6: plugins: \"axolotl.integrations.kd.KDPlugin\": Axolotl plugins are "
      "not supported; cfg.yaml:7: rl: \"ebft\": soltrain trains dpo, ipo, orpo, simpo, kto and grpo (other methods "
      "are not built yet)");
}

// Axolotl's default scheduler is cosine (Surogate's and soltrain's: linear): a config with Axolotl's base_model
// and no scheduler gets cosine, and says so; one with `model:` keeps linear. Packing, Axolotl's off by default, is
// said.
TEST(Config, AxolotlConfigsDefaultToCosine) {
  const std::string axolotl = "base_model: m\noutput_dir: out\ndatasets: [d.jsonl]\n";
  const TrainConfig a = parse_train_config(axolotl, "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(a.lr_scheduler_type, ScheduleType::kCosine);
  ASSERT_EQ(a.notes.size(), 2u);
  EXPECT_EQ(a.notes[1], "lr_scheduler is not given: cosine, Axolotl's default (the config uses Axolotl's base_model)");
  EXPECT_EQ(parse_train_config(axolotl + "lr_scheduler: linear\n", "cfg.yaml", {}, TrainMode::kSft).lr_scheduler_type,
            ScheduleType::kLinear);
  EXPECT_EQ(parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft).lr_scheduler_type, ScheduleType::kLinear);
  // Axolotl packs only when asked (sample_packing defaults to false there); soltrain packs, and says so.
  EXPECT_TRUE(a.sample_packing);
  EXPECT_EQ(a.notes[0],
            "sample_packing is not given: soltrain packs documents into rows (Axolotl's default is false, a row per "
            "document, which gives more and smaller steps: set sample_packing: false for that)");
  EXPECT_EQ(parse_train_config(axolotl + "sample_packing: true\n", "cfg.yaml", {}, TrainMode::kSft).notes.size(), 1u);
  EXPECT_TRUE(parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft).notes.empty());
}

// Axolotl's and HF's names for what soltrain has (issue "configs round 2", item 9), each as the peer reads it.
TEST(Config, PeerNamesForSoltrainsSettings) {
  auto parse = [](const std::string& extra) {
    return parse_train_config(kBase + extra, "cfg.yaml", {}, TrainMode::kSft);
  };
  // transformers reads a warmup_steps below 1 as a ratio
  const TrainConfig ratio = parse("warmup_steps: 0.1\n");
  EXPECT_EQ(ratio.warmup_ratio, 0.1);
  EXPECT_EQ(ratio.warmup_steps, 0);
  EXPECT_EQ(parse("warmup_steps: 30\n").warmup_steps, 30);
  EXPECT_EQ(error_of(kBase + "warmup_steps: 2.5\n"),
            "cfg.yaml:6: warmup_steps: \"2.5\" is not valid: expected an integer >= 0, or a ratio in (0, 1)");
  // YAML 1.1 digit groups, as PyYAML reads them; quoted, they stay a string
  EXPECT_EQ(parse("sequence_len: 500_000\nmin_sample_len: 200_000\n").sequence_len, 500000);
  EXPECT_EQ(parse("min_sample_len: 200_000\n").min_sample_len, 200000);
  for (const char* bad : {"\"500_000\"", "5__0", "_5", "5_"})
    EXPECT_NE(error_of(kBase + "sequence_len: " + bad + "\n").find("sequence_len: "), std::string::npos) << bad;
  // 0 evaluations / saves per epoch: none
  EXPECT_EQ(parse("evals_per_epoch: 0\nsaves_per_epoch: 0\n").evals_per_epoch, 0);
  // save_strategy: steps (the step settings decide), epoch (one a epoch), no; best is not built
  EXPECT_EQ(parse("save_strategy: epoch\n").saves_per_epoch, 1);
  EXPECT_EQ(parse("save_strategy: epoch\nsave_steps: 7\n").save_steps, 7);
  const TrainConfig no = parse("saves_per_epoch: 4\nsave_strategy: \"no\"\n");
  EXPECT_EQ(no.saves_per_epoch, 0);
  EXPECT_EQ(no.save_steps, 0);
  EXPECT_EQ(
      error_of(kBase + "save_strategy: best\n"),
      "cfg.yaml:6: save_strategy: \"best\": soltrain saves by steps, epoch or no (keeping the best checkpoint by a "
      "metric is not built yet)");
  // activation_offloading: the checkpoints in host memory with recompute full; disk is not built; without
  // gradient checkpointing it is refused, as Axolotl refuses it
  for (const char* v : {"true", "legacy", "hidden_states"}) {
    const TrainConfig a = parse(std::string("gradient_checkpointing: true\nactivation_offloading: ") + v + "\n");
    EXPECT_TRUE(a.offload_activations) << v;
    EXPECT_EQ(a.recompute, Recompute::Full) << v;
  }
  EXPECT_TRUE(parse("activation_offloading: true\ngradient_checkpointing: true\n").offload_activations);
  EXPECT_FALSE(parse("activation_offloading: false\n").offload_activations);
  EXPECT_EQ(error_of(kBase + "activation_offloading: disk\n"),
            "cfg.yaml:6: activation_offloading: \"disk\": offloading activations to disk is not built; use true");
  EXPECT_EQ(error_of(kBase + "activation_offloading: true\ngradient_checkpointing: false\n"),
            "cfg.yaml:6: activation_offloading needs recompute: full (it moves the layer-input checkpoints, the only "
            "activations full recompute keeps, to host memory); got recompute: none");
  // test_datasets is validation_datasets; alpaca:chat is alpaca_chat (Axolotl's base:prompt_style form)
  const TrainConfig t = parse(
      "test_datasets:\n  - path: v.jsonl\n    type: alpaca:chat\nremove_unused_columns: false\ntiled_mlp: true\n"
      "flash_attn_cross_entropy: false\nflash_attn_rms_norm: true\nflash_attn_fuse_mlp: true\neta_min: 7e-7\n");
  ASSERT_EQ(t.validation_datasets.size(), 1u);
  EXPECT_EQ(t.validation_datasets[0].type, DatasetType::kAlpacaChat);
  // excess_length_strategy: soltrain's configs cut long documents, Axolotl's (base_model) leave them out, as there
  EXPECT_EQ(parse("").overlong, OverlongPolicy::kTruncate);
  EXPECT_EQ(parse_train_config("base_model: m\noutput_dir: o\ndatasets: [d.jsonl]\n", "cfg.yaml", {}, TrainMode::kSft)
                .overlong,
            OverlongPolicy::kDrop);
  EXPECT_EQ(parse_train_config("base_model: m\noutput_dir: o\ndatasets: [d.jsonl]\nexcess_length_strategy: truncate\n",
                               "cfg.yaml", {}, TrainMode::kSft)
                .overlong,
            OverlongPolicy::kTruncate);
  EXPECT_EQ(parse("excess_length_strategy: raise\n").overlong, OverlongPolicy::kRaise);
  // Axolotl's batch_size: the accumulation is batch_size // micro_batch_size unless given
  EXPECT_EQ(parse("batch_size: 9\nmicro_batch_size: 2\n").gradient_accumulation_steps, 4);
  EXPECT_EQ(parse("batch_size: 9\nmicro_batch_size: 2\ngradient_accumulation_steps: 3\n").gradient_accumulation_steps,
            3);
  EXPECT_EQ(error_of(kBase + "micro_batch_size: 4\nbatch_size: 2\n"),
            "cfg.yaml:7: batch_size 2 is less than micro_batch_size 4: no whole accumulation step (it is "
            "micro_batch_size x gradient_accumulation_steps)");
  EXPECT_EQ(error_of(kBase + "max_packed_sequence_len: 2048\n"),
            "cfg.yaml:6: max_packed_sequence_len: no longer supported (Axolotl deprecated it): use sequence_len with "
            "sample_packing: true");
}

// FSDP and DeepSpeed settings as soltrain's ZeRO stage and offload switches (cli/peer_sharding.h), one note each
// config; what they cannot mean refused in one line naming the key.
TEST(Config, FsdpAndDeepspeedBecomeZeroStagesAndOffload) {
  auto parse = [](const std::string& extra) {
    return parse_train_config(kBase + extra, "cfg.yaml", {}, TrainMode::kSft);
  };
  struct Case {
    std::string yaml;
    int stage;
    bool master, optimizer;
  };
  for (const Case& k :
       {Case{"fsdp: [full_shard, auto_wrap]\n", 3, false, false},
        {"fsdp: \"shard_grad_op auto_wrap offload\"\n", 2, true, true},  // HF's one-string form
        {"fsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n", 0, false, false},
        {"fsdp_config:\n  sharding_strategy: 5\n", 2, false, false},  // _HYBRID_SHARD_ZERO2
        {"fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: false\n", 2, false, false},
        {"fsdp_version: 2\nfsdp_config:\n  offload_params: true\n", 3, true, true},  // FULL_SHARD
        {"deepspeed:\n  zero_optimization: {stage: 2, offload_optimizer: {device: cpu}}\n", 2, false, true},
        {"deepspeed: deepspeed_configs/zero3_bf16_cpuoffload_params.json\n", 3, true, false},
        {"deepspeed: deepspeed_configs/zero1.json\n", 1, false, false}}) {
    const TrainConfig c = parse(k.yaml);
    EXPECT_EQ(c.zero_stage, k.stage) << k.yaml;
    EXPECT_EQ(c.offload.master, k.master) << k.yaml;
    EXPECT_EQ(c.offload.optimizer, k.optimizer) << k.yaml;
    EXPECT_FALSE(c.offload_weights) << k.yaml;  // a full fine-tune: no frozen base to stream
    ASSERT_EQ(c.notes.size(), 1u) << k.yaml;
    EXPECT_NE(c.notes[0].find(cat("run as zero_stage: ", k.stage)), std::string::npos) << c.notes[0];
  }
  EXPECT_EQ(parse("fsdp: [full_shard]\n").notes[0],
            "fsdp (FULL_SHARD) run as zero_stage: 3 (the ranks are soltrain's own: gpus: N or mpirun; one rank "
            "shards nothing)");
  EXPECT_EQ(parse("fsdp: [full_shard]\ngpus: 4\n").notes[0],
            "fsdp (FULL_SHARD) run as zero_stage: 3 over the 4 "
            "ranks of gpus: 4");
  // FSDP's parameter offload in a LoRA run: the bf16 base streams from host memory too; an NF4 base stays
  const TrainConfig lora = parse("adapter: lora\nfsdp: [full_shard, offload]\n");
  EXPECT_TRUE(lora.offload_weights);
  EXPECT_NE(lora.notes[0].find("offload_master: true, offload_optimizer: true, offload_weights: true"),
            std::string::npos)
      << lora.notes[0];
  EXPECT_FALSE(parse("adapter: qlora\nfsdp: [full_shard, offload]\n").offload_weights);
  // Off values ask for nothing; activation_checkpointing is recompute full.
  EXPECT_TRUE(parse("fsdp:\nfsdp_config:\ndeepspeed:\nfsdp_version:\n").notes.empty());
  EXPECT_EQ(parse("fsdp_config:\n  activation_checkpointing: true\n").recompute, Recompute::Full);
  // A DeepSpeed file in the working folder is read; batch sizes given as numbers must be the config's.
  const std::string file = testing::TempDir() + "soltrain_ds_zero2.json";
  {
    std::ofstream f(file);
    f << R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
             "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "train_micro_batch_size_per_gpu": 1,
             "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}})";
  }
  const TrainConfig ds = parse("deepspeed: " + file + "\n");
  EXPECT_EQ(ds.zero_stage, 2);
  EXPECT_TRUE(ds.offload.optimizer);
  EXPECT_EQ(error_of(kBase + "deepspeed: " + file + "\nmicro_batch_size: 2\n"),
            file +
                ": train_micro_batch_size_per_gpu 1 differs from the config's 2 (micro_batch_size, "
                "gradient_accumulation_steps, gpus, max_grad_norm): set \"auto\" there or make them agree");
  // Refused, one line each.
  EXPECT_EQ(error_of(kBase + "fsdp: [quarter_shard]\n"),
            "cfg.yaml:6: fsdp: \"QUARTER_SHARD\" is not valid: expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
            "HYBRID_SHARD or _HYBRID_SHARD_ZERO2");
  EXPECT_EQ(error_of(kBase + "fsdp_config:\n  fsdp_mixed_precision: true\n"),
            "cfg.yaml:6: fsdp_config.fsdp_mixed_precision: not an FSDP setting soltrain knows (it reads "
            "sharding_strategy, reshard_after_forward, offload_params, activation_checkpointing)");
  EXPECT_EQ(error_of(kBase + "deepspeed: missing/zero3.json\n"),
            "cfg.yaml:6: deepspeed: missing/zero3.json: no such file (soltrain reads its zero_optimization stage "
            "and offloads; paths open from the working folder)");
  EXPECT_EQ(error_of(kBase + "deepspeed:\n  zero_optimization: {stage: 3, offload_param: {device: nvme}}\n"),
            "cfg.yaml:6: deepspeed: inline: zero_optimization.offload_param.device nvme: NVMe offload is not built "
            "(use cpu)");
  EXPECT_EQ(error_of(kBase + "deepspeed:\n  optimizer: {type: AdamW, params: {lr: 0.001}}\n"),
            "cfg.yaml:6: deepspeed: inline: optimizer.params.lr is 0.001: soltrain takes the optimizer and schedule "
            "from the config (set them there; \"auto\" here)");
  EXPECT_EQ(error_of(kBase + "fsdp: [full_shard]\nzero_stage: 2\n"),
            "cfg.yaml:7: zero_stage 2 differs from the ZeRO-3 that fsdp asks for: keep one of them");
}

TEST(Config, CosineFloor) {
  EXPECT_EQ(
      parse_train_config(kBase + "cosine_min_lr_ratio: 0.1\n", "cfg.yaml", {}, TrainMode::kSft).cosine_min_lr_ratio,
      0.1);
  EXPECT_EQ(error_of(kBase + "cosine_min_lr_ratio: 2\n"),
            "cfg.yaml:6: cosine_min_lr_ratio: \"2\" is not valid: expected a number in [0, 1]");
  EXPECT_EQ(error_of(kBase + "cosine_min_lr_ratio: 0.1\ncosine_constant_lr_ratio: 0.8\n"),
            "cfg.yaml:7: cosine_constant_lr_ratio: a constant learning rate at the cosine floor for the last part of "
            "training is not built yet; drop it (the cosine then reaches its floor at the end)");
  EXPECT_EQ(error_of(kBase + "cosine_min_lr_ratio: 0\ncosine_constant_lr_ratio: 0.8\n"), "no error");
}

TEST(Config, EmptyFalseOrAlreadyDoneSettingsAreAccepted) {
  EXPECT_EQ(error_of(kBase + "wandb_project:\nwandb_entity:\nmlflow_tracking_uri:\ndeepspeed:\nfsdp:\n"
                             "fsdp_config:\nfp16: false\nbf16: auto\ntf32: false\nstrict: false\n"
                             "load_in_4bit: false\nflash_attention: true\nhub_model_id:\n"
                             "special_tokens:\n  pad_token: x\nlora_model_dir:\n"),
            "no error");
}

TEST(Config, MissingFeaturesAreNamedInOneLine) {
  EXPECT_EQ(error_of(kBase + "load_in_8bit: true\n"),
            "cfg.yaml:6: load_in_8bit: a quantised base is frozen, so it trains LoRA adapters only (QLoRA): add "
            "`adapter: lora`, or drop it for full fine-tuning in bf16/fp32");
  EXPECT_EQ(error_of(kBase + "load_in_8bit: true\nload_in_4bit: true\nadapter: lora\n"),
            "cfg.yaml:7: load_in_4bit asks for a nf4 base but load_in_8bit for int8; keep one");
  EXPECT_EQ(error_of(kBase + "load_in_4bit: true\n"),
            "cfg.yaml:6: load_in_4bit: a quantised base is frozen, so it trains LoRA adapters only (QLoRA): add "
            "`adapter: lora`, or drop it for full fine-tuning in bf16/fp32");
  // QAT (model/qat.h): the schemes torchao's QAT has that soltrain does not build are each one line
  EXPECT_EQ(error_of(kBase + "qat:\n  weight_dtype: int4\n  group_size: 32\n"),
            "cfg.yaml:6: qat: int4 weights train with activation_dtype int8 here; without it torchao's int4 QAT casts "
            "each weight row to fp8 first (its fp8-activation scheme), which is not built");
  EXPECT_EQ(error_of(kBase + "qat:\n  weight_dtype: float8_e4m3fn\n  activation_dtype: float8_e4m3fn\n"),
            "cfg.yaml:6: qat: weight_dtype float8_e4m3fn is not built: soltrain's QAT fake-quantises int4 (with int8 "
            "activations), mxfp4 or nvfp4");
  EXPECT_EQ(error_of(kBase + "gptq: true\n"), "cfg.yaml:6: gptq: GPTQ-quantised base weights are not supported");
  // Axolotl's context and tensor parallel sizes: 1 (or absent) is what soltrain does; more is one line
  EXPECT_EQ(error_of(kBase + "context_parallel_size: 1\nheads_k_stride: 1\ntensor_parallel_size: 1\n"), "no error");
  EXPECT_EQ(error_of(kBase + "context_parallel_size: 2\nheads_k_stride: 1\nring_attn_func: varlen_llama3\n"),
            "cfg.yaml:6: context_parallel_size: context parallelism is not built yet; soltrain fits long sequences on "
            "one GPU (recompute, offload_activations, token tiles)");
  EXPECT_EQ(error_of(kBase + "tensor_parallel_size: 2\n"),
            "cfg.yaml:6: tensor_parallel_size: tensor parallelism is not built yet; zero_stage: 3 (fsdp) shards the "
            "weights over the GPUs");
  EXPECT_EQ(error_of(kBase + "qat:\n"), "no error");
  EXPECT_EQ(error_of(kBase + "optimizer: lion_8bit\n"),
            "cfg.yaml:6: optimizer: \"lion_8bit\": not supported; use optimizer: adamw_torch (fp32 moments), "
            "adamw_8bit, adamw_torch_8bit, adamw_torch_4bit, muon or normuon");
  EXPECT_EQ(error_of(kBase + "tokenizer_use_mistral_common: true\n"), "no error");  // (tests/test_tekken.cpp)
  EXPECT_EQ(error_of(kBase + "tokenizer_use_mistral_common: true\nchat_template: chatml\n"),
            "cfg.yaml:7: chat_template is not supported with tokenizer_use_mistral_common (the tokens and chat format "
            "are mistral-common's; Axolotl refuses it too)");
  EXPECT_EQ(error_of(kBase + "relora: true\n"), "cfg.yaml:6: relora: ReLoRA is not built yet");
  EXPECT_EQ(error_of(kBase + "dp_shard_size: 2\n"),
            "cfg.yaml:6: dp_shard_size: Axolotl's N-D parallelism is not built; zero_stage: 3 shards over every GPU "
            "(gpus: N)");
  EXPECT_EQ(error_of(kBase + "optimizer: muon_8bit\n"),
            "cfg.yaml:6: optimizer: \"muon_8bit\": not built yet; optimizer: muon is");
  EXPECT_EQ(error_of(kBase + "optimizer: normuon\nzero_stage: 2\n"), "no error");  // (refused over several ranks)
  EXPECT_EQ(error_of(kBase + "optimizer: muon\noffload_optimizer: true\n"),
            "cfg.yaml:6: optimizer: muon with offloaded optimizer state is not built yet");
  EXPECT_EQ(error_of(kBase + "recipe: fp8_hybrid\n"),
            "cfg.yaml:6: recipe: \"fp8_hybrid\": soltrain's recipes are bf16 and fp8-hybrid");
  EXPECT_EQ(error_of(kBase + "gradient_checkpointing: sometimes\n"),
            "cfg.yaml:6: gradient_checkpointing: \"sometimes\" is not valid: expected true or false");
}

TEST(Config, EveryProblemIsReportedAtOnce) {
  EXPECT_EQ(error_of("model: m\nlearning_rat: 1e-4\ndeepspeed: ds.json\nsequence_len: -3\nmodel: n\n"),
            "cfg.yaml: 6 problems: cfg.yaml:5: key \"model\" appears twice (also at cfg.yaml:1); keep one; "
            "cfg.yaml:2: unknown key \"learning_rat\" (did you mean \"learning_rate\"?); "
            "cfg.yaml:3: deepspeed: ds.json: no such file (soltrain reads its zero_optimization stage and offloads; "
            "paths open from the working folder); "
            "cfg.yaml:4: sequence_len: \"-3\" is not valid: expected an integer from 2 to 16777216; "
            "cfg.yaml: `output_dir` is required; cfg.yaml: `datasets` is required (a list of {path, type})");
}

TEST(Config, EveryDatasetProblemIsReportedToo) {
  EXPECT_EQ(error_of("model: m\noutput_dir: o\ndatasets: d.jsonl\n"), "no error");  // one dataset, not a list
  EXPECT_EQ(error_of("model: m\noutput_dir: o\ndatasets: {path: d.jsonl, type: text}\n"), "no error");
  EXPECT_EQ(error_of("model: m\noutput_dir: o\ndatasets:\n  - path: a\n    typ: text\n    samples: 0\n"
                     "  - type: text\n    field_txt: t\n"),
            "cfg.yaml: 4 problems: cfg.yaml:5: unknown dataset key \"typ\" (did you mean \"type\"?); cfg.yaml:6: "
            "samples: \"0\" is not valid: expected an integer >= 1; "
            "cfg.yaml:8: unknown dataset key \"field_txt\" (did you mean \"field_text\"?); cfg.yaml:7: a dataset "
            "needs `path`");
}

TEST(Config, EmptyRequiredKeysAreStillMissing) {
  EXPECT_EQ(error_of("model: m\noutput_dir: o\ndatasets: []\n"),
            "cfg.yaml: `datasets` is required (a list of {path, type})");
  EXPECT_EQ(error_of("model:\noutput_dir: o\ndatasets: [d]\n"),
            "cfg.yaml: `model` is required (a Hugging Face model folder)");
}

TEST(Config, LoraSettingsWithoutAdapterMeanLora) {
  const TrainConfig c = parse_train_config(kBase + "lora_rank: 8\nlora_alpha: 16\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(c.lora.enabled);
  EXPECT_EQ(c.lora.rank, 8);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("training a LoRA adapter"), std::string::npos);
  // Said off, or said nothing: as given.
  EXPECT_FALSE(parse_train_config(kBase + "lora: false\nlora_r: 8\n", "cfg.yaml", {}, TrainMode::kSft).lora.enabled);
  EXPECT_FALSE(parse_train_config(kBase + "lora_r:\nadapter:\n", "cfg.yaml", {}, TrainMode::kSft).lora.enabled);
  EXPECT_TRUE(parse_train_config(kBase + "adapter: lora\n", "cfg.yaml", {}, TrainMode::kSft).notes.empty());
  EXPECT_FALSE(parse_train_config(kBase + "lora_target_linear: false\n", "cfg.yaml", {}, TrainMode::kSft).lora.enabled);
  EXPECT_TRUE(parse_train_config(kBase + "lora_target_linear: true\n", "cfg.yaml", {}, TrainMode::kSft).lora.enabled);
}

// Offload settings (Surogate's names) and the combinations not built, each refused with one line.
TEST(Config, OffloadKeys) {
  const TrainConfig c =
      parse_train_config(kBase + "offload_master: true\noffload_optimizer: true\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(c.offload.master);
  EXPECT_TRUE(c.offload.optimizer);
  const TrainConfig d = parse_train_config(kBase, "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_FALSE(d.offload.master);
  EXPECT_FALSE(d.offload.optimizer);
  const TrainConfig o = parse_train_config(kBase + "offload_optimizer: true\noffload_master: false\nzero_stage: 0\n",
                                           "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(o.offload.optimizer);
  EXPECT_FALSE(o.offload.master);
  EXPECT_EQ(error_of(kBase + "offload_master: maybe\n"),
            "cfg.yaml:6: offload_master: \"maybe\" is not valid: expected true or false");
  // (the sharded update streams its shard too: tests/test_data_parallel.cpp)
  EXPECT_EQ(error_of(kBase + "offload_optimizer: true\noffload_master: true\nzero_stage: 2\n"), "no error");
  EXPECT_EQ(error_of(kBase + "offload_master: true\noffload_optimizer: true\noptimizer: adamw_8bit\n"), "no error");
  // Surogate's residual offload: refused, naming soltrain's key for it.
  EXPECT_EQ(error_of(kBase + "offload_residual: true\n"),
            "cfg.yaml:6: offload_residual: use offload_activations: true with recompute: full (soltrain's name; it "
            "offloads the layer-input checkpoints, the residual stream full recompute keeps)");
  // offload_grads: a key now (train/grad_offload.h); with the sharded update, refused.
  EXPECT_TRUE(parse_train_config(kBase + "offload_grads: true\n", "cfg.yaml", {}, TrainMode::kSft).offload.grads);
  EXPECT_EQ(error_of(kBase + "offload_grads: true\nzero_stage: 1\n"),
            "cfg.yaml:6: offload_grads with zero_stage 1 is not built yet (each rank's gradients are reduced on the "
            "device): use zero_stage: 0 or drop offload_grads");
}

// Surogate's DPO `loss:` block: dpo_beta is beta; its variants are refused by name, not dropped; Surogate's
// train_vision (off) and debug_memory_breakdown are accepted.
TEST(Config, SurogatesDpoLossBlock) {
  const auto dpo = [](const std::string& extra) {
    return parse_train_config("model: m\noutput_dir: out\ndatasets: [pairs.jsonl]\n" + extra, "cfg.yaml", {},
                              TrainMode::kDpo);
  };
  const TrainConfig c =
      dpo("loss: {type: dpo, dpo_beta: 0.25, length_norm: false, target_margin: 0}\n"
          "train_vision: false\ndebug_memory_breakdown: true\n");
  EXPECT_DOUBLE_EQ(c.dpo.beta, 0.25);
  EXPECT_TRUE(c.dpo.beta_given);
  const auto error = [&](const std::string& extra) {
    try {
      dpo(extra);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("loss: {length_norm: true}\n").find("loss.length_norm: true is not built"), std::string::npos);
  EXPECT_NE(error("loss: {reference_free: true}\n").find("loss.reference_free: true is not built"), std::string::npos);
  EXPECT_NE(error("loss: {typo: 1}\n").find("loss.typo is not a key of Surogate's DPO block"), std::string::npos);
  EXPECT_NE(error("loss: sigmoid\n").find("TRL's loss_type names the loss"), std::string::npos);
  EXPECT_NE(error("train_vision: true\n").find("training a vision encoder is not built"), std::string::npos);
  // Axolotl's default_system_message: accepted, the note saying it changes nothing (as in Axolotl)
  const TrainConfig s =
      parse_train_config(kBase + "default_system_message: Be brief.\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(std::any_of(s.notes.begin(), s.notes.end(),
                          [](const std::string& n) { return n.find("default_system_message: no effect") == 0; }));
}

}  // namespace
}  // namespace soltrain

namespace soltrain {
namespace {

// Axolotl infers tokenizer_use_mistral_common for a Magistral model (its validator: "magistral" in the model's
// name) and says so; given false it stays off; edits of the tokenizer are refused with it, as Axolotl's are.
TEST(Config, MistralCommonIsInferredForMagistralAsAxolotlDoes) {
  const std::string rest = "output_dir: out\ndatasets:\n  - path: d.jsonl\n    type: conversation\n";
  const TrainConfig m =
      parse_train_config("model: models/Magistral-Small-2506\n" + rest, "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(m.mistral_common);
  EXPECT_NE(std::find(m.notes.begin(), m.notes.end(),
                      "tokenizer_use_mistral_common: true for a Magistral model, as Axolotl infers it (set it false "
                      "to use the repository's tokenizer.json)"),
            m.notes.end());
  EXPECT_FALSE(parse_train_config("model: models/Magistral-Small-2506\ntokenizer_use_mistral_common: false\n" + rest,
                                  "cfg.yaml", {}, TrainMode::kSft)
                   .mistral_common);
  EXPECT_FALSE(
      parse_train_config("model: models/Ministral-8B\n" + rest, "cfg.yaml", {}, TrainMode::kSft).mistral_common);
  EXPECT_EQ(error_of("model: models/magistral\n" + rest + "tokens: [\"<x>\"]\n"),
            "cfg.yaml:6: tokens is not supported with tokenizer_use_mistral_common (the tokens and chat format are "
            "mistral-common's; Axolotl refuses it too)");
}

}  // namespace
}  // namespace soltrain

namespace soltrain {
namespace {

bool has_note(const TrainConfig& c, const std::string& text) {
  return std::find(c.notes.begin(), c.notes.end(), text) != c.notes.end();
}

// Axolotl's keys for what it does through transformers' loading (its llama-2/gptq-lora.yml and cerebras examples):
// lr_quadratic_warmup on its cosine schedule; torch_dtype and adam_eps have no effect there (a note says so);
// the slow tokenizer, its non-legacy mode and a device map are one line each, naming the feature.
TEST(Config, AxolotlLoadingKeys) {
  const TrainConfig c = parse_train_config(
      kBase +
          "lr_scheduler: cosine\nlr_quadratic_warmup: true\ntorch_dtype: float16\nadam_eps: 1.0e-5\n"
          "tokenizer_use_fast: true\ntokenizer_legacy: true\nhf_use_auth_token: true\nflash_optimum: true\n"
          "device_map: auto\nddp: true\ngptq_disable_exllama: true\n",
      "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(c.quadratic_warmup);
  EXPECT_EQ(c.adamw_epsilon, 1e-8);
  EXPECT_TRUE(has_note(c,
                       "torch_dtype: no effect, as in Axolotl (it sets the dtype from bf16 / fp16); soltrain "
                       "computes in bf16"));
  EXPECT_TRUE(has_note(c, "adam_eps: no effect, as in Axolotl (its key is adam_epsilon); the default epsilon stands"));
  const TrainConfig linear =
      parse_train_config(kBase + "lr_scheduler: linear\nlr_quadratic_warmup: true\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_FALSE(linear.quadratic_warmup);
  EXPECT_TRUE(has_note(linear,
                       "lr_quadratic_warmup: no effect with lr_scheduler linear (Axolotl applies it to cosine "
                       "only)"));
  EXPECT_EQ(error_of(kBase + "tokenizer_use_fast: false\n"),
            "cfg.yaml:6: tokenizer_use_fast: false: the slow (sentencepiece) tokenizer is not built; soltrain "
            "tokenizes with the model's tokenizer.json, the fast tokenizer's file");
  EXPECT_EQ(error_of(kBase + "tokenizer_legacy: false\n"),
            "cfg.yaml:6: tokenizer_legacy: false: the sentencepiece tokenizer's non-legacy mode is not built; "
            "soltrain tokenizes as the model's tokenizer.json says");
  EXPECT_EQ(error_of(kBase + "device_map: {\"\": 0}\n"),
            "cfg.yaml:6: device_map: {\"\": 0}: soltrain places the model itself (device, gpus, offload_params); a "
            "device map is not built");
}

}  // namespace
}  // namespace soltrain

namespace soltrain {
namespace {

// A Ray job's settings as the launcher gets them (python/soltrain/ray.py reads them through the module): Axolotl's
// keys, Surogate's block (num_nodes x gpus_per_node; 0 = gpus, read after every key; one node is a local run), the
// default resources, and what a Ray job cannot run, each one line.
TEST(Config, RayJobs) {
  const TrainConfig a =
      parse_train_config(kBase + "use_ray: true\nray_num_workers: 4\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(a.ray.enabled);
  EXPECT_EQ(a.ray.num_workers, 4);
  EXPECT_EQ(a.ray.resources, (std::map<std::string, double>{{"CPU", 1.0}}));  // (device: cpu here)
  const TrainConfig b = parse_train_config(kBase + "distributed:\n  num_nodes: 2\n  gpus_per_node: 0\ngpus: 4\n",
                                           "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(b.ray.enabled);
  EXPECT_EQ(b.ray.num_workers, 8);
  EXPECT_EQ(b.ray.address, "auto");
  EXPECT_EQ(b.ray.resources, (std::map<std::string, double>{{"GPU", 1.0}}));
  EXPECT_FALSE(
      parse_train_config(kBase + "distributed:\n  num_nodes: 1\n", "cfg.yaml", {}, TrainMode::kSft).ray.enabled);
  EXPECT_EQ(error_of(kBase + "use_ray: true\nauto_resume: true\n"),
            "cfg.yaml:6: auto_resume with Ray is not built (Ray restarts no soltrain job)");
  EXPECT_NE(error_of(kBase + "use_ray: true\nrl: dpo\n").find("cfg.yaml:6: a Ray job runs sft and pt for now"),
            std::string::npos);
  EXPECT_EQ(error_of(kBase + "resources_per_worker: [1]\n"),
            "cfg.yaml:6: resources_per_worker: expected a map of Ray resources to amounts, e.g. {GPU: 1}");
  EXPECT_EQ(error_of(kBase + "distributed:\n  nodes: 2\n"),
            "cfg.yaml:6: distributed.nodes: unknown key (Surogate's distributed block has ray_address, num_nodes, "
            "gpus_per_node)");
}

}  // namespace
}  // namespace soltrain
