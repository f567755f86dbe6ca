// `offload_weights` on CUDA: a frozen LoRA base's decoder layers copied from pinned host memory into two
// device slots on the side stream, a layer ahead of its use, give the resident run's bits. The layers here
// are wide (30 MB of weights each) and the batch small, so a layer's copy takes longer than its compute: a
// missing event (a slot refilled while Main still reads it, or read before its copy finished) would show as
// different bits. With offloaded checkpoints too, both rings share the side stream.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "gpu_test_util.h"
#include "model/checkpoint.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

class CudaOffloadWeights : public test::CudaTest {};

struct Pass {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  int64_t copies = 0;
};

// Forward + backward, a forward alone, forward + backward again (gradients accumulate).
Pass run_pass(Ops& ops, const fs::path& dir, bool stream, Recompute rc, bool offload_checkpoints,
              const HostBatch& batch, int resident = 0) {
  LoraConfig cfg{8, 16.0f, 0.0f, {"q_proj", "v_proj", "gate_proj", "down_proj"}, false, 3};
  cfg.offload_base = stream;
  cfg.offload_resident_layers = resident;
  auto model = load_pretrained(dir, ops, cfg);
  std::mt19937 rng(99);
  for (Parameter& p : model->params().all())
    if (p.name.find("lora_B") != std::string::npos) {
      const auto v = test::random_vec(size_t(p.value.numel()), rng, 0.1f);
      model->params().upload(ops, p, v.data());
    }
  model->set_offload_checkpoints(offload_checkpoints);
  model->plan(batch.rows, batch.seq_len, rc);
  Pass r;
  model->step(batch, true);
  model->step(batch, false);
  r.loss = model->step(batch, true).loss;
  for (Parameter& p : model->params().all())
    if (p.trainable) {
      std::vector<float> v(size_t(p.grad.numel()));
      ops.copy(Tensor{v.data(), DType::F32, p.grad.shape, Device::CPU}, p.grad);
      r.grads.push_back(std::move(v));
    }
  if (model->weight_stream()) r.copies = model->weight_stream()->copies();
  return r;
}

TEST_F(CudaOffloadWeights, ForwardBackwardEqualsResidentBitwise) {
  test::TempDir t;
  DemoModelShape s;
  s.hidden = 1024, s.layers = 6, s.heads = 8, s.kv_heads = 4, s.head_dim = 128, s.intermediate = 4096;
  write_random_model(t.path / "model", s, 23);
  std::mt19937 rng(6);
  HostBatch batch{2, 256, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < 2 * 256; ++i) {
    batch.input_ids.push_back(int32_t(rng() % 300));
    batch.targets.push_back(rng() % 7 == 0 ? -100 : int32_t(rng() % 300));
  }
  struct Case {
    Recompute rc;
    bool ckpt;
    int resident;
  };
  for (const Case& c : {Case{Recompute::None, false, 0}, Case{Recompute::Full, false, 0},
                        Case{Recompute::Full, true, 0}, Case{Recompute::None, false, 3}}) {
    SCOPED_TRACE(cat("recompute ", recompute_name(c.rc), c.ckpt ? ", checkpoints offloaded" : "", ", ", c.resident,
                     " layers resident"));
    const Pass a = run_pass(*gpu, t.path / "model", false, c.rc, c.ckpt, batch);
    const Pass a2 = run_pass(*gpu, t.path / "model", false, c.rc, c.ckpt, batch);
    const Pass b = run_pass(*gpu, t.path / "model", true, c.rc, c.ckpt, batch, c.resident);
    const int S = 6 - c.resident;
    EXPECT_EQ(b.copies, 5 * S - 6);  // (test_offload_weights.cpp: what the ring copies)
    ASSERT_EQ(a.grads.size(), b.grads.size());
    EXPECT_EQ(std::bit_cast<uint64_t>(a.loss), std::bit_cast<uint64_t>(a2.loss)) << "two resident runs differ";
    EXPECT_EQ(std::bit_cast<uint64_t>(a.loss), std::bit_cast<uint64_t>(b.loss));
    for (size_t i = 0; i < a.grads.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(a.grads[i].data(), a2.grads[i].data(), a.grads[i].size() * 4))
          << "two resident runs differ: the comparison would mean nothing (parameter " << i << ")";
      ASSERT_EQ(0, std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * 4)) << "parameter " << i;
    }
  }
}

TEST_F(CudaOffloadWeights, TrainingRunEqualsResident) {
  test::TempDir t;
  DemoModelShape s;
  s.hidden = 64, s.layers = 5, s.heads = 2, s.kv_heads = 1, s.head_dim = 32, s.intermediate = 128;
  write_random_model(t.path / "model", s, 17);
  write_reversal_dataset(t.path / "train.jsonl", 200, 8);
  auto train = [&](const std::string& out, const std::string& extra) {
    const fs::path p = t.path / (out + ".yaml");
    test::write_text(p, "model: model\noutput_dir: " + out +
                            "\ndevice: cuda\ndatasets:\n  - path: train.jsonl\n    type: conversation\n"
                            "dataset_prepared_path: prepared\nsequence_len: 64\nper_device_train_batch_size: 2\n"
                            "warmup_steps: 2\nlogging_steps: 1\nmax_grad_norm: 0.5\ngradient_accumulation_steps: 2\n"
                            "max_steps: 6\nrecompute: full\nvalidation_split_ratio: 0.1\neval_steps: 2\n"
                            "lora: true\nlora_rank: 4\nlora_alpha: 8\nlearning_rate: 2.0e-2\n" +
                            extra);
    std::ostringstream log;
    run_training(load_train_config(p, {}, TrainMode::kSft), TrainMode::kSft, *gpu, log);
    return log.str();
  };
  train("resident", "");
  const std::string log = train("streamed", "offload_weights: true\noffload_activations: true\n");
  EXPECT_NE(log.find("offload_weights: 5 of the frozen base's 5 decoder layers take"), std::string::npos) << log;
  const auto ma = test::read_jsonl(t.path / "resident" / "metrics.jsonl"),
             mb = test::read_jsonl(t.path / "streamed" / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  int evals = 0;
  for (size_t i = 0; i < ma.size(); ++i)
    for (const char* k : {"loss", "grad_norm", "eval_loss"}) {
      ASSERT_EQ(ma[i].contains(k), mb[i].contains(k)) << k << " line " << i;
      if (!ma[i].contains(k)) continue;
      evals += std::string(k) == "eval_loss";
      EXPECT_EQ(ma[i][k], mb[i][k]) << k << " line " << i;
    }
  EXPECT_GT(evals, 0);
  std::ifstream a(t.path / "resident" / "adapter" / "adapter_model.safetensors", std::ios::binary),
      b(t.path / "streamed" / "adapter" / "adapter_model.safetensors", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));
}

}  // namespace
}  // namespace soltrain
