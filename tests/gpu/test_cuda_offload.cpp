// Offload on CUDA: masters and moments in pinned host memory, streamed through two device staging chunks on
// the side stream, give the resident update's bits (the same adamw kernel on the same values); a short
// training run with offload gives the resident run's losses and weights.
#include <gtest/gtest.h>

#include <bit>
#include <fstream>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "gpu_test_util.h"
#include "offload_test_util.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

class CudaOffload : public test::CudaTest {};

TEST_F(CudaOffload, UpdateEqualsResidentBitwise) {
  const uint32_t seed = test::test_seed(20261202u);
  SCOPED_TRACE(test::seed_message(seed));
  test::TempDir t;
  for (Moments moments : {Moments::F32, Moments::Blockwise8}) {
    SCOPED_TRACE(moments == Moments::F32 ? "fp32 moments" : "8-bit moments");
    const test::UpdateResult resident = test::run_updates(*gpu, seed, {}, 5, t.path / "resident.safetensors", moments);
    EXPECT_GT(resident.last_sumsq, 4.0);  // clipping active
    for (const auto& [name, offload] : test::offload_cases()) {
      SCOPED_TRACE(name);
      const test::UpdateResult o = test::run_updates(*gpu, seed, offload, 5, t.path / (name + ".safetensors"), moments);
      ASSERT_EQ(o.masters.size(), resident.masters.size());
      for (size_t i = 0; i < o.masters.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(o.masters[i]), std::bit_cast<uint32_t>(resident.masters[i]))
            << "element " << i;
      EXPECT_EQ(o.values, resident.values);  // the bf16 compute copy written by the update
      EXPECT_EQ(o.state, resident.state);
    }
    // And the CUDA update is the CPU's (masters within fp32 rounding of the same arithmetic; 8-bit: the
    // codes round alike): the offloaded path did not silently skip the update.
    const test::UpdateResult on_cpu = test::run_updates(*cpu, seed, {}, 5, t.path / "cpu.safetensors", moments);
    for (size_t i = 0; i < on_cpu.masters.size(); ++i)
      ASSERT_NEAR(on_cpu.masters[i], resident.masters[i], 1e-5f + 1e-5f * std::abs(on_cpu.masters[i])) << i;
  }
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(CudaOffload, TrainingRunEqualsResident) {
  test::TempDir t;
  DemoModelShape s;
  s.hidden = 64, s.layers = 2, s.heads = 2, s.kv_heads = 1, s.head_dim = 32, s.intermediate = 128;
  write_random_model(t.path / "model", s, 17);
  write_reversal_dataset(t.path / "train.jsonl", 200, 8);
  std::vector<std::string> logs;
  auto train = [&](const std::string& out, const std::string& extra) {
    const fs::path p = t.path / (out + ".yaml");
    test::write_text(p, "model: model\noutput_dir: " + out +
                            "\ndevice: cuda\ndatasets:\n  - path: train.jsonl\n    type: conversation\n"
                            "dataset_prepared_path: prepared\nsequence_len: 64\nper_device_train_batch_size: 2\n"
                            "learning_rate: 3.0e-3\nwarmup_steps: 2\nlogging_steps: 1\nweight_decay: 0.1\n"
                            "max_grad_norm: 0.05\ngradient_accumulation_steps: 2\nmax_steps: 6\n" +
                            extra);
    std::ostringstream log;
    run_training(load_train_config(p, {}, TrainMode::kSft), TrainMode::kSft, *gpu, log);
    logs.push_back(log.str());
  };
  train("resident", "");
  train("resident2", "");  // the control: two resident runs agree bit for bit
  train("offloaded", "offload_master: true\noffload_optimizer: true\n");
  EXPECT_NE(logs[2].find("offload: host memory holds"), std::string::npos) << logs[2];
  // Losses and grad norms bitwise (the metrics lines' other fields, tokens/s, differ run to run).
  auto numbers = [&](const std::string& out) {
    std::ifstream in(t.path / out / "metrics.jsonl");
    std::string l, keep;
    while (std::getline(in, l)) {
      for (const char* k : {"\"loss\":", "\"grad_norm\":"}) {
        const size_t at = l.find(k);
        if (at != std::string::npos) keep += l.substr(at, l.find_first_of(",}", at) - at) + ";";
      }
    }
    return keep;
  };
  EXPECT_FALSE(numbers("resident").empty());
  ASSERT_EQ(numbers("resident"), numbers("resident2")) << "two resident runs differ: the comparison would mean nothing";
  EXPECT_EQ(numbers("resident"), numbers("offloaded"));
  EXPECT_EQ(read_bytes(t.path / "resident" / "model" / "model.safetensors"),
            read_bytes(t.path / "offloaded" / "model" / "model.safetensors"));
}

}  // namespace
}  // namespace soltrain
