// LoRA configurations no fixture covers (rsLoRA, target subsets, biased bases, dropout), checked by
// equivalence: the adapted model must equal the base with W + scale·B·A merged in (computed here), and its
// adapter gradients must be the merged weight's gradient projected: dA = scale·Bᵀ·dW, dB = scale·dW·Aᵀ.
// Also: training moves only the adapter, and dropout is deterministic and differentiated correctly.
#include <algorithm>
#include <numeric>

#include "data/batch_file.h"
#include "model/checkpoint.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"
#include "test_util.h"
#include "train/trainer.h"

namespace soltrain::test {
namespace {

struct Case {
  std::string model;
  LoraConfig lora;
};

std::vector<float> host_of(Ops& ops, const ParameterStore& ps, const Parameter& p) {
  std::vector<float> v(size_t(shape_numel(p.shape)));
  ps.download(ops, p, v.data());
  return v;
}

// C[m,n] = Σ_k A[m,k]·B[k,n] in double (row-major).
std::vector<double> matmul(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += double(a[size_t(i * k + q)]) * b[size_t(q * n + j)];
      c[size_t(i * n + j)] = s;
    }
  return c;
}

std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = a[size_t(i * cols + j)];
  return t;
}

class LoraEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(LoraEquivalence, AdapterEqualsMergedWeightsAndGradientsProject) {
  const Case& c = GetParam();
  const auto dir = fixtures() / "models" / c.model;
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  auto ops = make_cpu_ops();
  auto lora = load_pretrained(dir, *ops, c.lora);
  auto full = load_pretrained(dir, *ops);
  // The scale PEFT uses, written out here rather than taken from LoraConfig::scale().
  const double scale = c.lora.use_rslora ? c.lora.alpha / std::sqrt(double(c.lora.r)) : c.lora.alpha / c.lora.r;

  // Random adapters (B non-zero so they matter), and the same update merged into the full model's weights.
  std::mt19937 rng(42);
  int adapted = 0;
  for (int l = 0; l < lora->config().num_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      Parameter* a = lora->params().find(lora_a_name(l, LoraTarget(t)));
      Parameter* b = lora->params().find(lora_b_name(l, LoraTarget(t)));
      ASSERT_EQ(a != nullptr, c.lora.targets(LoraTarget(t)));
      if (!a) continue;
      ++adapted;
      const auto av = random_vec(size_t(a->master.numel()), rng, 0.3f);
      const auto bv = random_vec(size_t(b->master.numel()), rng, 0.3f);
      lora->params().upload(*ops, *a, av.data());
      lora->params().upload(*ops, *b, bv.data());
      Parameter& w = full->params().at(lora_module_path(l, LoraTarget(t)) + ".weight");
      const int64_t out = w.shape[0], in = w.shape[1];
      const auto ba = matmul(bv, av, out, c.lora.r, in);
      auto wv = host_of(*ops, full->params(), w);
      for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(double(wv[i]) + scale * ba[i]);
      full->params().upload(*ops, w, wv.data());
    }
  ASSERT_GT(adapted, 0);

  const int64_t V = lora->config().vocab_size;
  std::vector<float> logits_lora(size_t(batch.rows) * batch.seq_len * V), logits_full(logits_lora.size());
  for (auto* m : {lora.get(), full.get()}) {
    m->plan(batch.rows, batch.seq_len);
    ops->zero(m->params().all_grads());
  }
  const StepResult rl = lora->step(batch, true, logits_lora.data());
  const StepResult rf = full->step(batch, true, logits_full.data());
  EXPECT_LE(rel_err(logits_lora.data(), logits_full.data(), logits_full.size()), 1e-5);
  EXPECT_NEAR(rl.loss, rf.loss, 1e-5 * rf.loss);

  for (int l = 0; l < lora->config().num_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      if (!c.lora.targets(LoraTarget(t))) continue;
      const Parameter& a = lora->params().at(lora_a_name(l, LoraTarget(t)));
      const Parameter& b = lora->params().at(lora_b_name(l, LoraTarget(t)));
      const Parameter& w = full->params().at(lora_module_path(l, LoraTarget(t)) + ".weight");
      const int64_t out = w.shape[0], in = w.shape[1], r = c.lora.r;
      const auto dw = std::vector<float>(w.grad.f32(), w.grad.f32() + w.grad.numel());
      const auto av = host_of(*ops, lora->params(), a), bv = host_of(*ops, lora->params(), b);
      // y = x·(W + s·B·A)ᵀ ⇒ dL/dA = s·Bᵀ·dW [r,in], dL/dB = s·dW·Aᵀ [out,r].
      const auto da = matmul(transpose(bv, out, r), dw, r, out, in);
      const auto db = matmul(dw, transpose(av, r, in), out, in, r);
      std::vector<float> da_ref(da.size()), db_ref(db.size());
      for (size_t i = 0; i < da.size(); ++i) da_ref[i] = float(scale * da[i]);
      for (size_t i = 0; i < db.size(); ++i) db_ref[i] = float(scale * db[i]);
      EXPECT_LE(rel_err(a.grad.f32(), da_ref.data(), da_ref.size()), 1e-4) << a.name;
      EXPECT_LE(rel_err(b.grad.f32(), db_ref.data(), db_ref.size()), 1e-4) << b.name;
    }
}

LoraConfig cfg(int r, float alpha, std::vector<std::string> targets, bool rslora) {
  LoraConfig c;
  c.r = r;
  c.alpha = alpha;
  c.target_modules = std::move(targets);
  c.use_rslora = rslora;
  c.seed = 3;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, LoraEquivalence,
    ::testing::Values(Case{"qwen3-tiny", cfg(3, 5.0f, {"q_proj", "v_proj"}, true)},
                      Case{"qwen2-tiny-mqa-bias", cfg(2, 16.0f, {"k_proj", "o_proj", "down_proj"}, false)},
                      Case{"llama-tiny",
                           cfg(1, 3.0f, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
                               true)},
                      Case{"llama3-tiny-scaled", cfg(5, 7.5f, {"gate_proj", "up_proj"}, false)}),
    [](const auto& info) {
      std::string n = info.param.model + "_r" + std::to_string(info.param.lora.r);
      for (char& ch : n)
        if (!isalnum(ch)) ch = '_';
      return n;
    });

TEST(Lora, TrainingLowersTheLossAndLeavesTheBaseBitIdentical) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops, cfg(4, 8.0f, {"q_proj", "v_proj", "down_proj"}, false));
  // A fresh adapter (B = 0) leaves the model unchanged.
  model->plan(batch.rows, batch.seq_len);
  const double base_loss = to_f32(SafetensorsFile(dir / "expected.safetensors").at("loss"))[0];
  EXPECT_NEAR(model->step(batch, false).loss, base_loss, 1e-6 * base_loss);

  const OptimizerConfig opt{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f};
  const TrainHistory h = train_on_batch(*model, batch, opt, 8);
  EXPECT_LT(h.losses.back(), h.losses.front() - 0.1) << h.losses.front() << " -> " << h.losses.back();

  const CheckpointReader ckpt(dir);
  for (const Parameter& p : model->params().all()) {
    if (p.trainable) continue;
    const auto want = to_f32(ckpt.entry(p.name));
    ASSERT_EQ(want.size(), size_t(p.value.numel()));
    EXPECT_EQ(std::memcmp(p.value.data, want.data(), p.value.bytes()), 0) << p.name << " changed";
  }
  // The trained adapter, saved and merged, gives the trained model's outputs.
  TempDir t;
  save_adapter(*model, t.path / "adapter", {dir.string()});
  merge_adapter(dir, t.path / "adapter", t.path / "merged");
  auto merged = load_pretrained(t.path / "merged", *ops);
  merged->plan(batch.rows, batch.seq_len);
  EXPECT_NEAR(merged->step(batch, false).loss, h.losses.back(), 1e-5 * h.losses.back());
}

// The CPU twin of the CUDA LoRA training test (tests/gpu/test_cuda_lora.cpp): same config and margin.
TEST(Lora, TrainingWithDropoutOnAllProjectionsLowersTheLoss) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  auto ops = make_cpu_ops();
  LoraConfig c = cfg(8, 16.0f, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, false);
  c.dropout = 0.1f;
  auto model = load_pretrained(dir, *ops, c);
  model->plan(batch.rows, batch.seq_len);
  const double start = model->step(batch, false).loss;
  const TrainHistory h = train_on_batch(*model, batch, OptimizerConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f}, 8);
  EXPECT_LT(h.losses.back(), start - 0.1) << start << " -> " << h.losses.back();
}

TEST(Lora, DropoutOpKeepsOneMinusPScaledUp) {
  auto ops = make_cpu_ops();
  std::vector<float> x(100000, 2.0f), y(x.size());
  const Tensor tx{x.data(), DType::F32, {int64_t(x.size())}}, ty{y.data(), DType::F32, {int64_t(y.size())}};
  ops->dropout_scale(ty, tx, 0.5f, 0.25f, 123);
  int64_t kept = 0;
  for (float v : y) {
    if (v != 0) {
      EXPECT_FLOAT_EQ(v, 2.0f * 0.5f / 0.75f);
    }
    kept += v != 0;
  }
  EXPECT_NEAR(double(kept) / double(x.size()), 0.75, 0.01);
  std::vector<float> y2(x.size());
  ops->dropout_scale(Tensor{y2.data(), DType::F32, ty.shape}, tx, 0.5f, 0.25f, 123);
  EXPECT_EQ(y, y2);  // a pure function of the seed
  ops->dropout_scale(Tensor{y2.data(), DType::F32, ty.shape}, tx, 0.5f, 0.25f, 124);
  EXPECT_NE(y, y2);
}

TEST(Lora, DropoutIsDeterministicAndItsGradientsMatchFiniteDifferences) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  auto ops = make_cpu_ops();
  LoraConfig c = cfg(4, 8.0f, {"q_proj", "o_proj", "up_proj"}, false);
  c.dropout = 0.3f;
  auto model = load_pretrained(dir, *ops, c);
  model->plan(batch.rows, batch.seq_len);
  std::mt19937 rng(5);
  for (Parameter& p : model->params().all()) {
    if (!p.trainable) continue;
    const auto v = random_vec(size_t(p.master.numel()), rng, 0.3f);
    model->params().upload(*ops, p, v.data());
  }
  // Training steps draw masks from (seed, step): the same step repeats exactly, the next one differs, and
  // evaluation (no backward) has no dropout.
  auto loss_at = [&](int64_t s) {
    model->set_dropout_step(s);
    ops->zero(model->params().all_grads());
    return model->step(batch, true).loss;
  };
  const double l0 = loss_at(0);
  EXPECT_EQ(loss_at(0), l0);
  EXPECT_NE(loss_at(1), l0);
  const double eval = model->step(batch, false).loss;
  EXPECT_NE(eval, l0);

  loss_at(0);
  std::vector<std::pair<Parameter*, std::vector<float>>> grads;
  for (const char* n : {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                        "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight",
                        "base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight"}) {
    Parameter& p = model->params().at(n);
    grads.push_back({&p, std::vector<float>(p.grad.f32(), p.grad.f32() + p.grad.numel())});
  }
  for (auto& [p, g] : grads) {
    // The three largest gradient entries against central differences of the fp32 loss (eps 1e-2).
    std::vector<size_t> idx(g.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(),
                      [&](size_t a, size_t b) { return std::abs(g[a]) > std::abs(g[b]); });
    for (int k = 0; k < 3; ++k) {
      float* w = p->master.f32() + idx[size_t(k)];
      const float orig = *w, eps = 1e-2f;
      *w = orig + eps;
      const double up = loss_at(0);
      *w = orig - eps;
      const double down = loss_at(0);
      *w = orig;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(fd, g[idx[size_t(k)]], 2e-2 * std::abs(g[idx[size_t(k)]]) + 1e-5)
          << p->name << "[" << idx[size_t(k)] << "]";
    }
  }
}

}  // namespace
}  // namespace soltrain::test
