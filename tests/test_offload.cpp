// Offload (`offload_master`, `offload_optimizer`): the update streamed through the device from host memory
// gives the resident update's bits: AdamW alone over several chunked groups, and whole training runs with
// gradient accumulation, active clipping, a checkpoint and a resume; the memory plan shows the host bytes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "demo_run_util.h"
#include "offload_test_util.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using test::read_jsonl;

TEST(Offload, UpdateEqualsResidentBitwise) {
  const uint32_t seed = test::test_seed(20261201u);
  SCOPED_TRACE(test::seed_message(seed));
  test::TempDir t;
  auto ops = make_cpu_ops();
  for (Moments moments : {Moments::F32, Moments::Blockwise8}) {
    SCOPED_TRACE(moments == Moments::F32 ? "fp32 moments" : "8-bit moments");
    const test::UpdateResult resident = test::expect_offloaded_updates_equal_resident(*ops, seed, t.path, moments);
    // A different seed moves the result: the comparison above can fail.
    const test::UpdateResult other =
        test::run_updates(*ops, seed + 1, {true, true, 37}, 5, t.path / "other.safetensors", moments);
    EXPECT_NE(other.masters, resident.masters);
  }
  // The two kinds of moments differ (the 8-bit run quantised something).
  const test::UpdateResult f32 = test::run_updates(*ops, seed, {}, 5, t.path / "f.safetensors", Moments::F32);
  const test::UpdateResult b8 = test::run_updates(*ops, seed, {}, 5, t.path / "b.safetensors", Moments::Blockwise8);
  EXPECT_NE(f32.masters, b8.masters);
}

// Where the bytes are: offloaded masters and moments in host memory, the device holding two staging chunks.
TEST(Offload, BytesMoveToTheHost) {
  auto ops = make_cpu_ops();
  ParameterStore ps;
  ps.add("model.layers.0.mlp.up_proj.weight", {64, 32}, true, 0);
  ps.add("model.layers.0.post_attention_layernorm.weight", {32}, true, 0);
  ps.allocate(*ops);
  const size_t n = size_t(ps.numel());
  const size_t resident_weights = ps.weight_bytes();
  AdamW both(ps, *ops, Moments::F32, Offload{true, true, 100});
  EXPECT_TRUE(ps.masters_on_host());
  EXPECT_EQ(ps.host_master_bytes(), 4 * n);
  EXPECT_EQ(ps.weight_bytes(), resident_weights - 4 * n);
  EXPECT_EQ(both.host_state_bytes(), 8 * n);
  EXPECT_EQ(both.state_bytes(), 2 * 3 * 100 * 4u);  // two slots of master + m + v chunks
  ParameterStore ps2;
  ps2.add("model.layers.0.mlp.up_proj.weight", {64, 32}, true, 0);
  ps2.allocate(*ops);
  AdamW moments(ps2, *ops, Moments::F32, Offload{false, true, 1 << 30});
  EXPECT_FALSE(ps2.masters_on_host());
  EXPECT_EQ(moments.state_bytes(), 2 * 2 * 64 * 32 * 4u);  // chunks cut to the widest range
  // 8-bit: the codes (1 byte each) and absmax (one float per 256) of the quantised matrix and the small
  // parameter's fp32 moments go to the host; the device keeps the maps and two slots of whole blocks.
  ParameterStore ps3;
  ps3.add("model.layers.0.mlp.up_proj.weight", {128, 40}, true, 0);  // 5120 elements: 20 blocks
  ps3.add("model.layers.0.post_attention_layernorm.weight", {40}, true, 0);
  ps3.allocate(*ops);
  AdamW eight(ps3, *ops, Moments::Blockwise8, Offload{true, true, 600});  // 600 → 512: two blocks a piece
  EXPECT_TRUE(ps3.masters_on_host());
  EXPECT_EQ(eight.host_state_bytes(), 2 * (5120u + 20 * 4) + 2 * 40 * 4u);
  EXPECT_EQ(eight.state_bytes(), 2 * (3 * 512 + 2 * 2) * 4u + 512 * 4u);  // slots [master | m | v | absmaxes], maps
}

// The offload runs' keys over the demo setup: every step logged, clipping that bites, accumulation, a
// checkpoint half way.
constexpr const char* kRunKeys =
    "per_device_train_batch_size: 2\nlogging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0.05\n"
    "gradient_accumulation_steps: 2\nmax_steps: 8\nsave_steps: 4\n";

struct RunSetup : test::DemoRunSetup {
  RunResult train(const std::string& out, const std::string& extra, std::vector<std::string> set = {},
                  std::string* log_text = nullptr) const {
    auto ops = make_cpu_ops();
    std::ostringstream log;
    const RunResult r =
        run_training(load_train_config(config(out, test::yaml_with(kRunKeys, extra)), set, TrainMode::kSft),
                     TrainMode::kSft, *ops, log);
    if (log_text) *log_text = log.str();
    return r;
  }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Offload, TrainingRunEqualsResidentAndResumes) {
  RunSetup s;
  s.train("resident", "");
  std::string log;
  const std::string offload = "offload_master: true\noffload_optimizer: true\n";
  s.train("offloaded", offload, {}, &log);
  EXPECT_NE(log.find("offload: host memory holds the fp32 masters"), std::string::npos) << log;
  EXPECT_NE(log.find("offloaded masters, moments and gradients"), std::string::npos) << log;
  // Killed after step 4 and resumed, offloaded: the checkpoint's moments load into host memory.
  s.train("resumed", offload);
  const fs::path a = s.t.path / "resident", b = s.t.path / "offloaded", c = s.t.path / "resumed";
  ASSERT_TRUE(fs::exists(c / "checkpoint-4" / "optimizer.safetensors"));
  fs::remove_all(c / "checkpoint-8");
  fs::remove_all(c / "model");
  s.train("resumed", offload, {"resume_from_checkpoint=true"}, &log);
  EXPECT_NE(log.find("checkpoint-4 at step 4"), std::string::npos) << log;
  const auto ma = read_jsonl(a / "metrics.jsonl");
  bool clipped = false;
  for (const fs::path& other : {b, c}) {
    SCOPED_TRACE(other.filename().string());
    const auto mb = read_jsonl(other / "metrics.jsonl");
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i) {
      EXPECT_EQ(ma[i]["step"], mb[i]["step"]);
      EXPECT_EQ(ma[i].value("loss", 0.0), mb[i].value("loss", 0.0)) << "line " << i;  // bitwise, not near
      EXPECT_EQ(ma[i].value("grad_norm", 0.0), mb[i].value("grad_norm", 0.0)) << "line " << i;
      clipped = clipped || ma[i].value("grad_norm", 0.0) > 0.05;
    }
    EXPECT_EQ(read_bytes(a / "model" / "model.safetensors"), read_bytes(other / "model" / "model.safetensors"));
    EXPECT_EQ(read_bytes(a / "checkpoint-8" / "optimizer.safetensors"),
              read_bytes(other / "checkpoint-8" / "optimizer.safetensors"));
  }
  EXPECT_TRUE(clipped) << "max_grad_norm 0.05 never clipped: the test would not cover clipping";
  // The resident run trained: its weights moved from the start (else equal files would prove nothing).
  EXPECT_NE(read_bytes(a / "model" / "model.safetensors"), read_bytes(s.t.path / "model" / "model.safetensors"));
}

// 8-bit moments offloaded with the masters (what Qwen3-4B full fine-tuning needs to fit 40 GiB): the run, its
// checkpoint (codes and absmax read back from host memory) and a resume from it equal the resident 8-bit run.
TEST(Offload, EightBitRunEqualsResidentAndResumes) {
  RunSetup s;
  const std::string eight = "optimizer: adamw_8bit\n",
                    offload = eight + "offload_master: true\noffload_optimizer: true\n";
  s.train("resident", eight);
  std::string log;
  s.train("offloaded", offload, {}, &log);
  EXPECT_NE(log.find("offload: host memory holds the fp32 masters"), std::string::npos) << log;
  EXPECT_NE(log.find("  8-bit\n  activations"), std::string::npos) << log;
  s.train("resumed", offload);
  const fs::path a = s.t.path / "resident", c = s.t.path / "resumed";
  fs::remove_all(c / "checkpoint-8");
  fs::remove_all(c / "model");
  s.train("resumed", offload, {"resume_from_checkpoint=true"}, &log);
  EXPECT_NE(log.find("checkpoint-4 at step 4"), std::string::npos) << log;
  for (const fs::path& other : {s.t.path / "offloaded", c}) {
    SCOPED_TRACE(other.filename().string());
    const auto ma = read_jsonl(a / "metrics.jsonl"), mb = read_jsonl(other / "metrics.jsonl");
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(ma[i].value("loss", 0.0), mb[i].value("loss", 0.0)) << i;
    EXPECT_EQ(read_bytes(a / "model" / "model.safetensors"), read_bytes(other / "model" / "model.safetensors"));
    EXPECT_EQ(read_bytes(a / "checkpoint-8" / "optimizer.safetensors"),
              read_bytes(other / "checkpoint-8" / "optimizer.safetensors"));
  }
}

// LoRA: only the adapters are trainable, so only theirs move to the host; the frozen base stays put.
TEST(Offload, LoraRunEqualsResident) {
  RunSetup s;
  const std::string lora = "lora: true\nlora_rank: 4\nlora_alpha: 8\nlearning_rate: 2.0e-2\n";
  s.train("resident", lora);
  s.train("offloaded", lora + "offload_master: true\noffload_optimizer: true\n");
  const fs::path a = s.t.path / "resident", b = s.t.path / "offloaded";
  const std::string adapter = read_bytes(a / "adapter" / "adapter_model.safetensors");
  EXPECT_FALSE(adapter.empty());
  EXPECT_EQ(adapter, read_bytes(b / "adapter" / "adapter_model.safetensors"));
  const auto ma = read_jsonl(a / "metrics.jsonl"), mb = read_jsonl(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(ma[i].value("loss", 0.0), mb[i].value("loss", 0.0)) << i;
}

// Resident and offloaded checkpoints are one format: a run resumes the other's.
TEST(Offload, ResidentCheckpointResumesOffloaded) {
  RunSetup s;
  s.train("resident", "");
  s.train("mixed", "");
  const fs::path a = s.t.path / "resident", m = s.t.path / "mixed";
  fs::remove_all(m / "checkpoint-8");
  fs::remove_all(m / "model");
  std::string log;
  s.train("mixed", "offload_optimizer: true\n", {"resume_from_checkpoint=true"}, &log);
  EXPECT_NE(log.find("checkpoint-4 at step 4"), std::string::npos) << log;
  EXPECT_EQ(read_bytes(a / "model" / "model.safetensors"), read_bytes(m / "model" / "model.safetensors"));
}

}  // namespace
}  // namespace soltrain
