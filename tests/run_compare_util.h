// Holding two runs or passes to each other bit for bit, for features that must not change a single result
// (offloading masters, checkpoints or the base to host memory: tests/test_offload*.cpp and their CUDA twins):
// a pass's gradients, a training run's logged metrics, a DPO LoRA run.
#pragma once
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/config.h"
#include "data_test_util.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "test_util.h"
#include "train/run_dpo.h"

namespace soltrain::test {

// rows × seq random ids under `vocab`, and random targets of which about one in `ignored_one_in` is not counted.
inline HostBatch random_batch(int rows, int seq, int vocab, uint32_t seed, uint32_t ignored_one_in = 7) {
  std::mt19937 rng(seed);
  HostBatch b{rows, seq, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < rows * seq; ++i) {
    b.input_ids.push_back(int32_t(rng() % uint32_t(vocab)));
    b.targets.push_back(rng() % ignored_one_in == 0 ? -100 : int32_t(rng() % uint32_t(vocab)));
  }
  return b;
}

// Random LoRA B matrices (PEFT starts them at zero, where every adapter's A gradient is zero too): a pass then
// has a gradient in every trainable tensor to compare.
inline void randomize_lora_b(Ops& ops, ParameterStore& ps, uint32_t seed) {
  std::mt19937 rng(seed);
  for (Parameter& p : ps.all())
    if (p.name.find("lora_B") != std::string::npos) {
      const auto v = random_vec(size_t(p.value.numel()), rng, 0.1f);
      ps.upload(ops, p, v.data());
    }
}

// A pass's loss and every trainable parameter's gradient, read back in store order.
struct GradPass {
  double loss = 0;
  std::vector<std::vector<float>> grads;
};

inline std::vector<std::vector<float>> trainable_grads(Ops& ops, const ParameterStore& ps) {
  std::vector<std::vector<float>> out;
  for (const Parameter& p : ps.all())
    if (p.trainable) {
      std::vector<float> v(size_t(p.grad.numel()));
      ops.copy(Tensor{v.data(), DType::F32, p.grad.shape, Device::CPU}, p.grad);
      out.push_back(std::move(v));
    }
  return out;
}

// `b` equals `a` bit for bit, and the gradients are not all zero. With `a2` (a second run of `a`'s settings)
// `a` must equal it first: on a device where two identical runs differed the comparison would mean nothing.
inline void expect_same_grads(const GradPass& a, const GradPass& b, const GradPass* a2 = nullptr) {
  if (a2) {
    ASSERT_EQ(std::bit_cast<uint64_t>(a.loss), std::bit_cast<uint64_t>(a2->loss)) << "two identical runs differ";
    ASSERT_EQ(a.grads.size(), a2->grads.size());
    for (size_t i = 0; i < a.grads.size(); ++i)
      ASSERT_EQ(0, std::memcmp(a.grads[i].data(), a2->grads[i].data(), a.grads[i].size() * 4))
          << "two identical runs differ: the comparison would mean nothing (parameter " << i << ")";
  }
  EXPECT_EQ(std::bit_cast<uint64_t>(a.loss), std::bit_cast<uint64_t>(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  double norm = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * 4)) << "parameter " << i;
    for (float x : a.grads[i]) norm += double(x) * x;
  }
  EXPECT_GT(norm, 1e-8) << "the gradients are zero: equal by accident";
}

// Two runs' metrics.jsonl: losses (training and evaluation) and grad norms of every logged step, bitwise, and
// at least one evaluation (forward-only passes) among them.
inline void expect_same_metrics(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto ma = read_jsonl(a / "metrics.jsonl"), mb = read_jsonl(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  ASSERT_FALSE(ma.empty());
  int evals = 0;
  for (size_t i = 0; i < ma.size(); ++i)
    for (const char* k : {"loss", "grad_norm", "eval_loss"}) {
      ASSERT_EQ(ma[i].contains(k), mb[i].contains(k)) << k << " line " << i;
      if (!ma[i].contains(k)) continue;
      evals += std::string(k) == "eval_loss";
      EXPECT_EQ(std::bit_cast<uint64_t>(ma[i][k].get<double>()), std::bit_cast<uint64_t>(mb[i][k].get<double>()))
          << k << " line " << i;
    }
  EXPECT_GT(evals, 0) << "no evaluation ran: forward-only passes went untested";
}

// Two training runs' metrics.jsonl: the same losses bitwise and grad norms within `norm_tolerance` relative (a
// norm summed in another order), `steps` logged updates, each with a nonzero norm.
inline void expect_same_losses_and_norms(const std::filesystem::path& a, const std::filesystem::path& b,
                                         double norm_tolerance, int steps) {
  const auto ma = read_jsonl(a / "metrics.jsonl"), mb = read_jsonl(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  int logged = 0;
  for (size_t i = 0; i < ma.size(); ++i) {
    if (!ma[i].contains("loss")) continue;
    ++logged;
    EXPECT_EQ(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>()) << "line " << i;
    const double na = ma[i]["grad_norm"].get<double>(), nb = mb[i]["grad_norm"].get<double>();
    EXPECT_GT(na, 0) << "line " << i;
    EXPECT_LE(std::abs(na - nb), norm_tolerance * na) << "line " << i;
  }
  EXPECT_EQ(logged, steps);
}

// DPO with LoRA on the CPU over `dir`'s `model` folder and a preference train.jsonl there: output_dir `out`
// under `dir`, the base keys below plus `extra`.
inline void run_dpo_lora(const std::filesystem::path& dir, const std::string& out, const std::string& extra) {
  const std::filesystem::path p = dir / (out + ".yaml");
  write_text(p, "model: model\noutput_dir: " + out +
                    "\ndatasets:\n  - path: train.jsonl\ndataset_prepared_path: prepared\nsequence_len: 48\n"
                    "per_device_train_batch_size: 4\nlearning_rate: 1.0e-2\nlogging_steps: 1\nbeta: 0.1\n"
                    "max_steps: 3\nlora: true\nlora_rank: 4\nlora_alpha: 8\n" +
                    extra);
  auto ops = make_cpu_ops();
  std::ostringstream log;
  run_dpo(load_train_config(p, {}, TrainMode::kDpo), *ops, log);
}

// Two DPO runs: the saved adapter, and every logged value but the timings (loss, rewards, margins), exactly.
inline void expect_same_dpo_run(const std::filesystem::path& a, const std::filesystem::path& b) {
  const std::string adapter = read_bytes(a / "adapter" / "adapter_model.safetensors");
  EXPECT_FALSE(adapter.empty());
  EXPECT_EQ(adapter, read_bytes(b / "adapter" / "adapter_model.safetensors"));
  const auto ma = read_jsonl(a / "metrics.jsonl"), mb = read_jsonl(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  int losses = 0;
  for (size_t i = 0; i < ma.size(); ++i)
    for (const auto& [k, v] : ma[i].items()) {
      if (k == "tokens_per_s" || k == "mfu") continue;  // timings
      losses += k == "loss";
      EXPECT_EQ(v, mb[i][k]) << k << " line " << i;
    }
  EXPECT_GT(losses, 0);
}

}  // namespace soltrain::test
