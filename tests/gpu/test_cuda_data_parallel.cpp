// The NCCL communicator on the GPU: at world size 1 it goes through the whole data-parallel path
// (collectives on the side stream, events, the per-layer hooks, the sharded update and the gathers) and must
// train bitwise as the single process does; with two GPUs visible, `--gpus 2` trains what one GPU does with
// twice the accumulation (bf16 compute: within 2e-3 relative per step), ZeRO 0-3. Skips, saying so, without a GPU.
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "dist/launch.h"
#include "gpu_test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

class CudaDataParallel : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    const CliRun setup =
        run("demo-setup --out " + (t.path / "data").string() + " --train 200 --validation 1 --seed 5", t);
    ASSERT_EQ(setup.code, 0) << setup.err;
    std::ofstream(t.path / "base.yaml") << "model: data/model\ndatasets:\n  - path: data/train.jsonl\n"
                                           "    type: conversation\nsequence_len: 128\nper_device_train_batch_size: 4\n"
                                           "max_steps: 4\nlearning_rate: 3.0e-3\nwarmup_steps: 1\nseed: 11\n"
                                           "logging_steps: 1\ndevice: cuda\n";
  }
  CliRun sft(const std::string& env, const std::string& out, const std::string& sets) {
    return run_env(env, "sft " + (t.path / "base.yaml").string() + " --set output_dir=" + out + " " + sets);
  }
  CliRun run_env(const std::string& env, const std::string& args) {
    const auto o = t.path / "stdout", e = t.path / "stderr";
    const std::string cmd = env + " " SOLTRAIN_BIN " " + args + " >" + o.string() + " 2>" + e.string();
    const int status = std::system(("cd " + t.path.string() + " && " + cmd).c_str());
    auto read = [](const fs::path& p) {
      std::ifstream f(p);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(o), read(e)};
  }
  std::vector<std::pair<double, double>> metrics(const std::string& out) {
    std::vector<std::pair<double, double>> v;
    std::ifstream in(t.path / out / "metrics.jsonl");
    for (std::string l; std::getline(in, l);) {
      const auto j = nlohmann::json::parse(l);
      if (j.contains("loss")) v.emplace_back(j["loss"].get<double>(), j["grad_norm"].get<double>());
    }
    return v;
  }
  TempDir t;
};

TEST_F(CudaDataParallel, NcclAtWorldSizeOneTrainsBitwiseAsOneProcess) {
  ASSERT_EQ(sft("", "plain", "--set gradient_accumulation_steps=2").code, 0);
  const auto want = metrics("plain");
  ASSERT_EQ(want.size(), 4u);
  // ZeRO-3 too: alone, a rank's slices are whole groups, so they serve as the gather and gradient buffers
  // and its collectives run in place (train/zero3.h): backward accumulates as the single process does.
  for (int zero : {0, 1, 2, 3}) {
    const std::string out = "nccl-z" + std::to_string(zero);
    const CliRun r = sft("SOLTRAIN_COMMUNICATOR=nccl", out,
                         "--set gradient_accumulation_steps=2 --set zero_stage=" + std::to_string(zero));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("data parallel over 1 ranks (nccl)"), std::string::npos) << r.err;
    if (zero == 3) EXPECT_NE(r.err.find("ZeRO-3 per rank: "), std::string::npos) << r.err;
    EXPECT_EQ(metrics(out), want) << out;
  }
}

// A peer that never joins a collective (the seam stalls the side stream before collective 3, as a stopped rank
// would): the watchdog sees it unfinished ddp_timeout seconds after it was queued and ends the rank in one line,
// exit 2, instead of waiting on the GPU forever.
TEST_F(CudaDataParallel, NcclCollectiveThatNeverFinishesEndsTheRankAfterDdpTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const CliRun r = sft("SOLTRAIN_COMMUNICATOR=nccl SOLTRAIN_TEST_NCCL_STALL=3 timeout -k 5 120", "stall",
                       "--set zero_stage=2 --set ddp_timeout=3 --set max_steps=50");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("(collective 3) has not finished"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("s after it was queued (ddp_timeout 3 s): another rank is stopped, hung or far behind"),
            std::string::npos)
      << r.err;
  EXPECT_LT(took, 60) << r.err;
}

// device: cuda where the process sees no GPU (CUDA_VISIBLE_DEVICES empty): one line saying so, exit 2, alone and
// under the launcher (the "sees 0 GPU(s) ... start at most 0 ranks" named no cause).
TEST_F(CudaDataParallel, NoVisibleGpuIsOneLine) {
  for (const std::string gpus : {"", "--gpus 2 "}) {
    const CliRun r = sft("CUDA_VISIBLE_DEVICES=", "nogpu", gpus);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("no CUDA GPU is visible"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("start at most 0 ranks"), std::string::npos) << r.err;
  }
}

// FP8 (delayed scaling) through NCCL at world size 1: the amax histories' max-reduction (ncclMax, in place on
// the side stream) and everything else as above: bitwise the single process's FP8 run, ZeRO 0 and 3.
TEST_F(CudaDataParallel, NcclFp8AtWorldSizeOneTrainsBitwiseAsOneProcess) {
  const std::string fp8 = "--set recipe=fp8-hybrid --set fp8_amax_history=4 --set gradient_accumulation_steps=2 ";
  const CliRun plain = sft("", "fp8-plain", fp8);
  if (plain.code == 2 && plain.err.find("compute capability") != std::string::npos)
    GTEST_SKIP() << "skipped: FP8 GEMMs need compute capability 8.9";
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto want = metrics("fp8-plain");
  ASSERT_EQ(want.size(), 4u);
  for (int zero : {0, 3}) {
    const std::string out = "fp8-nccl-z" + std::to_string(zero);
    const CliRun r = sft("SOLTRAIN_COMMUNICATOR=nccl", out, fp8 + "--set zero_stage=" + std::to_string(zero));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("data parallel over 1 ranks (nccl)"), std::string::npos) << r.err;
    EXPECT_EQ(metrics(out), want) << out;
  }
}

// Offload while NCCL's collectives run on the side stream, ZeRO 2 and 3 at world size 1, LoRA: the base
// streamed (offload_weights, on the upload stream), and the layer-input checkpoints (offload_activations,
// sharing the side stream with the collectives). Bitwise the same NCCL run without them.
TEST_F(CudaDataParallel, NcclWithOffloadTrainsAsResident) {
  const std::string lora = "--set adapter=lora --set lora_r=8 --set lora_alpha=16 --set gradient_accumulation_steps=2 ";
  for (const std::string offload :
       {"--set offload_weights=true", "--set recompute=full --set offload_activations=true"})
    for (int zero : {2, 3}) {
      const std::string z = "--set zero_stage=" + std::to_string(zero) + " ", tag = "z" + std::to_string(zero);
      const std::string rc = offload.find("recompute") != std::string::npos ? "--set recompute=full " : "";
      SCOPED_TRACE(offload + ", " + tag);
      ASSERT_EQ(sft("SOLTRAIN_COMMUNICATOR=nccl", tag + "-resident", lora + z + rc).code, 0);
      const CliRun r = sft("SOLTRAIN_COMMUNICATOR=nccl", tag + "-offloaded", lora + z + offload);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_NE(r.err.find("offload_"), std::string::npos) << r.err;
      EXPECT_EQ(metrics(tag + "-resident"), metrics(tag + "-offloaded"));
      EXPECT_EQ(metrics(tag + "-resident").size(), 4u);
    }
}

// 8-bit moments and offloaded state (offload_master + offload_optimizer: the masters, ZeRO-3's slices of them, in
// pinned host memory, gathered through device staging; the moments streamed) under ZeRO 1-3 at world size 1: the
// sharded update over NCCL trains bitwise as the single process with the same settings, and saves its model.
TEST_F(CudaDataParallel, NcclShardedLowBitAndOffloadedStateTrainAsOneProcess) {
  auto bytes = [&](const std::string& out) {
    std::ifstream f(t.path / out / "model" / "model.safetensors", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  for (const auto& [tag, sets] :
       {std::pair{"8bit", "--set optimizer=adamw_8bit"},
        std::pair{"offload", "--set offload_master=true --set offload_optimizer=true"},
        std::pair{"8bit-offload",
                  "--set optimizer=adamw_8bit --set offload_master=true --set offload_optimizer=true"}}) {
    SCOPED_TRACE(sets);
    const std::string base = std::string("--set gradient_accumulation_steps=2 ") + sets,
                      plain = tag + std::string("-plain");
    ASSERT_EQ(sft("", plain, base).code, 0);
    const auto want = metrics(plain);
    ASSERT_EQ(want.size(), 4u);
    for (int zero : {1, 2, 3}) {
      const std::string out = tag + std::string("-nccl-z") + std::to_string(zero);
      const CliRun r = sft("SOLTRAIN_COMMUNICATOR=nccl", out, base + " --set zero_stage=" + std::to_string(zero));
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_NE(r.err.find("data parallel over 1 ranks (nccl)"), std::string::npos) << r.err;
      EXPECT_EQ(metrics(out), want) << out;
      EXPECT_TRUE(bytes(out) == bytes(plain)) << out << ": its saved model differs";
    }
  }
}

TEST_F(CudaDataParallel, TwoGpusTrainWhatOneDoesWithTwiceTheAccumulation) {
  if (visible_gpus() < 2) GTEST_SKIP() << "skipped: needs 2 GPUs, sees " << visible_gpus();
  ASSERT_EQ(sft("", "one", "--set gradient_accumulation_steps=2").code, 0);
  const auto want = metrics("one");
  for (int zero : {0, 1, 2, 3}) {
    const std::string out = "two-z" + std::to_string(zero);
    const CliRun r =
        sft("", out, "--gpus 2 --set gradient_accumulation_steps=1 --set zero_stage=" + std::to_string(zero));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto got = metrics(out);
    ASSERT_EQ(got.size(), want.size()) << out;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i].first, want[i].first, 2e-3 * want[i].first) << out;
  }
}

// The same seed twice on two GPUs gives bitwise the same losses and the same written model: the weight
// gathers left in flight after each update (waited per layer by the next forward) race with nothing.
TEST_F(CudaDataParallel, TwoGpusTrainTheSameTwice) {
  if (visible_gpus() < 2) GTEST_SKIP() << "skipped: needs 2 GPUs, sees " << visible_gpus();
  for (int zero : {1, 2}) {
    std::vector<std::pair<double, double>> runs[2];
    std::string models[2];
    for (int i = 0; i < 2; ++i) {
      const std::string out = "again-z" + std::to_string(zero) + "-" + std::to_string(i);
      const CliRun r = sft("", out, "--gpus 2 --set save_steps=2 --set zero_stage=" + std::to_string(zero));
      ASSERT_EQ(r.code, 0) << r.err;
      runs[i] = metrics(out);
      std::ifstream f(t.path / out / "model" / "model.safetensors", std::ios::binary);
      models[i] = std::string(std::istreambuf_iterator<char>(f), {});
    }
    ASSERT_EQ(runs[0].size(), 4u);
    EXPECT_EQ(runs[0], runs[1]) << "ZeRO-" << zero;
    EXPECT_FALSE(models[0].empty());
    EXPECT_TRUE(models[0] == models[1]) << "ZeRO-" << zero << ": the saved models differ";
  }
}

}  // namespace
}  // namespace soltrain::test
