// The MLP in token tiles on CUDA (model/activation_plan.h): tiled equals untiled within bf16 error on every
// recompute policy, with and without LoRA (dropout on: tiles must draw the untiled masks), and a tiled pass
// matches transformers' fp32 references as the untiled one does (test_cuda_model.cpp's tolerances).
#include "data/batch_file.h"
#include "gpu_test_util.h"
#include "model/checkpoint.h"

namespace soltrain::test {
namespace {

struct GpuPass {
  std::vector<float> logits;
  double loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
};

class CudaTokenTiles : public CudaTest {
 protected:
  GpuPass run(const HostBatch& batch, Recompute rc, bool lora, int64_t tile) {
    const auto dir = fixtures() / "models" / "qwen3-tiny";
    std::optional<LoraConfig> cfg;
    if (lora) cfg = LoraConfig{4, 8.0f, 0.2f, {"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}, false, 3};
    auto model = load_pretrained(dir, *gpu, cfg);
    std::mt19937 init(99);  // random B (PEFT starts it at zero, which would leave A's gradient zero)
    for (Parameter& p : model->params().all())
      if (p.name.find("lora_B") != std::string::npos) {
        const auto v = random_vec(size_t(p.value.numel()), init, 0.1f);
        model->params().upload(*gpu, p, v.data());
      }
    model->set_token_tile(tile);
    model->plan(batch.rows, batch.seq_len, rc);
    EXPECT_EQ(model->activation_plan().tile, std::min<int64_t>(tile, int64_t(batch.rows) * batch.seq_len));
    GpuPass r;
    r.logits.resize(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
    gpu->zero(model->params().all_grads());
    r.loss = model->step(batch, true, r.logits.data()).loss;
    for (const Parameter& p : model->params().all())
      if (p.trainable) {
        r.names.push_back(p.name);
        r.grads.push_back(download(p.grad));
      }
    return r;
  }
};

TEST_F(CudaTokenTiles, TiledEqualsUntiledWithinBf16Error) {
  const int vocab = load_model_config(fixtures() / "models" / "qwen3-tiny").vocab_size;
  HostBatch batch{2, 64, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < 128; ++i) {
    batch.input_ids.push_back(int32_t(rng() % uint32_t(vocab)));
    batch.targets.push_back(rng() % 5 == 0 ? -100 : int32_t(rng() % uint32_t(vocab)));
  }
  for (bool lora : {false, true})
    for (Recompute rc : {Recompute::None, Recompute::Full}) {
      const GpuPass whole = run(batch, rc, lora, 128);
      for (int64_t tile : {16, 24}) {  // 24: a tile that does not divide the 128 tokens (FP8-unusable sizes too)
        const GpuPass tiled = run(batch, rc, lora, tile);
        const std::string what = cat("lora ", lora, " recompute ", recompute_name(rc), " tile ", tile);
        EXPECT_NEAR(tiled.loss, whole.loss, 2e-3 * std::abs(whole.loss)) << what;
        EXPECT_LE(rel(tiled.logits, whole.logits), 1e-2) << what;
        ASSERT_EQ(tiled.grads.size(), whole.grads.size());
        for (size_t i = 0; i < whole.grads.size(); ++i) {
          ASSERT_GT(rms(whole.grads[i]), 0) << what << " " << whole.names[i];
          EXPECT_LE(rel(tiled.grads[i], whole.grads[i]), 2e-2) << what << " " << whole.names[i];
          EXPECT_TRUE(all_close(tiled.grads[i], whole.grads[i], 0.1 * rms(whole.grads[i]), 0.05))
              << what << " " << whole.names[i];
        }
      }
    }
}

TEST_F(CudaTokenTiles, TiledMatchesTransformersWithinBf16Error) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  auto model = load_pretrained(dir, *gpu);
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");  // 48 tokens: tiles 16, 16, 16
  const SafetensorsFile expected(dir / "expected.safetensors");
  model->set_token_tile(16);
  model->plan(batch.rows, batch.seq_len, Recompute::Full);
  std::vector<float> logits(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
  gpu->zero(model->params().all_grads());
  const StepResult r = model->step(batch, true, logits.data());
  EXPECT_LE(rel_err(logits.data(), to_f32(expected.at("logits")).data(), logits.size()), 2e-2);
  const float ref_loss = to_f32(expected.at("loss"))[0];
  EXPECT_NEAR(r.loss, ref_loss, 1e-2 * ref_loss);
  for (const Parameter& p : model->params().all()) {
    const auto ref = to_f32(expected.at("grad." + p.name));
    const auto got = download(p.grad);
    EXPECT_LE(rel(got, ref), 5e-2) << p.name;
    EXPECT_TRUE(all_close(got, ref, 0.3 * rms(ref), 0.1)) << p.name;
  }
}

}  // namespace
}  // namespace soltrain::test
