// Activation recompute (selective, full) against none: bitwise-identical logits, loss and gradients, with
// less activation memory; with LoRA dropout too (the recomputed forward must draw the same masks).
#include "core/error.h"
#include "data/batch_file.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

struct RecomputeRun {
  std::vector<float> logits;
  double loss;
  std::vector<std::vector<float>> grads;
  size_t activation_bytes;
};

RecomputeRun run(const std::string& name, Recompute rc, bool lora) {
  auto ops = make_cpu_ops();
  const auto dir = fixtures() / "models" / name;
  std::optional<LoraConfig> cfg;
  if (lora) cfg = LoraConfig{4, 8.0f, 0.2f, {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"}, false, 3};
  auto model = load_pretrained(dir, *ops, cfg);
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  model->plan(batch.rows, batch.seq_len, rc);
  RecomputeRun r;
  r.logits.resize(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
  ops->zero(model->params().all_grads());
  r.loss = model->step(batch, true, r.logits.data()).loss;
  for (const Parameter& p : model->params().all())
    if (p.trainable) r.grads.emplace_back(p.grad.f32(), p.grad.f32() + p.grad.numel());
  r.activation_bytes = model->activation_bytes();
  return r;
}

TEST(Recompute, EveryLevelIsBitwiseIdenticalAndSmaller) {
  for (const char* name : {"qwen3-tiny", "llama3-tiny-scaled", "qwen2-tiny-mqa-bias"})
    for (bool lora : {false, true}) {
      const RecomputeRun none = run(name, Recompute::None, lora);
      const RecomputeRun elem = run(name, Recompute::Elementwise, lora);
      const RecomputeRun sel = run(name, Recompute::Selective, lora);
      const RecomputeRun full = run(name, Recompute::Full, lora);
      for (const RecomputeRun* r : {&elem, &sel, &full}) {
        EXPECT_EQ(r->loss, none.loss) << name << " lora " << lora;
        EXPECT_EQ(r->logits, none.logits) << name << " lora " << lora;
        ASSERT_EQ(r->grads.size(), none.grads.size());
        for (size_t i = 0; i < none.grads.size(); ++i) EXPECT_EQ(r->grads[i], none.grads[i]) << name << " grad " << i;
      }
      EXPECT_LT(elem.activation_bytes, none.activation_bytes) << name;
      EXPECT_LT(sel.activation_bytes, elem.activation_bytes) << name;
      EXPECT_LT(full.activation_bytes, sel.activation_bytes) << name;
    }
}

TEST(Recompute, ParsesTheThreeSettings) {
  EXPECT_EQ(parse_recompute("none", "x"), Recompute::None);
  EXPECT_EQ(parse_recompute("elementwise", "x"), Recompute::Elementwise);
  EXPECT_EQ(parse_recompute("selective", "x"), Recompute::Selective);
  EXPECT_EQ(parse_recompute("full", "x"), Recompute::Full);
  EXPECT_THROW(parse_recompute("some", "x"), UserError);
}

}  // namespace
}  // namespace soltrain::test
