// The trainer end to end on CPU with a tiny random Qwen3 and the byte tokenizer: the loss falls, metrics
// files are written, resuming from a checkpoint is bitwise exact, and Ctrl-C saves a checkpoint and exits 130.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data/sample_encoder.h"
#include "data_test_util.h"
#include "inputs_guard.h"
#include "model/config.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/run_training.h"
#include "train/train_checkpoint.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

struct SftSetup {
  test::TempDir t;
  SftSetup() {
    DemoModelShape s;
    s.hidden = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.head_dim = 16, s.intermediate = 64;
    write_random_model(t.path / "model", s, 7);
    write_reversal_dataset(t.path / "train.jsonl", 300, 8);
    write_reversal_dataset(t.path / "val.jsonl", 40, 9);
    guard.arm({t.path / "model", t.path / "train.jsonl", t.path / "val.jsonl"});
  }
  test::InputsGuard guard;
  // A config in the temp folder; `extra` lines are added, replacing the same keys of the base.
  fs::path config(const std::string& out, const std::string& extra) const {
    const fs::path p = t.path / (out + ".yaml");
    test::write_text(p, test::yaml_with("model: model\noutput_dir: " + out +
                                            "\ndatasets:\n  - path: train.jsonl\n    type: conversation\n"
                                            "validation_datasets: [{path: val.jsonl, type: conversation}]\n"
                                            "dataset_prepared_path: prepared\nsequence_len: 64\n"
                                            "per_device_train_batch_size: 2\nlearning_rate: 3.0e-3\n"
                                            "lr_scheduler_type: cosine\nwarmup_steps: 2\nlogging_steps: 1\n",
                                        extra));
    return p;
  }
};

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> out;
  for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

RunResult train(const fs::path& cfg, std::vector<std::string> set = {}, std::string* log_text = nullptr) {
  auto ops = make_cpu_ops();
  std::ostringstream log;
  const RunResult r = run_training(load_train_config(cfg, set, TrainMode::kSft), TrainMode::kSft, *ops, log);
  if (log_text) *log_text = log.str();
  return r;
}

TEST(Sft, ShortRunLearnsAndWritesMetrics) {
  SftSetup s;
  const fs::path cfg = s.config("run", "max_steps: 30\neval_steps: 10\nlogging_steps: 5\n");
  std::string log;
  const RunResult r = train(cfg, {}, &log);
  EXPECT_EQ(r.steps, 30);
  // Not a terminal: one progress line per logging_steps, with the fields a user watches.
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("/30 | loss ", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 6u) << log;
  EXPECT_NE(log.find("step 30/30 | loss "), std::string::npos) << log;
  EXPECT_NE(log.find(" tok/s | ETA "), std::string::npos) << log;
  EXPECT_FALSE(r.interrupted);
  EXPECT_LT(r.last_eval_loss, r.first_eval_loss - 1.5) << r.first_eval_loss << " -> " << r.last_eval_loss;
  const fs::path out = s.t.path / "run";
  EXPECT_TRUE(fs::exists(out / "model" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(out / "model" / "tokenizer_config.json"));
  std::vector<int64_t> train_steps, eval_steps;
  for (const auto& j : read_jsonl(out / "metrics.jsonl")) {
    if (j.contains("loss")) {
      train_steps.push_back(j["step"]);
      for (const char* k : {"learning_rate", "grad_norm", "tokens", "tokens_per_s", "epoch"})
        EXPECT_TRUE(j.contains(k)) << k << " in " << j.dump();
    } else {
      eval_steps.push_back(j["step"]);
      EXPECT_GT(j["eval_tokens"].get<int64_t>(), 0);
    }
  }
  EXPECT_EQ(train_steps, (std::vector<int64_t>{5, 10, 15, 20, 25, 30}));
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{0, 10, 20, 30}));
  const std::string svg = read_bytes(out / "training_curves.svg");
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("validation loss"), std::string::npos);
  EXPECT_FALSE(fs::is_empty(out / "tensorboard"));
}

TEST(Sft, RecomputeGivesTheSameRunBitForBit) {
  SftSetup s;
  train(s.config("none", "max_steps: 6\n"));
  train(s.config("full", "max_steps: 6\nrecompute: full\n"));
  const auto a = read_jsonl(s.t.path / "none" / "metrics.jsonl"), b = read_jsonl(s.t.path / "full" / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].value("loss", 0.0), b[i].value("loss", 0.0)) << i;
  EXPECT_EQ(read_bytes(s.t.path / "none" / "model" / "model.safetensors"),
            read_bytes(s.t.path / "full" / "model" / "model.safetensors"));
}

TEST(Sft, LoraLearnsSavesAPeftAdapterAndResumesExactly) {
  SftSetup s;
  // A random base cannot be steered far by adapters alone (its frozen LM head is tiny): start LoRA from a
  // briefly fully-trained model, as users start from a pretrained one.
  train(s.config("base", "max_steps: 10\n"));
  const std::string extra =
      "model: base/model\n"
      "max_steps: 30\nsave_steps: 15\nlora: true\nlora_rank: 8\nlora_alpha: 16\nlora_dropout: 0.1\n"
      "learning_rate: 2.0e-2\neval_steps: 30\ngradient_accumulation_steps: 2\n";  // masks drawn per micro-batch
  const RunResult r = train(s.config("a", extra));
  // Adapters on q/k/v/o/gate/up/down cannot reach the frozen LM head of so small a model, so the gain is
  // modest (5.24 -> 5.20 when written); a broken adapter path (B stuck at zero) leaves it exactly equal.
  EXPECT_LT(r.last_eval_loss, r.first_eval_loss - 0.02) << r.first_eval_loss << " -> " << r.last_eval_loss;
  const fs::path a = s.t.path / "a", b = s.t.path / "b";
  EXPECT_TRUE(fs::exists(a / "adapter" / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(a / "adapter" / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(a / "model"));  // the frozen base is not written again
  EXPECT_TRUE(fs::exists(a / "checkpoint-15" / "adapter_model.safetensors"));
  // Killed after step 15, resumed: the same adapter, bit for bit (dropout masks continue too).
  train(s.config("b", extra));
  fs::remove_all(b / "checkpoint-30");
  fs::remove_all(b / "adapter");
  std::string log;
  train(s.config("b", extra), {"resume_from_checkpoint=true"}, &log);
  EXPECT_NE(log.find("checkpoint-15 at step 15"), std::string::npos) << log;
  EXPECT_EQ(read_bytes(a / "adapter" / "adapter_model.safetensors"),
            read_bytes(b / "adapter" / "adapter_model.safetensors"));
}

TEST(Sft, ResumeFromCheckpointIsBitwiseExact) {
  SftSetup s;
  const std::string extra = "max_steps: 8\nsave_steps: 4\ngradient_accumulation_steps: 2\n";
  train(s.config("a", extra));
  train(s.config("b", extra));
  // Make b look killed after step 4: only checkpoint-4 survives; resume must recompute 5..8 identically.
  const fs::path a = s.t.path / "a", b = s.t.path / "b";
  ASSERT_TRUE(fs::exists(b / "checkpoint-4" / "optimizer.safetensors"));
  fs::remove_all(b / "checkpoint-8");
  fs::remove_all(b / "model");
  std::string log;
  train(s.config("b", extra), {"resume_from_checkpoint=true"}, &log);
  // A fresh start would reproduce a's numbers too: make sure this really resumed.
  EXPECT_NE(log.find("checkpoint-4 at step 4"), std::string::npos) << log;
  const auto ma = read_jsonl(a / "metrics.jsonl"), mb = read_jsonl(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());  // the resumed run replaced, not duplicated, steps 5..8
  for (size_t i = 0; i < ma.size(); ++i) {
    EXPECT_EQ(ma[i]["step"], mb[i]["step"]);
    EXPECT_EQ(ma[i].value("loss", 0.0), mb[i].value("loss", 0.0)) << "line " << i;  // bitwise, not near
    EXPECT_EQ(ma[i].value("grad_norm", 0.0), mb[i].value("grad_norm", 0.0)) << "line " << i;
  }
  EXPECT_EQ(read_bytes(a / "model" / "model.safetensors"), read_bytes(b / "model" / "model.safetensors"));
}

// Every checkpoint file's sha256 is saved beside it (sha256sum's format) and checked at resume: a flipped bit
// inside a tensor, which the safetensors header cannot see, is refused instead of resumed.
TEST(Sft, ADamagedCheckpointFileIsRefusedAtResume) {
  SftSetup s;
  const std::string extra = "max_steps: 4\nsave_steps: 2\n";
  train(s.config("c", extra));
  const fs::path ck = s.t.path / "c" / "checkpoint-2";
  ASSERT_TRUE(fs::exists(ck / "checksums.sha256"));
  EXPECT_EQ(std::system(("cd " + ck.string() + " && sha256sum --quiet -c checksums.sha256").c_str()), 0);
  fs::remove_all(s.t.path / "c" / "checkpoint-4");
  fs::remove_all(s.t.path / "c" / "model");
  std::string bytes = read_bytes(ck / "optimizer.safetensors");
  bytes[bytes.size() - 100] ^= 0x10;  // inside the last tensor's data
  test::write_text(ck / "optimizer.safetensors", bytes);
  try {
    train(s.config("c", extra), {"resume_from_checkpoint=true"});
    ADD_FAILURE() << "a damaged checkpoint was resumed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.safetensors: its sha256 differs"), std::string::npos) << e.what();
  }
}

// skip_bad_batches: a NaN loss (the seam poisons the model at update 7, as a bad batch would) restores the newest
// checkpoint, replays with every update checked to find update 7, and trains on without its batches. The
// updates before it are the uninterrupted run's, bitwise; with skip_bad_batches: 0 the run stops at once.
TEST(Sft, ANanLossRestoresTheCheckpointAndSkipsThatUpdate) {
  SftSetup s;
  const std::string extra = "max_steps: 10\nsave_steps: 4\nlogging_steps: 5\n";
  train(s.config("ref", "max_steps: 10\nsave_steps: 4\nlogging_steps: 1\n"));
  ::setenv("SOLTRAIN_TEST_NAN_STEP", "7", 1);
  std::string log;
  const RunResult r = train(s.config("nan", extra), {}, &log);
  ::unsetenv("SOLTRAIN_TEST_NAN_STEP");
  EXPECT_EQ(r.steps, 10);
  EXPECT_NE(log.find("step 8: training diverged at step 8 (loss nan)"), std::string::npos) << log;
  EXPECT_NE(log.find("checkpoint-4 to find the update that diverged"), std::string::npos) << log;
  EXPECT_NE(log.find("step 7: skipped"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(s.t.path / "nan" / "model" / "model.safetensors"));
  const auto ref = read_jsonl(s.t.path / "ref" / "metrics.jsonl"), got = read_jsonl(s.t.path / "nan" / "metrics.jsonl");
  for (const auto& row : got) {
    if (!row.contains("loss")) continue;
    EXPECT_TRUE(std::isfinite(row["loss"].get<double>())) << row.dump();
    EXPECT_NE(row["step"], 7) << "update 7 was skipped";
    if (row["step"].get<int64_t>() < 7)  // before the skipped update: the uninterrupted run's losses
      for (const auto& want : ref) {
        if (want.contains("loss") && want["step"] == row["step"]) {
          EXPECT_EQ(want["loss"], row["loss"]);
        }
      }
  }
  ::setenv("SOLTRAIN_TEST_NAN_STEP", "7", 1);
  try {
    train(s.config("stop", extra + "skip_bad_batches: 0\n"));
    ADD_FAILURE() << "a NaN loss was trained on";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged at step 8"), std::string::npos) << e.what();
  }
  ::unsetenv("SOLTRAIN_TEST_NAN_STEP");
}

TEST(Sft, CheckpointsKeepSaveTotalLimit) {
  SftSetup s;
  train(s.config("run", "max_steps: 6\nsave_steps: 2\nsave_total_limit: 2\n"));
  const auto all = list_checkpoints(s.t.path / "run");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].filename(), "checkpoint-4");
  EXPECT_EQ(all[1].filename(), "checkpoint-6");
  const auto state = nlohmann::json::parse(read_bytes(all[1] / "soltrain_state.json"));
  EXPECT_EQ(state["step"], 6);
  // HF Trainer's checkpoint-N: the model's folder at the top, trainer_state.json with global_step and log_history.
  const auto hf = nlohmann::json::parse(read_bytes(all[1] / "trainer_state.json"));
  EXPECT_EQ(hf["global_step"], 6);
  ASSERT_EQ(hf["log_history"].size(), 6u + 1u) << hf.dump();  // six steps and the evaluation before training
  EXPECT_TRUE(fs::exists(all[1] / "config.json"));
  EXPECT_TRUE(fs::exists(all[1] / "model.safetensors"));
  EXPECT_TRUE(fs::exists(all[1] / "config.yaml"));
}

// Axolotl's saves_per_epoch / evals_per_epoch become steps once the run knows its steps per epoch; the run
// says first what it trains (LoRA here, turned on by lora_r alone, as Surogate does).
TEST(Sft, PerEpochSavesAndEvalsAndLoraIntent) {
  SftSetup s;
  write_reversal_dataset(s.t.path / "small.jsonl", 48, 3);
  std::string log;
  const RunResult r = train(s.config("per_epoch",
                                     "datasets: [{path: small.jsonl, type: conversation}]\n"
                                     "sample_packing: false\nnum_epochs: 1\nsaves_per_epoch: 3\n"
                                     "evals_per_epoch: 2\nlora_rank: 4\n"),
                            {}, &log);
  ASSERT_EQ(r.total_steps, 24);  // 48 rows of one document, 2 per micro-batch
  EXPECT_EQ(log.rfind("sft: LoRA settings are given without", 0), 0u) << log;
  EXPECT_NE(log.find("\nsft: LoRA r4 on q,k,v,o,gate,up,down\n"), std::string::npos) << log;
  std::vector<std::string> names;
  for (const fs::path& p : list_checkpoints(s.t.path / "per_epoch")) names.push_back(p.filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-8", "checkpoint-16", "checkpoint-24"}));
  EXPECT_NE(log.find("step 12: validation loss"), std::string::npos) << log;
  std::string full;
  train(s.config("full", "max_steps: 1\n"), {}, &full);
  EXPECT_EQ(full.rfind("sft: full fine-tune\n", 0), 0u) << full;
}

// Axolotl's special_tokens: the tokenizer's own eos (and any pad) are accepted, a different eos is refused.
// Axolotl's special_tokens set the tokenizer's roles, adding a token the tokenizer lacks (transformers'
// add_special_tokens): the run tokenizes with and saves that tokenizer, its model resized to the new length; the
// model folder given is left as it was (the guard checks), the edited copy lives in dataset_prepared_path.
TEST(Sft, SpecialTokensSetTheTokenizersRoles) {
  SftSetup s;
  const std::string eos = read_eos_token(s.t.path / "model" / "tokenizer_config.json");
  std::string log;
  EXPECT_EQ(
      train(s.config("same", "max_steps: 1\nspecial_tokens: {eos_token: \"" + eos + "\", pad_token: x}\n"), {}, &log)
          .total_steps,
      1);
  EXPECT_EQ(log.find("resized"), std::string::npos) << log;
  EXPECT_EQ(read_special_token(s.t.path / "same" / "model" / "tokenizer_config.json", "pad_token"), "x");
  const int rows = load_model_config(s.t.path / "model").vocab_size;
  EXPECT_EQ(train(s.config("other", "max_steps: 1\nspecial_tokens: {eos_token: \"<|other|>\"}\n")).total_steps, 1);
  const fs::path saved = s.t.path / "other" / "model";
  EXPECT_EQ(read_eos_token(saved / "tokenizer_config.json"), "<|other|>");
  const std::optional<int32_t> id = Tokenizer::load(saved / "tokenizer.json").token_to_id("<|other|>");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, int32_t(Tokenizer::load(s.t.path / "model" / "tokenizer.json").vocab_size()));
  EXPECT_GE(load_model_config(saved).vocab_size, *id + 1);
  EXPECT_EQ(load_model_config(saved).vocab_size, std::max(rows, *id + 1));
}

// Runs `soltrain sft cfg [args]` as a child; returns its pid.
pid_t spawn_sft(const fs::path& cfg, const fs::path& log, std::vector<std::string> extra = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<std::string> args = {SOLTRAIN_BIN, "sft", cfg.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class SftSignal : public ::testing::TestWithParam<int> {};

TEST_P(SftSignal, SavesACheckpointAndResumeFinishesTheSameModel) {
  SftSetup s;
  const std::string extra = "max_steps: 400\neval_steps: 0\n";
  const fs::path cfg = s.config("run", extra), out = s.t.path / "run";
  const pid_t pid = spawn_sft(cfg, s.t.path / "log1");
  // Interrupt once training is under way (the first step is logged).
  bool started = false;
  for (int i = 0; i < 3000 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    started = read_bytes(out / "metrics.jsonl").find("\"loss\"") != std::string::npos;
  }
  ASSERT_TRUE(started) << read_bytes(s.t.path / "log1");
  kill(pid, GetParam());
  ASSERT_EQ(wait_exit(pid), 130) << read_bytes(s.t.path / "log1");
  const auto ckpts = list_checkpoints(out);
  ASSERT_EQ(ckpts.size(), 1u) << read_bytes(s.t.path / "log1");
  const int64_t stopped_at = nlohmann::json::parse(read_bytes(ckpts[0] / "trainer_state.json"))["global_step"];
  EXPECT_GT(stopped_at, 0);
  EXPECT_LT(stopped_at, 400) << "the run finished before the signal: make it longer";
  EXPECT_FALSE(fs::exists(out / "model"));

  ASSERT_EQ(wait_exit(spawn_sft(cfg, s.t.path / "log2", {"--set", "resume_from_checkpoint=true"})), 0)
      << read_bytes(s.t.path / "log2");
  EXPECT_NE(read_bytes(s.t.path / "log2").find("resuming from"), std::string::npos);
  ASSERT_EQ(wait_exit(spawn_sft(s.config("ref", extra), s.t.path / "log3")), 0) << read_bytes(s.t.path / "log3");
  EXPECT_EQ(read_bytes(out / "model" / "model.safetensors"),
            read_bytes(s.t.path / "ref" / "model" / "model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(CtrlCAndTerm, SftSignal, ::testing::Values(SIGINT, SIGTERM));

// An output_dir that cannot be a folder (a file stands there) is the user's input: one line, exit 2.
TEST(Sft, OutputDirThatIsAFileIsExit2) {
  SftSetup s;
  test::write_text(s.t.path / "taken", "a file the user already had\n");
  const fs::path cfg = s.config("taken", "max_steps: 1\n");
  ASSERT_EQ(wait_exit(spawn_sft(cfg, s.t.path / "log")), 2) << read_bytes(s.t.path / "log");
  const std::string log = read_bytes(s.t.path / "log");
  EXPECT_NE(log.rfind("error: "), std::string::npos) << log;
  EXPECT_EQ(log.find("internal error"), std::string::npos) << log;
  EXPECT_EQ(read_bytes(s.t.path / "taken"), "a file the user already had\n");  // nothing of theirs lost
}

TEST(Sft, PretrainOnTextTrainsEveryToken) {
  SftSetup s;
  std::string text;
  for (int i = 0; i < 50; ++i)
    text += nlohmann::json{{"text", "the quick brown fox jumps over the lazy dog"}}.dump() + "\n";
  test::write_text(s.t.path / "text.jsonl", text);
  test::write_text(s.t.path / "pt.yaml",
                   "model: model\noutput_dir: pt\ndatasets: [text.jsonl]\nsequence_len: 64\nmax_steps: 30\n"
                   "learning_rate: 3.0e-3\nvalidation_split_ratio: 0.1\n");
  auto ops = make_cpu_ops();
  std::ostringstream log;
  const TrainConfig c = load_train_config(s.t.path / "pt.yaml", {}, TrainMode::kPretrain);
  const RunResult r = run_training(c, TrainMode::kPretrain, *ops, log);
  EXPECT_EQ(r.steps, 30);
  EXPECT_LT(r.last_eval_loss, r.first_eval_loss - 1.0) << log.str();
  // 5 of 50 documents held out; each has 43 bytes + eos = 44 tokens, so 43 targets (all trained in pt)
  EXPECT_NE(log.str().find("45 training documents"), std::string::npos) << log.str();
  EXPECT_EQ(read_jsonl(s.t.path / "pt" / "metrics.jsonl").front()["eval_tokens"], 5 * 43);
}

TEST(Sft, TokenizeCommandPreparesAConfigsDatasets) {
  SftSetup s;
  const fs::path cfg = s.config("run", "max_steps: 1\n");
  const pid_t pid = spawn_sft(cfg, s.t.path / "log", {});
  ASSERT_EQ(wait_exit(pid), 0);
  const std::string cmd = std::string(SOLTRAIN_BIN) + " tokenize " + cfg.string() + " 2>" + (s.t.path / "tok").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string out = read_bytes(s.t.path / "tok");
  EXPECT_NE(out.find("is up to date"), std::string::npos) << out;  // sft's shard cache is the same one
  EXPECT_NE(out.find("300 training and 40 validation documents ready"), std::string::npos) << out;
  // `--pt` prepares what `soltrain pt` trains on (text, every token): pt then finds its shards up to date.
  std::string text;
  for (int i = 0; i < 20; ++i) text += nlohmann::json{{"text", "some plain text " + std::to_string(i)}}.dump() + "\n";
  test::write_text(s.t.path / "text.jsonl", text);
  test::write_text(s.t.path / "pt.yaml",
                   "model: model\noutput_dir: pt\ndatasets: [text.jsonl]\nsequence_len: 64\n"
                   "max_steps: 1\ndataset_prepared_path: prepared_pt\n");
  const std::string pt_cfg = (s.t.path / "pt.yaml").string(), log = (s.t.path / "ptlog").string();
  ASSERT_EQ(std::system((std::string(SOLTRAIN_BIN) + " tokenize --pt " + pt_cfg + " 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((std::string(SOLTRAIN_BIN) + " pt " + pt_cfg + " 2>" + log).c_str()), 0) << read_bytes(log);
  EXPECT_NE(read_bytes(log).find("is up to date"), std::string::npos) << read_bytes(log);
}

// HF's num_items_in_batch semantics: two micro-batches of one row accumulate to the same update as one
// batch of two rows (the loader fills both the same way), whatever their counted tokens.
TEST(Sft, GradientAccumulationWeighsTokensLikeOneBigBatch) {
  SftSetup s;
  train(s.config("big", "max_steps: 4\nper_device_train_batch_size: 2\n"));
  train(s.config("acc", "max_steps: 4\nper_device_train_batch_size: 1\ngradient_accumulation_steps: 2\n"));
  const auto big = read_jsonl(s.t.path / "big" / "metrics.jsonl"), acc = read_jsonl(s.t.path / "acc" / "metrics.jsonl");
  int compared = 0;
  for (size_t i = 0; i < big.size(); ++i) {
    if (!big[i].contains("loss")) continue;
    ASSERT_EQ(big[i]["step"], acc[i]["step"]);
    EXPECT_EQ(big[i]["tokens"], acc[i]["tokens"]);
    EXPECT_NEAR(acc[i]["loss"].get<double>(), big[i]["loss"].get<double>(), 1e-5 * big[i]["loss"].get<double>());
    EXPECT_NEAR(acc[i]["grad_norm"].get<double>(), big[i]["grad_norm"].get<double>(),
                1e-4 * big[i]["grad_norm"].get<double>());
    ++compared;
  }
  EXPECT_EQ(compared, 4);
}

TEST(Sft, WithoutPackingEachDocumentGetsARow) {
  SftSetup s;
  std::string packed, unpacked;
  train(s.config("p", "max_steps: 1\n"), {}, &packed);
  train(s.config("u", "max_steps: 1\nsample_packing: false\n"), {}, &unpacked);
  // 300 documents of 20-30 tokens: two share a 64-token row when packed, one per row otherwise.
  EXPECT_NE(unpacked.find("300 training documents (150 micro-batches of 2 x 64"), std::string::npos) << unpacked;
  EXPECT_EQ(packed.find("(150 micro-batches"), std::string::npos) << packed;
}

}  // namespace
}  // namespace soltrain
