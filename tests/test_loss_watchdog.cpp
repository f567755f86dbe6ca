// The loss watchdog: NaN/inf stop at once; Axolotl's loss_watchdog_threshold / _patience count consecutive
// steps above the threshold; a run it stops ends with one line, exit 2, and its last checkpoint intact.
#include <cmath>
#include <map>

#include "fault_test_util.h"
#include "train/loss_watchdog.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

TEST(LossWatchdog, NonFiniteLossOrGradientNormStopsAtOnce) {
  LossWatchdog w(0, 3);  // threshold off: the non-finite check still runs
  EXPECT_FALSE(w.check(1, 2.5, 1.0, true));
  const auto nan_loss = w.check(2, NAN, 1.0, true);
  ASSERT_TRUE(nan_loss);
  EXPECT_NE(nan_loss->find("at step 2"), std::string::npos) << *nan_loss;
  const auto inf_norm = w.check(3, 2.0, INFINITY, true);
  ASSERT_TRUE(inf_norm);
  EXPECT_NE(inf_norm->find("gradient norm inf"), std::string::npos) << *inf_norm;
  // a step that trained no token has no loss: not a divergence
  EXPECT_FALSE(w.check(4, NAN, 0.0, false));
}

TEST(LossWatchdog, ThresholdNeedsPatienceConsecutiveSteps) {
  LossWatchdog w(5.0, 3);
  EXPECT_FALSE(w.check(1, 6.0, 1, true));
  EXPECT_FALSE(w.check(2, 7.0, 1, true));
  EXPECT_FALSE(w.check(3, 5.0, 1, true));  // at the threshold: not above it, and the count restarts
  EXPECT_FALSE(w.check(4, 6.0, 1, true));
  EXPECT_FALSE(w.check(5, 6.0, 1, true));
  EXPECT_FALSE(w.check(6, NAN, 0, false));  // nothing trained: neither counts nor resets
  const auto stop = w.check(7, 6.5, 1, true);
  ASSERT_TRUE(stop);
  EXPECT_NE(stop->find("above 5 for 3 steps"), std::string::npos) << *stop;
  LossWatchdog once(1.0, 1);
  EXPECT_TRUE(once.check(1, 1.5, 1, true));
}

TEST(LossWatchdog, SftStopsWithOneLineAndKeepsTheLastCheckpoint) {
  TinyRun r;
  const CliRun run =
      run_bounded("sft " + r.config("model: model\noutput_dir: run\nmax_steps: 10\nsave_steps: 1\nsave_total_limit: 2\n"
                                    "loss_watchdog_threshold: 0.001\nloss_watchdog_patience: 3\n"),
                  r.t, 60);
  expect_refused(run, "loss_watchdog_threshold: the loss stayed above 0.001 for 3 steps");
  EXPECT_NE(run.err.find("lower learning_rate"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("checkpoint-2 is the last checkpoint"), std::string::npos) << run.err;
  EXPECT_TRUE(fs::exists(r.t.path / "run" / "checkpoint-2" / "trainer_state.json"));
  EXPECT_FALSE(fs::exists(r.t.path / "run" / "checkpoint-3"));
  EXPECT_FALSE(fs::exists(r.t.path / "run" / "model"));
}

TEST(LossWatchdog, NanWeightsStopAtTheFirstStep) {
  TinyRun r;
  // A model whose final norm holds a NaN: the first loss is NaN.
  const fs::path st = r.t.path / "model" / "model.safetensors";
  std::map<std::string, std::vector<float>> values;
  std::vector<NamedTensor> tensors;
  {
    const SafetensorsFile f(st);
    for (const auto& [name, e] : f.entries()) values[name] = to_f32(e);
    for (auto& [name, v] : values) {
      if (name == "model.norm.weight") v[0] = NAN;
      tensors.push_back({name, Tensor{v.data(), DType::F32, f.at(name).shape}});
    }
  }
  write_safetensors(st, tensors);
  r.inputs_changed();
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: run\nlearning_rate: 0.5\n"), r.t),
                 "training diverged at step 1 (loss nan");
  EXPECT_FALSE(fs::exists(r.t.path / "run" / "model"));
}

}  // namespace
}  // namespace soltrain::test
