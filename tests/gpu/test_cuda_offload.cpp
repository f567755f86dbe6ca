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

// offload_grads on the device: each layer's gradients written into one of two slots and copied home on the side
// stream while the next layer runs, the second micro-batch's pass filled from the host copy a layer ahead on the
// upload stream, the update staging them up. Without clipping the run is the resident one bit for bit; four
// layers, so each slot is reused while copies are in flight.
TEST_F(CudaOffload, OffloadedGradientsTrainAsResident) {
  const test::DemoRunSetup s("", 4);
  const std::string keys =
      "device: cuda\nper_device_train_batch_size: 2\nlogging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0\n"
      "gradient_accumulation_steps: 2\nmax_steps: 6\n";
  s.train(*gpu, "resident", keys);
  const std::string log = s.train(*gpu, "grads", keys + "offload_grads: true\n");
  EXPECT_NE(log.find("offload_grads: each layer's backward"), std::string::npos) << log;
  s.train(*gpu, "all", keys + "offload_grads: true\noffload_master: true\noffload_optimizer: true\n");
  const auto ma = test::read_jsonl(s.t.path / "resident" / "metrics.jsonl");
  for (const char* other : {"grads", "all"}) {
    SCOPED_TRACE(other);
    const auto mb = test::read_jsonl(s.t.path / other / "metrics.jsonl");
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i) {
      if (!ma[i].contains("loss")) continue;
      EXPECT_EQ(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>()) << "line " << i;
      const double na = ma[i]["grad_norm"].get<double>(), nb = mb[i]["grad_norm"].get<double>();
      EXPECT_LE(std::abs(na - nb), 1e-6 * na) << "line " << i;  // summed layer by layer: another order
    }
    EXPECT_EQ(test::read_bytes(s.t.path / "resident" / "model" / "model.safetensors"),
              test::read_bytes(s.t.path / other / "model" / "model.safetensors"));
  }
}

// optimizer_in_backward on the device: each layer updated on the main stream as its backward ends (the streamed
// update's write-backs left in flight meanwhile) gives the ordinary run's bits, with fp32 and with 8-bit moments
// offloaded; bf16_stochastic_round (bf16 masters, no fp32 copy) equals itself in backward and tracks the fp32 run.
TEST_F(CudaOffload, OptimizerInBackwardTrainsAsTheOrdinaryUpdate) {
  const test::DemoRunSetup s("", 4);
  const std::string keys =
      "device: cuda\nper_device_train_batch_size: 2\nlogging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0\n"
      "max_steps: 6\n";
  const std::string ib = "optimizer_in_backward: true\n", eight = "optimizer: adamw_8bit\noffload_optimizer: true\n",
                    sr = "bf16_stochastic_round: true\n";
  s.train(*gpu, "ordinary", keys);
  const std::string log = s.train(*gpu, "in_backward", keys + ib);
  EXPECT_NE(log.find("optimizer_in_backward: each decoder layer is updated"), std::string::npos) << log;
  s.train(*gpu, "eight", keys + eight);
  s.train(*gpu, "eight_in_backward", keys + eight + ib);
  s.train(*gpu, "sr", keys + sr);
  s.train(*gpu, "sr_in_backward", keys + sr + ib + eight);
  s.train(*gpu, "sr_eight", keys + sr + eight);
  auto losses = [&](const char* run) {
    std::vector<double> l;
    for (const auto& j : test::read_jsonl(s.t.path / run / "metrics.jsonl"))
      if (j.contains("loss")) l.push_back(j["loss"].get<double>());
    return l;
  };
  auto weights = [&](const char* run) { return test::read_bytes(s.t.path / run / "model" / "model.safetensors"); };
  for (const auto& [a, b] : {std::pair{"ordinary", "in_backward"}, std::pair{"eight", "eight_in_backward"},
                             std::pair{"sr_eight", "sr_in_backward"}}) {
    SCOPED_TRACE(b);
    EXPECT_EQ(losses(a), losses(b));
    EXPECT_EQ(weights(a), weights(b));
  }
  const auto a = losses("ordinary"), b = losses("sr");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.03 * a[i]) << "step " << i + 1;
  EXPECT_NE(weights("ordinary"), weights("sr"));
}

}  // namespace
}  // namespace soltrain
