// optimizer_in_backward: each decoder layer updated the moment its backward ends, from gradients that live only
// in one of two slots (train/backward_update.h). A layer's backward never reads a later layer's weights, and the
// update is the same kernel on the same gradient values, so without clipping (refused anyway) the run equals
// the ordinary one bit for bit: losses, saved weights and optimizer state, with fp32 and 8-bit moments, with
// masters and moments offloaded (the streamed update run one layer at a time), LoRA, a Mixture-of-Experts model,
// and across a resume. The gradient norm is still logged (summed layer by layer: to rounding). What cannot run
// so is refused in one line.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "run_compare_util.h"
#include "update_run_util.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using test::read_bytes;
using test::read_jsonl;
using InBackwardRun = test::UpdateRunSetup;

constexpr const char* kInBackward = "optimizer_in_backward: true\n";

// Loss bit for bit; the logged gradient norm to rounding (per layer here, over one buffer there).
void expect_same_files(const InBackwardRun& s, const std::string& a, const std::string& b, const std::string& saved) {
  const std::string wa = s.file(a, saved);
  ASSERT_FALSE(wa.empty()) << a << "/" << saved;
  EXPECT_EQ(wa, s.file(b, saved)) << b << "/" << saved;
  EXPECT_EQ(s.file(a, "checkpoint-8/optimizer.safetensors"), s.file(b, "checkpoint-8/optimizer.safetensors")) << b;
}

TEST(OptimizerInBackward, FullFineTuneEqualsTheOrdinaryUpdateAndResumes) {
  InBackwardRun s;
  s.train("ordinary", "");
  const std::string log = s.train("in_backward", kInBackward);
  EXPECT_NE(log.find("optimizer_in_backward: each decoder layer is updated as its backward ends"), std::string::npos)
      << log;
  // killed after step 4 and resumed
  s.train("resumed", kInBackward);
  fs::remove_all(s.t.path / "resumed" / "checkpoint-8");
  fs::remove_all(s.t.path / "resumed" / "model");
  EXPECT_NE(s.train("resumed", kInBackward, {"resume_from_checkpoint=true"}).find("checkpoint-4 at step 4"),
            std::string::npos);
  for (const char* other : {"in_backward", "resumed"}) {
    SCOPED_TRACE(other);
    test::expect_same_losses_and_norms(s.t.path / "ordinary", s.t.path / other, 1e-12, 8);
    expect_same_files(s, "ordinary", other, "model/model.safetensors");
  }
  // the runs trained: the weights moved from the start (else equal files would prove nothing)
  EXPECT_NE(s.file("ordinary", "model/model.safetensors"), read_bytes(s.t.path / "model" / "model.safetensors"));
}

// 8-bit moments with the masters and moments in host memory: the streamed update runs layer by layer during
// backward (its write-backs left in flight until the update's end); and LoRA (the adapters of each layer).
TEST(OptimizerInBackward, EightBitOffloadedAndLoraEqualTheOrdinaryUpdate) {
  InBackwardRun s;
  const std::string eight = "optimizer: adamw_8bit\n", off = "offload_master: true\noffload_optimizer: true\n",
                    lora = "lora: true\nlora_rank: 4\nlora_alpha: 8\nlearning_rate: 2.0e-2\n";
  s.train("eight", eight);
  s.train("eight_in_backward", eight + off + kInBackward);
  test::expect_same_losses_and_norms(s.t.path / "eight", s.t.path / "eight_in_backward", 1e-12, 8);
  expect_same_files(s, "eight", "eight_in_backward", "model/model.safetensors");
  s.train("fp32_off", off);
  s.train("fp32_off_in_backward", off + kInBackward);
  test::expect_same_losses_and_norms(s.t.path / "fp32_off", s.t.path / "fp32_off_in_backward", 1e-12, 8);
  expect_same_files(s, "fp32_off", "fp32_off_in_backward", "model/model.safetensors");
  s.train("lora", lora);
  s.train("lora_in_backward", lora + kInBackward);
  test::expect_same_losses_and_norms(s.t.path / "lora", s.t.path / "lora_in_backward", 1e-12, 8);
  expect_same_files(s, "lora", "lora_in_backward", "adapter/adapter_model.safetensors");
}

// A Qwen3-MoE: the experts, router and the load-balancing loss's gradient, each layer's updated in backward.
TEST(OptimizerInBackward, MixtureOfExpertsEqualsTheOrdinaryUpdate) {
  InBackwardRun s(/*experts=*/4);
  s.train("ordinary", "");  // (the model's config.json turns the load-balancing loss on, coefficient 0.01)
  s.train("in_backward", kInBackward);
  test::expect_same_losses_and_norms(s.t.path / "ordinary", s.t.path / "in_backward", 1e-12, 8);
  expect_same_files(s, "ordinary", "in_backward", "model/model.safetensors");
}

TEST(OptimizerInBackward, RefusedWhereItCannotRunInOneLine) {
  InBackwardRun s;
  const std::pair<const char*, const char*> cases[] = {
      {"max_grad_norm: 1.0\n", "cannot clip: set max_grad_norm: 0 (got 1)"},
      {"gradient_accumulation_steps: 2\n", "set gradient_accumulation_steps: 1 (got 2)"},
      {"offload_grads: true\n", "keeps no layer gradients to offload: drop offload_grads"},
      {"gpus: 2\n", "with data parallel is not built yet"},
  };
  for (const auto& [extra, expected] : cases) {
    SCOPED_TRACE(extra);
    try {
      load_train_config(s.config("r", std::string(kInBackward) + extra), {}, TrainMode::kSft);
      ADD_FAILURE() << "accepted";
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("optimizer_in_backward"), std::string::npos) << what;
      EXPECT_NE(what.find(expected), std::string::npos) << what;
    }
  }
  // torchtune's name for it reads the same
  try {
    load_train_config(s.config("r", "optimizer_in_bwd: true\nmax_grad_norm: 1.0\n"), {}, TrainMode::kSft);
    ADD_FAILURE() << "optimizer_in_bwd with clipping was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot clip"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(s.t.path / "r"));
}

}  // namespace
}  // namespace soltrain
