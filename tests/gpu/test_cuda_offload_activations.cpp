// `offload_activations` on CUDA: the layer-input checkpoints copied to pinned host memory on the side stream
// as forward writes them and prefetched back a layer ahead of backward, through a ring of two device slots,
// give the resident run's bits. Layers here are wide and the tokens many, so each copy (32 MiB at PCIe speed)
// takes about as long as a layer's compute: a missing event (a slot overwritten before its download finished,
// or read before its upload did) would show as different bits.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data_test_util.h"
#include "demo_run_util.h"
#include "gpu_test_util.h"
#include "model/checkpoint.h"
#include "run_compare_util.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

class CudaOffloadActivations : public test::CudaTest {};

using Pass = test::GradPass;

// Two forward + backward passes (gradients accumulate) with a forward-only pass between them.
Pass run_pass(Ops& ops, const fs::path& dir, bool offload, bool lora, const HostBatch& batch) {
  std::optional<LoraConfig> cfg;
  if (lora) cfg = LoraConfig{8, 16.0f, 0.0f, {"q_proj", "v_proj", "gate_proj", "down_proj"}, false, 3};
  auto model = load_pretrained(dir, ops, cfg);
  test::randomize_lora_b(ops, model->params(), 99);
  model->set_offload_checkpoints(offload);
  model->plan(batch.rows, batch.seq_len, Recompute::Full);
  EXPECT_EQ(model->checkpoint_host_bytes() > 0, offload);
  Pass r;
  model->step(batch, true);
  model->step(batch, false);
  r.loss = model->step(batch, true).loss;
  r.grads = test::trainable_grads(ops, model->params());
  return r;
}

TEST_F(CudaOffloadActivations, ForwardBackwardEqualsResidentBitwise) {
  test::TempDir t;
  DemoModelShape s;
  s.hidden = 1024, s.layers = 6, s.heads = 8, s.kv_heads = 4, s.head_dim = 128, s.intermediate = 2048;
  s.max_positions = 8192;
  write_random_model(t.path / "model", s, 21);
  const HostBatch batch = test::random_batch(2, 4096, 300, 5);
  for (bool lora : {false, true}) {  // bf16 / fp32 residual stream (and checkpoints)
    SCOPED_TRACE(lora ? "LoRA" : "full");
    const Pass a = run_pass(*gpu, t.path / "model", false, lora, batch);
    const Pass a2 = run_pass(*gpu, t.path / "model", false, lora, batch);
    const Pass b = run_pass(*gpu, t.path / "model", true, lora, batch);
    test::expect_same_grads(a, b, &a2);
  }
}

TEST_F(CudaOffloadActivations, TrainingRunEqualsResident) {
  const test::DemoRunSetup s("", 5);
  const std::string keys =
      "device: cuda\nper_device_train_batch_size: 2\nlogging_steps: 1\nweight_decay: 0.1\nmax_grad_norm: 0.5\n"
      "gradient_accumulation_steps: 2\nmax_steps: 6\nrecompute: full\neval_steps: 2\n";
  // (each run's learning rate in its own settings: a key given twice is refused)
  for (const std::string lora :
       {"learning_rate: 3.0e-3\n", "lora: true\nlora_rank: 4\nlora_alpha: 8\nlearning_rate: 2.0e-2\n"}) {
    const bool full = lora.find("lora:") == std::string::npos;
    SCOPED_TRACE(full ? "full" : "LoRA");
    const std::string tag = full ? "full" : "lora";
    s.train(*gpu, tag + "_resident", keys + lora);
    s.train(*gpu, tag + "_resident2", keys + lora);
    const std::string log = s.train(*gpu, tag + "_offloaded", keys + lora + "offload_activations: true\n");
    EXPECT_NE(log.find("offload_activations: the layer-input checkpoints take"), std::string::npos) << log;
    test::expect_same_metrics(s.t.path / (tag + "_resident"), s.t.path / (tag + "_resident2"));  // the control
    test::expect_same_metrics(s.t.path / (tag + "_resident"), s.t.path / (tag + "_offloaded"));
    const fs::path saved =
        full ? fs::path("model") / "model.safetensors" : fs::path("adapter") / "adapter_model.safetensors";
    EXPECT_EQ(test::read_bytes(s.t.path / (tag + "_resident") / saved),
              test::read_bytes(s.t.path / (tag + "_offloaded") / saved));
  }
}

}  // namespace
}  // namespace soltrain
