// Long sequences: the MLP run in token tiles (model/activation_plan.h) against the untiled pass, on every
// recompute policy, with and without LoRA (dropout included: a tile must draw the untiled mask), for tiles
// that divide the tokens and one that does not; against transformers' references; and the plan arithmetic
// of a 512k-token Qwen3-8B LoRA run, where nothing but the layer-input checkpoints may grow large.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data/batch_file.h"
#include "model/activation_plan.h"
#include "model/checkpoint.h"
#include "model/layer.h"
#include "qwen3_configs.h"
#include "run_compare_util.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain::test {
namespace {

struct Pass {
  std::vector<float> logits;
  double loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
  int64_t tile = 0;
};

// One forward + backward at token tile `tile` (0: the automatic tile, which covers these small batches).
Pass run(const std::string& name, const HostBatch* given, Recompute rc, bool lora, int64_t tile) {
  auto ops = make_cpu_ops();
  const auto dir = fixtures() / "models" / name;
  std::optional<LoraConfig> cfg;
  // Adapters on the MLP's three projections and two attention ones, with dropout.
  if (lora) cfg = LoraConfig{4, 8.0f, 0.2f, {"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}, false, 3};
  auto model = load_pretrained(dir, *ops, cfg);
  // B starts at zero (PEFT's init), which would leave A's gradient zero: random B makes every adapter count.
  std::mt19937 rng(99);
  for (Parameter& p : model->params().all())
    if (p.name.find("lora_B") != std::string::npos) {
      const auto v = random_vec(size_t(p.value.numel()), rng, 0.1f);
      model->params().upload(*ops, p, v.data());
    }
  const HostBatch batch = given ? *given : load_batch_file(dir / "batch.safetensors");
  model->set_token_tile(tile);
  model->plan(batch.rows, batch.seq_len, rc);
  Pass r;
  r.tile = model->activation_plan().tile;
  r.logits.resize(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
  ops->zero(model->params().all_grads());
  r.loss = model->step(batch, true, r.logits.data()).loss;
  for (const Parameter& p : model->params().all())
    if (p.trainable) {
      r.names.push_back(p.name);
      r.grads.emplace_back(p.grad.f32(), p.grad.f32() + p.grad.numel());
    }
  return r;
}

// Within fp32 rounding, not bitwise: besides the MLP's weight gradients, which sum tile by tile (each tile's
// partial sum rounded before the next is added), OpenBLAS picks its kernel and its split over threads by the
// matrix shape, so a row's dot products can round differently at M = tile than at M = all tokens (measured:
// last-bit differences in the logits at tile 16 on one thread, at 24 on two). A wrong tile (a missed row, a
// mask drawn at the wrong offset, a gradient not accumulated) moves values by far more than these bounds.
void expect_same(const Pass& tiled, const Pass& whole, const std::string& what) {
  EXPECT_NEAR(tiled.loss, whole.loss, 1e-6 * whole.loss) << what;
  EXPECT_LE(rel_err(tiled.logits.data(), whole.logits.data(), whole.logits.size()), 1e-6) << what;
  EXPECT_TRUE(all_close(tiled.logits, whole.logits, 1e-5 * rms(whole.logits), 1e-5)) << what;
  ASSERT_EQ(tiled.grads.size(), whole.grads.size()) << what;
  for (size_t i = 0; i < whole.grads.size(); ++i) {
    const std::string& p = whole.names[i];
    ASSERT_GT(rms(whole.grads[i]), 0) << what << " " << p << ": a zero gradient checks nothing";
    EXPECT_LE(rel_err(tiled.grads[i].data(), whole.grads[i].data(), whole.grads[i].size()), 1e-5) << what << " " << p;
    EXPECT_TRUE(all_close(tiled.grads[i], whole.grads[i], 1e-4 * rms(whole.grads[i]), 1e-4)) << what << " " << p;
  }
}

// A tile's LoRA dropout draws exactly the whole input's mask over its rows (LoraPass::at's offset): bitwise.
TEST(TokenTiles, TileDropoutMasksAreTheWholeMasksRows) {
  auto ops = make_cpu_ops();
  std::mt19937 rng(test_seed(7u));
  const int64_t N = 40, W = 24, t0 = 16, t1 = 36;
  std::vector<float> x = random_vec(size_t(N * W), rng), whole(x.size()), tile(size_t((t1 - t0) * W));
  LoraPass lp;
  lp.dropout = 0.3f, lp.seed = 11, lp.step = 2;
  const LoraDropout all = lp.at(1, LoraTarget::up), part = lp.at(1, LoraTarget::up, t0, W);
  ops->dropout_scale(Tensor{whole.data(), DType::F32, {N, W}}, Tensor{x.data(), DType::F32, {N, W}}, 1.0f, all.p,
                     all.seed);
  ops->dropout_scale(Tensor{tile.data(), DType::F32, {t1 - t0, W}}, Tensor{x.data() + t0 * W, DType::F32, {t1 - t0, W}},
                     1.0f, part.p, part.seed);
  EXPECT_EQ(tile, std::vector<float>(whole.begin() + t0 * W, whole.begin() + t1 * W));
  size_t dropped = 0;
  for (float v : tile) dropped += v == 0;
  EXPECT_GT(dropped, tile.size() / 10);  // the mask does drop (p = 0.3)
  EXPECT_LT(dropped, tile.size() / 2);
}

TEST(TokenTiles, TiledEqualsUntiledOnEveryRecomputePolicy) {
  const uint32_t seed = test_seed(2024u);
  SCOPED_TRACE(seed_message(seed));
  for (const char* name : {"qwen3-tiny", "llama3-tiny-scaled", "qwen2-tiny-mqa-bias"}) {
    const int vocab = load_model_config(fixtures() / "models" / name).vocab_size;
    const HostBatch batch = random_batch(2, 64, vocab, seed, 5);  // 128 tokens, one target in 5 not counted
    for (bool lora : {false, true})
      for (Recompute rc : {Recompute::None, Recompute::Elementwise, Recompute::Selective, Recompute::Full}) {
        const Pass whole = run(name, &batch, rc, lora, 128);
        ASSERT_EQ(whole.tile, 128);
        for (int64_t tile : {16, 24}) {  // 8 tiles; 5 tiles and a last one of 8
          const Pass tiled = run(name, &batch, rc, lora, tile);
          ASSERT_EQ(tiled.tile, tile);
          expect_same(tiled, whole, cat(name, " lora ", lora, " recompute ", recompute_name(rc), " tile ", tile));
        }
      }
  }
}

// Tiled passes against transformers (the fixtures' batch: 48 tokens, tiles of 16 and of 20).
TEST(TokenTiles, TiledMatchesTransformers) {
  for (const char* name : {"qwen3-tiny", "llama-tiny", "qwen2-tiny-mqa-bias", "llama3-tiny-scaled"})
    for (int64_t tile : {16, 20}) {
      auto ops = make_cpu_ops();
      const auto dir = fixtures() / "models" / name;
      auto model = load_pretrained(dir, *ops);
      const HostBatch batch = load_batch_file(dir / "batch.safetensors");
      const SafetensorsFile expected(dir / "expected.safetensors");
      model->set_token_tile(tile);
      model->plan(batch.rows, batch.seq_len, Recompute::Full);
      ASSERT_EQ(model->activation_plan().tile, tile);
      std::vector<float> logits(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
      ops->zero(model->params().all_grads());
      const StepResult r = model->step(batch, true, logits.data());
      const auto ref_logits = to_f32(expected.at("logits"));
      EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-5) << name;
      const float ref_loss = to_f32(expected.at("loss"))[0];
      EXPECT_LE(std::abs(r.loss - ref_loss) / ref_loss, 1e-6) << name;
      size_t checked = 0, ref_grads = 0;
      for (const Parameter& p : model->params().all()) {
        const auto ref = to_f32(expected.at("grad." + p.name));
        EXPECT_LE(rel_err(p.grad.f32(), ref.data(), ref.size()), 1e-4) << name << " " << p.name;
        EXPECT_TRUE(all_close(p.grad.f32(), ref.data(), ref.size(), 1e-3 * rms(ref), 1e-3)) << name << " " << p.name;
        ++checked;
      }
      for (auto& [n, e] : expected.entries()) ref_grads += n.starts_with("grad.");
      EXPECT_EQ(checked, ref_grads) << name;
    }
}

TEST(TokenTiles, AutomaticTileIsSizedByBytes) {
  // Qwen3-8B's intermediate 12288 in bf16: 512 MiB / 24 KiB = 21845 tokens, down to a multiple of 1024.
  EXPECT_EQ(token_tile_for(kTokenTileAuto, 524288, 12288, DType::BF16), 21504);
  EXPECT_EQ(token_tile_for(kTokenTileAuto, 4096, 12288, DType::BF16), 4096);      // never above the tokens
  EXPECT_EQ(token_tile_for(kTokenTileAuto, 1 << 20, 1 << 20, DType::F32), 1024);  // at least 1024
  EXPECT_EQ(token_tile_for(16, 64, 160, DType::F32), 16);
  EXPECT_EQ(token_tile_for(100, 64, 160, DType::F32), 64);
}

// The arena holds exactly the planned buffers (plus alignment), so the plan arithmetic is what a run allocates.
TEST(TokenTiles, PlanArithmeticIsWhatIsAllocated) {
  auto ops = make_cpu_ops();
  auto model = load_pretrained(fixtures() / "models" / "qwen3-tiny", *ops,
                               LoraConfig{4, 8.0f, 0.1f, {"q_proj", "down_proj"}, false, 3});
  model->set_token_tile(16);
  model->plan(2, 64, Recompute::Full);
  const ActivationPlan& p = model->activation_plan();
  EXPECT_GE(model->activation_bytes(), p.total_bytes());
  EXPECT_LE(model->activation_bytes(), p.total_bytes() + 256 * p.buffers.size());
  // Under full recompute only the layer inputs are kept per layer; the MLP's buffers are one tile.
  for (const PlannedBuffer& b : p.buffers) EXPECT_TRUE(b.checkpoint || b.copies == 1) << b.name;
  EXPECT_EQ(p.find("gate")->shape, (Shape{16, 160}));
  EXPECT_EQ(p.find("dact")->shape, (Shape{16, 160}));
}

// The plan of a Qwen3-8B LoRA run at batch 1 × 512k tokens, recompute full, as the GPU would allocate it
// (bf16 activations): apart from the layer-input checkpoints nothing exceeds 4 GiB, except, with LoRA's
// default fp32 residual stream, that stream's gradient and the recomputed mid-layer sum (fp32 [T, 4096]:
// 8 GiB), which attention couples across every token. Untiled, the MLP alone would need 6 × 12 GiB.
TEST(TokenTiles, Qwen3_8bLoraPlanAt512kTokens) {
  const ModelConfig c = test::qwen3_8b_config();
  const LoraConfig lora{
      16, 32.0f, 0.0f, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, false, 1};
  const int T = 512 * 1024;
  const size_t gib = size_t(1) << 30;
  for (DType res : {DType::BF16, DType::F32}) {
    const ActivationSettings s{1, T, Recompute::Full, DType::BF16, res, &lora, kTokenTileAuto, int64_t(1) << 30};
    const ActivationPlan p = plan_activations(c, s);
    SCOPED_TRACE(cat("residual ", dtype_name(res), ": ", describe_largest(p, 8)));
    EXPECT_EQ(p.tile, 21504);
    size_t rest = 0;
    for (const PlannedBuffer& b : p.buffers) {
      if (b.checkpoint) {
        EXPECT_EQ(b.name, "resid");
        EXPECT_EQ(b.copies, 37);
        EXPECT_EQ(b.bytes(), size_t(T) * 4096 * dtype_size(res));
        continue;
      }
      EXPECT_EQ(b.copies, 1) << b.name;  // recompute full: nothing else is kept per layer
      rest += b.total_bytes();
      const bool residual = b.name == "mid" || b.name == "dres";
      EXPECT_LE(b.bytes(), residual && res == DType::F32 ? 8 * gib : 4 * gib) << b.name;
      // No [T, intermediate] or [T, vocab] buffer: those have at most a tile's (or a head chunk's) rows.
      for (int64_t wide : {int64_t(c.intermediate_size), int64_t(c.vocab_size)})
        if (b.shape.size() == 2 && b.shape[1] == wide) {
          EXPECT_LE(b.shape[0], p.tile) << b.name;
        }
    }
    // Everything but the checkpoints: 78-86 GiB, beside 16 GiB of bf16 weights on a 139 GiB H200.
    EXPECT_LT(rest, (res == DType::F32 ? 87 : 79) * gib);
    // The untiled plan needs the MLP's six [T, 12288] bf16 buffers (12 GiB each) instead of tiles.
    ActivationSettings untiled = s;
    untiled.token_tile = T;
    const ActivationPlan u = plan_activations(c, untiled);
    EXPECT_EQ(u.total_bytes() - p.total_bytes(), 6 * (size_t(T) - size_t(p.tile)) * 12288 * 2);
  }
}

// Recompute elementwise keeps gate and up for the SwiGLU backward, but not act = silu(gate)·up, nor q and k after
// their norms and RoPE: one buffer each that backward refills (Recompute.EveryLevelIsBitwiseIdenticalAndSmaller
// checks the values); none keeps them all. The LM head's chunk: whole 128-row tiles, 256 MiB of fp32 logits for
// a frozen head, 1 GiB for a trained one.
TEST(TokenTiles, PlanOfElementwiseRecomputeAndTheHeadChunk) {
  const ModelConfig c = test::qwen3_8b_config();
  ActivationSettings s{2,           2048,    Recompute::None, DType::BF16,
                       DType::BF16, nullptr, kTokenTileAuto,  head_chunk_bytes_for(DType::BF16, true)};
  for (const char* n : {"gate", "up", "act", "q", "k", "q_raw"}) EXPECT_EQ(plan_activations(c, s).find(n)->copies, 36);
  s.recompute = Recompute::Elementwise;
  const ActivationPlan p = plan_activations(c, s);
  EXPECT_EQ(p.find("gate")->copies, 36);
  EXPECT_EQ(p.find("up")->copies, 36);
  EXPECT_EQ(p.find("act")->copies, 1);
  EXPECT_EQ(p.find("act")->shape, (Shape{4096, 12288}));
  EXPECT_EQ(p.find("q")->copies, 1);  // refilled from q_raw / k_raw (kept) with Qwen3's q/k norms
  EXPECT_EQ(p.find("k")->copies, 1);
  EXPECT_EQ(p.find("q_raw")->copies, 36);
  EXPECT_EQ(p.head_chunk, 1664);  // 1 GiB / (4 · 151936) = 1766 rows, 13 whole tiles
  s.head_chunk_bytes = head_chunk_bytes_for(DType::BF16, false);
  EXPECT_EQ(plan_activations(c, s).head_chunk, 384);  // 256 MiB: 441 rows, 3 whole tiles
  EXPECT_EQ(head_chunk_bytes_for(DType::F32, true), int64_t(64) << 20);
  s.rows = 1, s.seq_len = 100;
  EXPECT_EQ(plan_activations(c, s).head_chunk, 100);  // never more than the tokens
}

// A run's memory plan names the tile and the largest buffers (here the MLP's tile buffers are 16 rows).
TEST(TokenTiles, MemoryPlanShowsTheTileAndTheLargestBuffers) {
  TempDir t;
  DemoModelShape shape;
  shape.hidden = 64, shape.layers = 1, shape.heads = 2, shape.kv_heads = 1, shape.intermediate = 128;
  write_random_model(t.path / "model", shape, 3);
  write_reversal_dataset(t.path / "train.jsonl", 20, 4);
  std::ofstream(t.path / "c.yaml") << "model: model\noutput_dir: out\ndatasets:\n  - path: train.jsonl\n"
                                      "    type: conversation\nsequence_len: 64\nmax_steps: 1\ndevice: cpu\n"
                                      "recompute: full\ntoken_tile: 16\n";
  auto ops = make_cpu_ops();
  std::ostringstream log;
  run_training(load_train_config(t.path / "c.yaml", {}, TrainMode::kSft), TrainMode::kSft, *ops, log);
  const std::string text = log.str();
  const size_t at = text.find("sft: memory plan on cpu, ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string plan = text.substr(at, text.find("\n  largest: ", at) - at);
  EXPECT_NE(plan.find(" in all:\n"), std::string::npos) << plan;
  EXPECT_NE(plan.find("MLP token tile 16"), std::string::npos) << plan;
  const size_t l = text.find("\n  largest: ", at);
  EXPECT_NE(text.substr(l, text.find('\n', l + 1) - l).find("(layer inputs)"), std::string::npos) << text;
}

}  // namespace
}  // namespace soltrain::test
