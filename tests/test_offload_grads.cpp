// offload_grads: the decoder layers' gradients in host memory, each layer's backward writing into one of two
// device slots copied home after it (train/grad_offload.h), the update staging them up with its state. The
// gradients are the same sums in another place, so without clipping a run equals the resident one bit for bit
// (losses, weights, optimizer state), with gradient accumulation (the second pass adds onto the host copy) and
// a resume; with clipping the norm is summed layer by layer (another order), so it and the run agree to
// rounding. The store keeps the head's group on the device; the plan and the refusals say what happens.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/config.h"
#include "core/error.h"
#include "data_test_util.h"
#include "demo_run_util.h"
#include "run_compare_util.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using test::read_jsonl;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(OffloadGrads, StoreKeepsTheHeadGroupOnTheDevice) {
  const uint32_t seed = test::test_seed(20261205u);
  SCOPED_TRACE(test::seed_message(seed));
  std::mt19937 rng(seed);
  auto ops = make_cpu_ops();
  ParameterStore ps;
  for (int g = 0; g < 2; ++g) {
    ps.add("model.layers." + std::to_string(g) + ".mlp.up_proj.weight", {12, 8}, true, g);
    ps.add("model.layers." + std::to_string(g) + ".input_layernorm.weight", {8}, true, g);
  }
  ps.add("model.embed_tokens.weight", {30, 8}, true, 2);
  ps.add("model.norm.weight", {8}, true, 2);
  ps.allocate(*ops);
  std::vector<std::vector<float>> before;
  for (Parameter& p : ps.all()) {
    before.push_back(test::random_vec(size_t(shape_numel(p.shape)), rng, 1.0f));
    ops->copy(p.grad, Tensor{before.back().data(), DType::F32, p.shape, Device::CPU});
  }
  const Tensor old_head = ps.group_grads(2);
  ps.move_layer_grads_to_host(*ops, 2);
  EXPECT_EQ(ps.host_grad_bytes(), size_t(2 * (96 + 8)) * 4);
  EXPECT_EQ(ps.trainable_bytes().grads, size_t(240 + 8) * 4);  // the head's group alone stays
  EXPECT_TRUE(ps.group_grads_on_host(0) && ps.group_grads_on_host(1) && !ps.group_grads_on_host(2));
  for (const ParamRange& r : ps.ranges()) EXPECT_EQ(ps.grads_on_host(r), r.group < 2) << r.group;
  EXPECT_NE(ps.group_grads(2).data, old_head.data);  // a new device buffer for the head's group
  EXPECT_ANY_THROW(ps.all_grads());                  // no longer one buffer
  // Every gradient kept its values through the move, and each parameter's grad is its home.
  for (size_t i = 0; i < ps.all().size(); ++i) {
    const Parameter& p = ps.all()[i];
    std::vector<float> now(size_t(shape_numel(p.shape)));
    ps.download_grad(*ops, p, now.data());
    EXPECT_EQ(now, before[i]) << p.name;
    const Tensor home = ps.grads(ParamRange{p.group, p.decay, p.offset, shape_numel(p.shape)});
    EXPECT_EQ(p.grad.data, home.data) << p.name;
  }
  EXPECT_ANY_THROW(ps.move_layer_grads_to_host(*ops, 2));  // once
}

// Every step logged; accumulation of two micro-batches (the second pass adds onto the host copy); a checkpoint
// half way. max_grad_norm 0: the update reads the gradients alone, so offloaded and resident runs are one.
constexpr const char* kRunKeys =
    "per_device_train_batch_size: 2\nlogging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0\n"
    "gradient_accumulation_steps: 2\nmax_steps: 8\nsave_steps: 4\n";

struct RunSetup : test::DemoRunSetup {
  std::string train(const std::string& out, const std::string& extra, std::vector<std::string> set = {}) const {
    auto ops = make_cpu_ops();
    std::ostringstream log;
    run_training(load_train_config(config(out, test::yaml_with(kRunKeys, extra)), set, TrainMode::kSft),
                 TrainMode::kSft, *ops, log);
    return log.str();
  }
};

// Loss bit for bit, the gradient norm to rounding (summed layer by layer when offloaded) or bit for bit.
TEST(OffloadGrads, TrainingRunEqualsResidentAndResumes) {
  RunSetup s;
  s.train("resident", "");
  const std::string grads = "offload_grads: true\n", all = grads + "offload_master: true\noffload_optimizer: true\n";
  const std::string log = s.train("grads", grads);
  EXPECT_NE(log.find("the decoder layers' gradients"), std::string::npos) << log;
  EXPECT_NE(log.find("offload_grads: each layer's backward writes its gradients into one of two device slots"),
            std::string::npos)
      << log;
  s.train("all", all);
  // Killed after step 4 and resumed with everything offloaded.
  s.train("resumed", all);
  const fs::path a = s.t.path / "resident", r = s.t.path / "resumed";
  fs::remove_all(r / "checkpoint-8");
  fs::remove_all(r / "model");
  EXPECT_NE(s.train("resumed", all, {"resume_from_checkpoint=true"}).find("checkpoint-4 at step 4"), std::string::npos);
  for (const char* other : {"grads", "all", "resumed"}) {
    SCOPED_TRACE(other);
    const fs::path b = s.t.path / other;
    test::expect_same_losses_and_norms(a, b, 1e-12, 8);
    EXPECT_EQ(read_bytes(a / "model" / "model.safetensors"), read_bytes(b / "model" / "model.safetensors"));
    EXPECT_EQ(read_bytes(a / "checkpoint-8" / "optimizer.safetensors"),
              read_bytes(b / "checkpoint-8" / "optimizer.safetensors"));
  }
  // The runs trained: the weights moved from the start (else equal files would prove nothing).
  EXPECT_NE(read_bytes(a / "model" / "model.safetensors"), read_bytes(s.t.path / "model" / "model.safetensors"));
}

// 8-bit moments with everything offloaded (the full fine-tune of a model far larger than the device), and LoRA
// (only the adapters' gradients go home).
TEST(OffloadGrads, EightBitAndLoraRunsEqualResident) {
  RunSetup s;
  const std::string eight = "optimizer: adamw_8bit\n",
                    lora = "lora: true\nlora_rank: 4\nlora_alpha: 8\nlearning_rate: 2.0e-2\n",
                    all = "offload_grads: true\noffload_master: true\noffload_optimizer: true\n";
  s.train("eight", eight);
  s.train("eight_offloaded", eight + all);
  test::expect_same_losses_and_norms(s.t.path / "eight", s.t.path / "eight_offloaded", 1e-12, 8);
  EXPECT_EQ(read_bytes(s.t.path / "eight" / "model" / "model.safetensors"),
            read_bytes(s.t.path / "eight_offloaded" / "model" / "model.safetensors"));
  s.train("lora", lora);
  s.train("lora_offloaded", lora + "offload_grads: true\n");
  test::expect_same_losses_and_norms(s.t.path / "lora", s.t.path / "lora_offloaded", 1e-12, 8);
  const std::string adapter = read_bytes(s.t.path / "lora" / "adapter" / "adapter_model.safetensors");
  EXPECT_FALSE(adapter.empty());
  EXPECT_EQ(adapter, read_bytes(s.t.path / "lora_offloaded" / "adapter" / "adapter_model.safetensors"));
}

// Clipping reads the norm, summed layer by layer as each goes home (resident: over one buffer): the runs agree
// to rounding, and the clipping bit (the norm is over max_grad_norm every step).
TEST(OffloadGrads, ClippedRunTracksResident) {
  RunSetup s;
  const std::string clip = "max_grad_norm: 0.05\n";
  s.train("resident", clip);
  s.train("grads", clip + "offload_grads: true\n");
  const auto ma = read_jsonl(s.t.path / "resident" / "metrics.jsonl"),
             mb = read_jsonl(s.t.path / "grads" / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  bool clipped = false;
  for (size_t i = 0; i < ma.size(); ++i) {
    if (!ma[i].contains("loss")) continue;
    const double la = ma[i]["loss"].get<double>(), lb = mb[i]["loss"].get<double>();
    EXPECT_LE(std::abs(la - lb), 1e-5 * la) << "line " << i;
    const double na = ma[i]["grad_norm"].get<double>(), nb = mb[i]["grad_norm"].get<double>();
    EXPECT_LE(std::abs(na - nb), 1e-5 * na) << "line " << i;
    clipped = clipped || na > 0.05;
  }
  EXPECT_TRUE(clipped) << "max_grad_norm 0.05 never clipped: the test would not cover clipping";
  EXPECT_NE(read_bytes(s.t.path / "resident" / "model" / "model.safetensors"),
            read_bytes(s.t.path / "model" / "model.safetensors"));
}

TEST(OffloadGrads, RefusedWithShardedUpdates) {
  RunSetup s;
  try {
    load_train_config(s.config("z", "offload_grads: true\nzero_stage: 2\n"), {}, TrainMode::kSft);
    ADD_FAILURE() << "offload_grads with zero_stage 2 was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_grads with zero_stage 2 is not built yet"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace soltrain
