// GRPO's pieces that need no reference model: the built-in rewards' answer extraction and comparison, the
// advantages' edge cases (unscored completions, a group of equal rewards), and the config's GRPO keys, their
// defaults and their errors. The loss itself is checked against TRL live (python/tests/test_grpo_loss.py), the
// whole run on a task in python/tests/test_grpo_run.py.
#include <gtest/gtest.h>

#include <cmath>

#include "cli/config.h"
#include "core/error.h"
#include "model/grpo_objective.h"
#include "train/grpo_rewards.h"

namespace soltrain {
namespace {

TEST(GrpoRewards, AccuracyExtractsAndNormalisesAnswers) {
  EXPECT_EQ(extract_answer("so the answer is \\boxed{\\frac{1}{2}} indeed", false), "\\frac{1}{2}");
  EXPECT_EQ(extract_answer("a \\boxed{3} then \\boxed{4}", true), "4");
  EXPECT_EQ(extract_answer("work...\n#### 1,234", true), "1,234");
  EXPECT_EQ(extract_answer("I think 12 apples, no, 15.", true), "15");
  EXPECT_EQ(extract_answer("  Paris. ", false), "Paris.");
  EXPECT_TRUE(answers_match("1,234", "1234"));
  EXPECT_TRUE(answers_match("$15", "15.0"));
  EXPECT_TRUE(answers_match("Paris.", "  paris"));
  EXPECT_FALSE(answers_match("14", "15"));
  EXPECT_FALSE(answers_match("paris france", "paris"));

  RewardRequest r;
  r.completions = {"<think>2+2</think> \\boxed{4}", "it is 5", "four", "x"};
  r.records = {{{"answer", "4"}}, {{"answer", 4}}, {{"solution", "Four"}}, {{"other", 1}}};
  const std::vector<double> acc = builtin_reward("accuracy", r);
  EXPECT_EQ(acc[0], 1.0);
  EXPECT_EQ(acc[1], 0.0);
  EXPECT_EQ(acc[2], 1.0);
  EXPECT_TRUE(std::isnan(acc[3]));  // no reference: not scored (TRL's None)
  const std::vector<double> fmt = builtin_reward("think_format", r);
  EXPECT_EQ(fmt, (std::vector<double>{1.0, 0.0, 0.0, 0.0}));
}

TEST(GrpoAdvantages, UnscoredCompletionsAndEqualGroups) {
  const double nan = std::nan("");
  std::vector<bool> zero;
  // group 1: 1, 3, unscored; group 2: all 2 (std 0)
  const std::vector<float> a = grpo_advantages(std::vector<double>{1, 3, nan, 2, 2, 2}, 3, ScaleRewards::Group, &zero);
  const double s = std::sqrt(2.0);  // unbiased std of {1, 3}
  EXPECT_NEAR(a[0], -1 / (s + 1e-4), 1e-6);
  EXPECT_NEAR(a[1], 1 / (s + 1e-4), 1e-6);
  EXPECT_EQ(a[2], 0.0f);
  EXPECT_EQ(a[3], 0.0f);
  EXPECT_EQ(zero, (std::vector<bool>{false, false, false, true, true, true}));
  const std::vector<float> none = grpo_advantages(std::vector<double>{1, 3, 5, 7}, 2, ScaleRewards::None);
  EXPECT_EQ(none, (std::vector<float>{-1, 1, -1, 1}));
}

const std::string kGrpo =
    "model: m\noutput_dir: out\ndatasets:\n  - path: p.jsonl\nreward_funcs: [accuracy]\n"
    "per_device_train_batch_size: 8\nnum_generations: 4\n";

std::string error_of(const std::string& yaml, TrainMode mode = TrainMode::kGrpo) {
  try {
    parse_train_config(yaml, "cfg.yaml", {}, mode);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(GrpoConfig, TrlDefaultsAndSharedKeys) {
  const TrainConfig c =
      parse_train_config(kGrpo + "epsilon: 0.1\nmax_completion_length: 64\n", "cfg.yaml", {}, TrainMode::kGrpo);
  EXPECT_TRUE(c.grpo.enabled);
  EXPECT_EQ(c.grpo.loss.loss_type, GrpoLossType::Dapo);
  EXPECT_FLOAT_EQ(c.grpo.loss.epsilon_high, 0.1f);  // follows epsilon unless given
  EXPECT_EQ(c.grpo.loss.beta, 0.0f);
  EXPECT_TRUE(c.grpo.loss.kl_ratio);
  EXPECT_EQ(c.sequence_len, 512 + 64);  // max_prompt_length + max_completion_length
  // loss_type and beta are TRL's names in both trainers: a grpo run reads them as GRPO's
  const TrainConfig d =
      parse_train_config(kGrpo + "loss_type: dr_grpo\nbeta: 0.04\nlora: true\n", "cfg.yaml", {}, TrainMode::kGrpo);
  EXPECT_EQ(d.grpo.loss.loss_type, GrpoLossType::DrGrpo);
  EXPECT_FLOAT_EQ(d.grpo.loss.beta, 0.04f);
  EXPECT_DOUBLE_EQ(d.dpo.beta, 0.1);
  // Axolotl's rl: grpo turns an sft config into a grpo run
  const TrainConfig e = parse_train_config(kGrpo + "rl: grpo\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_TRUE(e.grpo.enabled);
  // TRL's sampling keys reach the sampler's settings; the generation budget is read.
  const TrainConfig s = parse_train_config(
      kGrpo + "top_k: 20\ntop_p: 0.9\nmin_p: 0.05\nrepetition_penalty: 1.1\ngeneration_memory_gib: 12\n", "cfg.yaml",
      {}, TrainMode::kGrpo);
  EXPECT_EQ(s.grpo.top_k, 20);
  EXPECT_DOUBLE_EQ(s.grpo.min_p, 0.05);
  EXPECT_DOUBLE_EQ(s.grpo.repetition_penalty, 1.1);
  EXPECT_DOUBLE_EQ(s.grpo.generation_memory_gib, 12);
  // Stop strings: soltrain's key, and TRL's generation_kwargs (vLLM's `stop`, transformers' `stop_strings`).
  const TrainConfig st =
      parse_train_config(kGrpo + "stop_strings: [\"</answer>\", \"\\n\\n\"]\n", "cfg.yaml", {}, TrainMode::kGrpo);
  EXPECT_EQ(st.grpo.stop_strings, (std::vector<std::string>{"</answer>", "\n\n"}));
  for (const char* k : {"stop", "stop_strings"}) {
    const TrainConfig gk = parse_train_config(kGrpo + "generation_kwargs:\n  " + k + ": [\"</answer>\"]\n", "cfg.yaml",
                                              {}, TrainMode::kGrpo);
    EXPECT_EQ(gk.grpo.stop_strings, std::vector<std::string>{"</answer>"}) << k;
  }
  EXPECT_EQ(parse_train_config(kGrpo + "generation_kwargs: {stop: END}\n", "cfg.yaml", {}, TrainMode::kGrpo)
                .grpo.stop_strings,
            std::vector<std::string>{"END"});
  // SFT's batching keys in a grpo config (copied from an sft one) are said not to apply, not silently dropped.
  const TrainConfig sp =
      parse_train_config(kGrpo + "sample_packing: true\ntrain_on_inputs: true\n", "cfg.yaml", {}, TrainMode::kGrpo);
  for (const char* k : {"sample_packing", "train_on_inputs"})
    EXPECT_EQ(std::count_if(sp.notes.begin(), sp.notes.end(),
                            [&](const std::string& n) { return n.starts_with(k) && n.ends_with("not used"); }),
              1)
        << k;
  // TRL's correction for the generation engine's log-probs: off by default; use_vllm turns it on with TRL's defaults
  // (sequence_mask, clip_max 3, no clip_min) unless it is turned off; its keys are read, the older cap too.
  auto parse = [&](const std::string& extra) {
    return parse_train_config(kGrpo + extra, "cfg.yaml", {}, TrainMode::kGrpo).grpo.loss;
  };
  EXPECT_EQ(parse("").sampling_correction, SamplingCorrection::None);
  const GrpoConfig v = parse("use_vllm: true\n");
  EXPECT_EQ(v.sampling_correction, SamplingCorrection::SequenceMask);
  EXPECT_FLOAT_EQ(v.sampling_clip_max, 3.0f);
  EXPECT_TRUE(std::isnan(v.sampling_clip_min));
  EXPECT_EQ(parse("use_vllm: true\nvllm_importance_sampling_correction: false\n").sampling_correction,
            SamplingCorrection::None);
  const GrpoConfig t = parse(
      "vllm_importance_sampling_correction: true\nvllm_importance_sampling_mode: token_truncate\n"
      "vllm_importance_sampling_clip_min: 0.5\nvllm_importance_sampling_cap: 2\n");
  EXPECT_EQ(t.sampling_correction, SamplingCorrection::TokenTruncate);
  EXPECT_FLOAT_EQ(t.sampling_clip_min, 0.5f);
  EXPECT_FLOAT_EQ(t.sampling_clip_max, 2.0f);
}

TEST(GrpoConfig, ErrorsNameTheKey) {
  const std::string no_gen = kGrpo.substr(0, kGrpo.find("num_generations"));
  EXPECT_NE(error_of(no_gen + "num_generations: 3\n").find("not a multiple of num_generations 3"), std::string::npos);
  EXPECT_NE(error_of("model: m\noutput_dir: out\ndatasets:\n  - path: p.jsonl\n").find("reward_funcs is required"),
            std::string::npos);
  EXPECT_EQ(error_of(kGrpo + "beta: 0.1\n"), "no error");  // full fine-tuning keeps a frozen copy as the reference
  EXPECT_NE(error_of(kGrpo + "beta: 0.1\nrecipe: fp8-hybrid\n").find("with full fine-tuning and the fp8-hybrid recipe"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "loss_type: sigmoid\n").find("loss_type 'sigmoid' is not one of grpo, bnpo"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "reward_weights: [1, 2]\n").find("reward_weights has 2 values for 1 reward_funcs"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo, TrainMode::kSft).find("is a GRPO key: run `soltrain grpo` or set rl: grpo"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "rl: dpo\n").find("rl: dpo in a grpo run"), std::string::npos);
  EXPECT_NE(error_of(kGrpo + "generation_memory_gib: 4\ngeneration_memory_fraction: 0.3\n")
                .find("give one of generation_memory_gib and generation_memory_fraction"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "min_p: 1.5\n").find("min_p"), std::string::npos);
  EXPECT_NE(error_of(kGrpo + "use_vllm: true\nvllm_importance_sampling_clip_min: 2\n"
                             "vllm_importance_sampling_clip_max: 1.5\n")
                .find("vllm_importance_sampling_clip_min 2 is above vllm_importance_sampling_clip_max 1.5"),
            std::string::npos);
  EXPECT_NE(
      error_of(kGrpo + "use_vllm: true\nvllm_importance_sampling_mode: clip\n").find("vllm_importance_sampling_mode"),
      std::string::npos);
  EXPECT_NE(error_of(kGrpo + "repetition_penalty: 0\n").find("repetition_penalty"), std::string::npos);
  // What a grpo run does not read is refused, not ignored.
  EXPECT_NE(error_of(kGrpo + "validation_datasets:\n  - path: v.jsonl\n").find("is not evaluated by grpo runs yet"),
            std::string::npos);
  EXPECT_NE(error_of("model: m\noutput_dir: out\ndatasets:\n  - path: p.jsonl\n    type: conversation\n"
                     "reward_funcs: [accuracy]\nper_device_train_batch_size: 8\nnum_generations: 4\n")
                .find("datasets[0]: type is not read by grpo runs"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "chat_template: chatml\n").find("grpo renders prompts with the model's own template"),
            std::string::npos);
  // generation_kwargs: what is not a stop string is named in one line; empty stop strings are refused.
  EXPECT_NE(error_of(kGrpo + "generation_kwargs: {top_p: 0.9}\n")
                .find("generation_kwargs.top_p: give it as the top-level key top_p"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "generation_kwargs: {max_tokens: 9}\n").find("top-level key max_completion_length"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "generation_kwargs: {n: 2}\n").find("generation_kwargs.n: not read by soltrain"),
            std::string::npos);
  EXPECT_NE(error_of(kGrpo + "generation_kwargs: {stop: [\"\"]}\n").find("an empty stop string"), std::string::npos);
  EXPECT_NE(error_of(kGrpo + "stop_strings: [\"\"]\n").find("stop_strings"), std::string::npos);
  // TRL's entropy bonus changes the loss: refused unless at its defaults; top_entropy_quantile is read.
  EXPECT_EQ(error_of(kGrpo + "top_entropy_quantile: 1.0\nentropy_coef: 0.0\nuse_adaptive_entropy: false\n"),
            "no error");
  EXPECT_FLOAT_EQ(parse_train_config(kGrpo + "top_entropy_quantile: 0.2\n", "cfg.yaml", {}, TrainMode::kGrpo)
                      .grpo.loss.top_entropy_quantile,
                  0.2f);
  EXPECT_NE(error_of(kGrpo + "top_entropy_quantile: 1.5\n").find("top_entropy_quantile"), std::string::npos);
  EXPECT_NE(error_of(kGrpo + "entropy_coef: 0.01\n").find("entropy_coef: the entropy bonus is not built yet"),
            std::string::npos);
}

}  // namespace
}  // namespace soltrain
