// The soltrain binary as users run it: exit code 0 on success, 2 with one line on stderr for bad input,
// no half-written outputs.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

void expect_user_error(const CliRun& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
}

std::string model_dir(const char* name = "qwen3-tiny") {
  return (fixtures() / "models" / name).string();
}

TEST(Cli, DumpWritesLogitsLossAndGradients) {
  TempDir t;
  const auto out = t.path / "dump.safetensors";
  const CliRun r =
      run("dump --model " + model_dir() + " --batch " + model_dir() + "/batch.safetensors --out " + out.string(), t);
  ASSERT_EQ(r.code, 0) << r.err;
  const SafetensorsFile f(out);
  const SafetensorsFile ref(fixtures() / "models" / "qwen3-tiny" / "expected.safetensors");
  for (const char* n : {"logits", "loss", "grad.model.layers.1.mlp.down_proj.weight"}) {
    const auto a = to_f32(f.at(n)), b = to_f32(ref.at(n));
    ASSERT_EQ(a.size(), b.size()) << n;
    EXPECT_LE(rel_err(a.data(), b.data(), a.size()), 1e-4) << n;
  }
  EXPECT_EQ(f.entries().size(), ref.entries().size());
}

TEST(Cli, CorruptCheckpointIsExitCode2) {
  TempDir t;
  std::filesystem::copy(model_dir(), t.path / "m");
  std::filesystem::resize_file(t.path / "m" / "model.safetensors", 1000);  // truncated download
  const CliRun r = run("dump --model " + (t.path / "m").string() + " --batch " + model_dir() +
                           "/batch.safetensors --out " + (t.path / "o.safetensors").string(),
                       t);
  expect_user_error(r, "model.safetensors");
  EXPECT_FALSE(std::filesystem::exists(t.path / "o.safetensors"));
}

TEST(Cli, BadBatchIsExitCode2) {
  TempDir t;
  std::vector<int32_t> ids = {1, 2, 999, 3}, tgt = {2, 5, 3, -100};
  write_safetensors(t.path / "b.safetensors", {{"input_ids", Tensor{ids.data(), DType::I32, {1, 4}}},
                                               {"targets", Tensor{tgt.data(), DType::I32, {1, 4}}}});
  CliRun r = run("dump --model " + model_dir() + " --batch " + (t.path / "b.safetensors").string() + " --out " +
                     (t.path / "o.safetensors").string(),
                 t);
  expect_user_error(r, "input_ids[0, 2] = 999");
  write_safetensors(t.path / "c.safetensors", {{"input_ids", Tensor{ids.data(), DType::I32, {1, 4}}}});
  r = run("dump --model " + model_dir() + " --batch " + (t.path / "c.safetensors").string() + " --out " +
              (t.path / "o.safetensors").string(),
          t);
  expect_user_error(r, "'targets' is missing");
}

TEST(Cli, BadFlagsAndFoldersAreExitCode2) {
  TempDir t;
  expect_user_error(run("dump --model /nonexistent --batch x --out y", t), "/nonexistent");
  expect_user_error(run("dump --model " + model_dir() + " --batch x --out y --frobnicate", t), "frobnicate");
  expect_user_error(run("dump --model " + model_dir() + " --batch x --out y --device tpu", t), "tpu");
  expect_user_error(run("train --model " + model_dir() + " --batch x --out y --lr -1", t), "--lr");
  EXPECT_EQ(run("nosuchcommand", t).code, 2);
}

// bench-attention prints one JSON line of medians: by device events where the backend has them (CUDA), else
// the host clock's (so on the CPU both pairs are the same); bench refuses an unknown backward form in one line.
TEST(Cli, BenchAttentionPrintsItsTimes) {
  TempDir t;
  const CliRun r =
      run("bench-attention --device cpu --batch 1 --heads 2 --kv-heads 1 --seq-len 48 --head-dim 32 --iters 2", t);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k : {"fwd_ms", "bwd_ms", "fwd_host_ms", "bwd_host_ms", "fwd_tflops", "bwd_tflops"})
    EXPECT_GT(j.at(k).get<double>(), 0.0) << k;
  EXPECT_EQ(j.at("fwd_ms").get<double>(), j.at("fwd_host_ms").get<double>());
  EXPECT_EQ(j.at("bwd_ms").get<double>(), j.at("bwd_host_ms").get<double>());
  expect_user_error(run("bench --model " + model_dir() + " --device cpu --attention-backward fast", t),
                    "--attention-backward");
}

// bench --optimizer takes the config's names (cli/config_schema.h set_optimizer): Muon times its own update; a name
// soltrain lacks, or Muon with offloaded state, is one line.
TEST(Cli, BenchTakesTheConfigsOptimizerNames) {
  TempDir t;
  const std::string base = "bench --model " + model_dir() +
                           " --device cpu --batch-size 1 --seq-len 16 --steps 1 "
                           "--warmup 0 --optimizer ";
  for (const char* opt : {"muon", "normuon", "adamw_torch_4bit"}) {
    const CliRun r = run(base + opt, t);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("optimizer"), opt);
  }
  expect_user_error(run(base + "muon_8bit", t), "bench --optimizer muon_8bit: not built yet; optimizer: muon is");
  // what training refuses, bench refuses in the same words (train/optimizer_settings.h)
  expect_user_error(run(base + "muon --offload both", t),
                    "bench: optimizer: muon with offloaded optimizer state is not built yet");
  expect_user_error(run(base + "adamw --bf16-stochastic-round --offload master", t),
                    "bench: bf16_stochastic_round with offload_master");
  expect_user_error(run(base + "adamw --optimizer-in-backward --gradient-accumulation 2", t),
                    "bench: optimizer_in_backward changes the weights during backward, so each update is one "
                    "micro-batch: set gradient_accumulation_steps: 1 (got 2)");
}

TEST(Cli, TrainLowersTheLossAndSavesALoadableModel) {
  TempDir t;
  const CliRun r = run("train --model " + model_dir("llama-tiny") + " --batch " + model_dir("llama-tiny") +
                           "/batch.safetensors --steps 15 --lr 0.01 --out " + (t.path / "trained").string(),
                       t);
  ASSERT_EQ(r.code, 0) << r.err;
  double before = 0, after = 0;
  const auto at = r.out.find("\nloss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at + 1, "loss %lf -> %lf", &before, &after), 2) << r.out;
  EXPECT_LT(after, before - 1.0) << r.out;
  // the saved model reproduces that loss
  const CliRun d = run("dump --model " + (t.path / "trained").string() + " --batch " + model_dir("llama-tiny") +
                           "/batch.safetensors --out " + (t.path / "d.safetensors").string(),
                       t);
  ASSERT_EQ(d.code, 0) << d.err;
  const SafetensorsFile f(t.path / "d.safetensors");
  EXPECT_NEAR(to_f32(f.at("loss"))[0], after, 1e-3);
}

}  // namespace
}  // namespace soltrain::test
