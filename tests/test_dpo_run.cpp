// `soltrain dpo` end to end on CPU: the demo's word reversal as preference pairs (chosen = the reversed word,
// rejected = a near miss) takes rewards/accuracies on separately drawn pairs from 0 (policy = reference: no
// pair won) to high, with LoRA and full fine-tuning; `rl: dpo` in an sft config runs the same; the reference
// sums of full fine-tuning are stored once and reused; bad records follow bad_records.
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "data_test_util.h"
#include "train/run_dpo.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

struct DpoSetup {
  test::TempDir t;
  DpoSetup() {
    DemoModelShape s;
    s.hidden = 64, s.layers = 2, s.heads = 2, s.kv_heads = 1, s.head_dim = 32, s.intermediate = 128;
    write_random_model(t.path / "model", s, 7);
    write_reversal_preferences(t.path / "train.jsonl", 400, 8);
    write_reversal_preferences(t.path / "val.jsonl", 64, 9);
  }
  fs::path config(const std::string& out, const std::string& extra) const {
    const fs::path p = t.path / (out + ".yaml");
    test::write_text(p, test::yaml_with("model: model\noutput_dir: " + out +
                                            "\ndatasets:\n  - path: train.jsonl\n"
                                            "validation_datasets: [{path: val.jsonl}]\n"
                                            "dataset_prepared_path: prepared\nsequence_len: 48\n"
                                            "per_device_train_batch_size: 8\nlearning_rate: 3.0e-3\n"
                                            "lr_scheduler_type: constant\nlogging_steps: 10\nbeta: 0.1\n",
                                        extra));
    return p;
  }
};

// The metrics.jsonl lines that hold `key` (eval_rewards/accuracies: the evaluations; learning_rate: the steps).
std::vector<nlohmann::json> lines_with(const fs::path& metrics, const std::string& key) {
  std::ifstream in(metrics);
  std::vector<nlohmann::json> out;
  for (std::string l; std::getline(in, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains(key)) out.push_back(j);
  }
  return out;
}

std::vector<nlohmann::json> evals(const fs::path& metrics) {
  return lines_with(metrics, "eval_rewards/accuracies");
}

RunResult dpo(const fs::path& cfg, std::string* log_text = nullptr, TrainMode mode = TrainMode::kDpo) {
  auto ops = make_cpu_ops();
  std::ostringstream log;
  const RunResult r = run_dpo(load_train_config(cfg, {}, mode), *ops, log);
  if (log_text) *log_text = log.str();
  return r;
}

void expect_learns(const fs::path& out, const std::string& log) {
  const auto e = evals(out / "metrics.jsonl");
  ASSERT_GE(e.size(), 2u) << log;
  EXPECT_EQ(e.front()["eval_rewards/accuracies"].get<double>(), 0.0) << "step 0: policy = reference";
  EXPECT_NEAR(e.front()["eval_rewards/margins"].get<double>(), 0.0, 1e-6);
  EXPECT_GE(e.back()["eval_rewards/accuracies"].get<double>(), 0.85) << log;
  EXPECT_GT(e.back()["eval_rewards/margins"].get<double>(), 0.0) << log;
}

TEST(DpoRun, LoraRaisesHeldOutAccuracy) {
  DpoSetup s;
  std::string log;
  const RunResult r = dpo(s.config("lora", "max_steps: 60\nlora: true\nlora_rank: 8\nlora_alpha: 16\n"), &log);
  EXPECT_EQ(r.steps, 60);
  expect_learns(s.t.path / "lora", log);
  EXPECT_NE(log.find("acc "), std::string::npos) << "the progress line shows rewards/accuracies";
  EXPECT_TRUE(fs::exists(s.t.path / "lora" / "adapter" / "adapter_model.safetensors"));
}

TEST(DpoRun, FullFineTuneRaisesHeldOutAccuracyAndReusesReference) {
  DpoSetup s;
  std::string log;
  const RunResult r = dpo(s.config("full", "max_steps: 60\nlearning_rate: 1.0e-3\n"), &log);
  EXPECT_EQ(r.steps, 60);
  expect_learns(s.t.path / "full", log);
  EXPECT_NE(log.find("reference log-probs of 400 pairs stored"), std::string::npos) << log;
  // A second run on the same pairs and model (as a resume is) reads the stored reference.
  dpo(s.config("full2", "max_steps: 1\n"), &log);
  EXPECT_NE(log.find("reference log-probs reused"), std::string::npos) << log;
}

// A damaged reference cache (NaN, or a negative sum: the cache holds -log p sums, never below 0) is computed again, not
// trained on as a diverged run.
TEST(DpoRun, ADamagedReferenceCacheIsComputedAgain) {
  DpoSetup s;
  std::string log;
  dpo(s.config("a", "max_steps: 1\n"), &log);
  fs::path cache;
  for (const auto& e : fs::directory_iterator(s.t.path / "prepared"))
    if (e.path().filename().string().starts_with("dpo-reference-")) cache = e.path();
  ASSERT_FALSE(cache.empty()) << log;
  for (const float bad : {std::nanf(""), -3.0f}) {
    std::string bytes = test::read_bytes(cache);
    std::memcpy(bytes.data() + 4 * 7, &bad, 4);
    test::write_text(cache, bytes);
    const RunResult r = dpo(s.config("b", "max_steps: 2\noverwrite_output_dir: true\n"), &log);
    EXPECT_EQ(r.steps, 2);
    EXPECT_NE(log.find("holds values no log-prob sum can take"), std::string::npos) << log;
    EXPECT_NE(log.find("reference log-probs of 400 pairs stored"), std::string::npos) << log;
  }
}

// Axolotl's precompute_ref_log_probs with LoRA: the stored sums replace the adapters-off forward, and train
// the same model to float rounding (the two references are the same base model's sums).
TEST(DpoRun, LoraWithPrecomputedReferenceTrainsTheSame) {
  DpoSetup s;
  std::string log;
  dpo(s.config("live", "max_steps: 10\nlora: true\n"));
  dpo(s.config("pre", "max_steps: 10\nlora: true\nprecompute_ref_log_probs: true\n"), &log);
  EXPECT_NE(log.find("reference log-probs of 400 pairs stored"), std::string::npos) << log;
  const auto a = evals(s.t.path / "live" / "metrics.jsonl"), b = evals(s.t.path / "pre" / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_NEAR(a.back()["eval_rewards/margins"].get<double>(), b.back()["eval_rewards/margins"].get<double>(), 1e-4);
  EXPECT_GT(a.back()["eval_rewards/margins"].get<double>(), 0.01);
}

TEST(DpoRun, IpoAndHingeLearnToo) {
  DpoSetup s;
  for (const char* loss : {"ipo", "hinge"}) {
    SCOPED_TRACE(loss);
    std::string log;
    dpo(s.config(loss, std::string("max_steps: 40\nlora: true\nloss_type: ") + loss + "\n"), &log);
    expect_learns(s.t.path / loss, log);
  }
}

std::string bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A run stopped at a checkpoint and resumed ends bitwise where the uninterrupted run ends (the pair order,
// the stored reference and the optimizer state all come back).
TEST(DpoRun, ResumeIsBitwiseExact) {
  DpoSetup s;
  dpo(s.config("whole", "max_steps: 12\nvalidation_datasets: []\n"));
  dpo(s.config("parts", "max_steps: 12\nvalidation_datasets: []\nsave_steps: 5\n"), nullptr);
  fs::remove_all(s.t.path / "parts" / "model");
  fs::remove_all(s.t.path / "parts" / "checkpoint-10");  // resume from step 5
  std::string log;
  dpo(s.config("parts", "max_steps: 12\nvalidation_datasets: []\nsave_steps: 5\nresume_from_checkpoint: true\n"), &log);
  EXPECT_NE(log.find("resuming from"), std::string::npos) << log;
  EXPECT_NE(log.find("reference log-probs reused"), std::string::npos) << log;
  const std::string a = bytes(s.t.path / "whole" / "model" / "model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == bytes(s.t.path / "parts" / "model" / "model.safetensors"));
}

TEST(DpoRun, AxolotlRlKeyInAnSftConfigRunsDpo) {
  DpoSetup s;
  std::string log;
  const fs::path cfg = s.config("rl", "max_steps: 2\nrl: dpo\n");
  const TrainConfig c = load_train_config(cfg, {}, TrainMode::kSft);
  EXPECT_TRUE(c.dpo.enabled);
  const test::CliRun run = test::run("sft " + cfg.string(), s.t);
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("dpo: sigmoid loss, beta 0.1"), std::string::npos) << run.err;
  // Not built yet: one line, exit 2.
  const test::CliRun dp = test::run("dpo " + cfg.string() + " --gpus 2", s.t);
  EXPECT_EQ(dp.code, 2);
  EXPECT_NE(dp.err.find("not built yet for preference training"), std::string::npos) << dp.err;
  // A DPO key without a preference run is one line naming it.
  const test::CliRun key = test::run("sft " + s.config("k", "max_steps: 2\nbeta: 0.2\n").string(), s.t);
  EXPECT_EQ(key.code, 2);
  EXPECT_NE(key.err.find("beta is a preference-training key"), std::string::npos) << key.err;
  const test::CliRun bad = test::run("sft " + s.config("bad", "max_steps: 2\nrl: ebft\n").string(), s.t);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("rl: \"ebft\""), std::string::npos) << bad.err;
  // KTO reads unpaired records: paired ones stop at the first, naming what is missing
  const test::CliRun kto = test::run("sft " + s.config("kto", "max_steps: 2\nrl: kto\n").string(), s.t);
  EXPECT_EQ(kto.code, 2);
  EXPECT_NE(kto.err.find(":1: no \"label\" field"), std::string::npos) << kto.err;
}

TEST(DpoRun, BadRecordsAreSkippedOrNamed) {
  DpoSetup s;
  test::write_text(s.t.path / "bad.jsonl",
                   "{\"prompt\": \"abc\", \"chosen\": \"cba\", \"rejected\": \"cbb\"}\n"
                   "{\"prompt\": \"abc\", \"chosen\": \"cba\"}\n"
                   "{\"prompt\": \"abc\", \"chosen\": \"\", \"rejected\": \"x\"}\n"
                   "{\"prompt\": \"" +
                       std::string(200, 'q') +
                       "\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
                       "{\"prompt\": \"xyz\", \"chosen\": \"zyx\", \"rejected\": \"zyy\"}\n");
  const std::string data = "datasets: [{path: bad.jsonl}]\nvalidation_datasets: []\nmax_steps: 1\n";
  const test::CliRun err = test::run("dpo " + s.config("e", data).string(), s.t);
  EXPECT_EQ(err.code, 2);
  EXPECT_NE(err.err.find("bad.jsonl:2: no \"rejected\" field"), std::string::npos) << err.err;
  const test::CliRun skip = test::run("dpo " + s.config("s", data + "bad_records: skip\n").string(), s.t);
  EXPECT_EQ(skip.code, 0) << skip.err;
  EXPECT_NE(skip.err.find("skipped 3 bad records"), std::string::npos) << skip.err;
  EXPECT_NE(skip.err.find("wrote 2 pairs"), std::string::npos) << skip.err;
}

// The divergences of the days when DPO built its run by hand (issue 27), each against what SFT does with the
// same keys: they were three copies of one run and now are one (train/run_builder.h, train/train_loop.h).
// qlora_nf4 under DPO trained LoRA over the dense base without a word: it now says so and trains over NF4
// (an adapter different from the dense base's, from the same seed and pairs).
TEST(DpoRun, QloraNf4TrainsOverTheQuantisedBase) {
  DpoSetup s;
  std::string log;
  const std::string lora = "max_steps: 3\nlora: true\nvalidation_datasets: []\n";
  dpo(s.config("dense", lora));
  dpo(s.config("nf4", lora + "qlora_nf4: true\n"), &log);
  EXPECT_NE(log.find("over a frozen NF4 base (qlora_nf4)"), std::string::npos) << log;
  const std::string a = bytes(s.t.path / "dense" / "adapter" / "adapter_model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_NE(a, bytes(s.t.path / "nf4" / "adapter" / "adapter_model.safetensors"))
      << "the NF4 base changes the log-probs, so the adapters' updates";
}

// The cosine schedule's floor (Axolotl's cosine_min_lr_ratio): step 4/4 ran at 1.46e-5 under DPO and 5.73e-5
// under SFT with a 0.5 floor. Both now follow transformers' cosine-with-min-lr: lr · (r + (1 - r) · ½(1 +
// cos(π k / n))) for update k (0-based) of n.
TEST(DpoRun, CosineFloorIsTheSftSchedule) {
  DpoSetup s;
  const std::string keys =
      "max_steps: 4\nlogging_steps: 1\nlr_scheduler_type: cosine\ncosine_min_lr_ratio: 0.5\n"
      "learning_rate: 1.0e-4\nvalidation_datasets: []\n";
  dpo(s.config("cos", keys));
  const auto lines = lines_with(s.t.path / "cos" / "metrics.jsonl", "learning_rate");
  ASSERT_EQ(lines.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const double expected = 1e-4 * (0.5 + 0.5 * 0.5 * (1 + std::cos(M_PI * k / 4)));
    EXPECT_NEAR(lines[size_t(k)]["learning_rate"].get<double>(), expected, 1e-12) << "update " << k;
  }
}

// Surogate's merge_adapter: SFT wrote output_dir/merged, DPO skipped it.
TEST(DpoRun, MergeAdapterWritesTheMergedModel) {
  DpoSetup s;
  std::string log;
  dpo(s.config("m", "max_steps: 1\nlora: true\nmerge_adapter: true\nvalidation_datasets: []\n"), &log);
  EXPECT_TRUE(fs::exists(s.t.path / "m" / "merged" / "model.safetensors")) << log;
  EXPECT_TRUE(fs::exists(s.t.path / "m" / "adapter" / "adapter_model.safetensors"));
  EXPECT_NE(log.find("merged model saved to"), std::string::npos) << log;
}

}  // namespace
}  // namespace soltrain
