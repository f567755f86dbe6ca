// `offload_weights` on CUDA: a frozen LoRA base's decoder layers copied from pinned host memory into two
// device slots on the upload stream, a layer ahead of its use, give the resident run's bits. The layers here
// are wide (30 MB of weights each) and the batch small, so a layer's copy takes longer than its compute: a
// missing event (a slot refilled while Main still reads it, or read before its copy finished) would show as
// different bits. With offloaded checkpoints too, whose copies run on the side stream at the same time.
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

class CudaOffloadWeights : public test::CudaTest {};

struct Pass : test::GradPass {
  int64_t copies = 0;
};

// Forward + backward, a forward alone, forward + backward again (gradients accumulate).
Pass run_pass(Ops& ops, const fs::path& dir, bool stream, Recompute rc, bool offload_checkpoints,
              const HostBatch& batch, int resident = 0) {
  LoraConfig cfg{8, 16.0f, 0.0f, {"q_proj", "v_proj", "gate_proj", "down_proj"}, false, 3};
  cfg.offload_base = stream;
  cfg.offload_resident_layers = resident;
  auto model = load_pretrained(dir, ops, cfg);
  test::randomize_lora_b(ops, model->params(), 99);
  model->set_offload_checkpoints(offload_checkpoints);
  model->plan(batch.rows, batch.seq_len, rc);
  Pass r;
  model->step(batch, true);
  model->step(batch, false);
  r.loss = model->step(batch, true).loss;
  r.grads = test::trainable_grads(ops, model->params());
  if (model->weight_stream()) r.copies = model->weight_stream()->copies();
  return r;
}

TEST_F(CudaOffloadWeights, ForwardBackwardEqualsResidentBitwise) {
  test::TempDir t;
  DemoModelShape s;
  s.hidden = 1024, s.layers = 6, s.heads = 8, s.kv_heads = 4, s.head_dim = 128, s.intermediate = 4096;
  write_random_model(t.path / "model", s, 23);
  const HostBatch batch = test::random_batch(2, 256, 300, 6);
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
    test::expect_same_grads(a, b, &a2);
  }
}

TEST_F(CudaOffloadWeights, TrainingRunEqualsResident) {
  const test::DemoRunSetup s("", 5);
  const std::string keys =
      "device: cuda\nper_device_train_batch_size: 2\nlogging_steps: 1\nmax_grad_norm: 0.5\n"
      "gradient_accumulation_steps: 2\nmax_steps: 6\nrecompute: full\neval_steps: 2\nlora: true\nlora_rank: 4\n"
      "lora_alpha: 8\nlearning_rate: 2.0e-2\n";
  s.train(*gpu, "resident", keys);
  const std::string log = s.train(*gpu, "streamed", keys + "offload_weights: true\noffload_activations: true\n");
  EXPECT_NE(log.find("offload_weights: 5 of the frozen base's 5 decoder layers take"), std::string::npos) << log;
  test::expect_same_metrics(s.t.path / "resident", s.t.path / "streamed");
  EXPECT_EQ(test::read_bytes(s.t.path / "resident" / "adapter" / "adapter_model.safetensors"),
            test::read_bytes(s.t.path / "streamed" / "adapter" / "adapter_model.safetensors"));
}

}  // namespace
}  // namespace soltrain
