// Offload on CUDA: masters and moments in pinned host memory, streamed through two device staging chunks on
// the side stream, give the resident update's bits (the same adamw kernel on the same values); a short
// training run with offload gives the resident run's losses and weights.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "demo_run_util.h"
#include "gpu_test_util.h"
#include "offload_test_util.h"
#include "run_compare_util.h"
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
    const test::UpdateResult resident = test::expect_offloaded_updates_equal_resident(*gpu, seed, t.path, moments);
    // And the CUDA update is the CPU's (masters within fp32 rounding of the same arithmetic; 8-bit: the
    // codes round alike): the offloaded path did not silently skip the update.
    const test::UpdateResult on_cpu = test::run_updates(*cpu, seed, {}, 5, t.path / "cpu.safetensors", moments);
    for (size_t i = 0; i < on_cpu.masters.size(); ++i)
      ASSERT_NEAR(on_cpu.masters[i], resident.masters[i], 1e-5f + 1e-5f * std::abs(on_cpu.masters[i])) << i;
  }
}

TEST_F(CudaOffload, TrainingRunEqualsResident) {
  const test::DemoRunSetup s;
  const std::string keys =
      "device: cuda\nper_device_train_batch_size: 2\nlogging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0.05\n"
      "gradient_accumulation_steps: 2\nmax_steps: 6\n";
  s.train(*gpu, "resident", keys);
  s.train(*gpu, "resident2", keys);  // the control: two resident runs agree bit for bit
  const std::string log = s.train(*gpu, "offloaded", keys + "offload_master: true\noffload_optimizer: true\n");
  EXPECT_NE(log.find("offload: host memory holds"), std::string::npos) << log;
  test::expect_same_metrics(s.t.path / "resident", s.t.path / "resident2");  // else the comparison means nothing
  test::expect_same_metrics(s.t.path / "resident", s.t.path / "offloaded");
  EXPECT_EQ(test::read_bytes(s.t.path / "resident" / "model" / "model.safetensors"),
            test::read_bytes(s.t.path / "offloaded" / "model" / "model.safetensors"));
}

}  // namespace
}  // namespace soltrain
