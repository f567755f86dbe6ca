// 8-bit blockwise AdamW (bitsandbytes' format, kernels/blockwise8.h) on the CPU: its quantisation maps and six
// updates against bitsandbytes' algorithm computed in torch (tests/tools/make_adamw8bit_reference.py, fixture
// tests/fixtures/adamw8bit), and the optimizer's state surviving a save and load bit for bit.
#include <algorithm>
#include <cmath>
#include <random>

#include "io/safetensors.h"
#include "kernels/blockwise8.h"
#include "model/checkpoint.h"
#include "test_util.h"
#include "train/optimizer.h"

namespace soltrain::test {
namespace {

std::vector<float> f32s(const TensorEntry& e) {
  std::vector<float> v(size_t(shape_numel(e.shape)));
  read_as_f32(e, e.shape, v.data(), "fixture");
  return v;
}
std::vector<uint8_t> u8s(const TensorEntry& e) {
  const auto* p = static_cast<const uint8_t*>(e.data);
  return std::vector<uint8_t>(p, p + shape_numel(e.shape));
}

TEST(AdamW8bit, MapsAreBitsandbytesDynamicMaps) {
  const SafetensorsFile ref(fixtures() / "adamw8bit" / "reference.safetensors");
  for (bool is_signed : {true, false}) {
    const auto ours = dynamic_quant_map(is_signed);
    const auto theirs = f32s(ref.at(is_signed ? "map_signed" : "map_unsigned"));
    ASSERT_EQ(theirs.size(), 256u);
    for (size_t i = 0; i < 256; ++i) EXPECT_EQ(ours[i], theirs[i]) << (is_signed ? "signed " : "unsigned ") << i;
  }
}

TEST(AdamW8bit, UpdatesMatchBitsandbytesComputedInTorch) {
  const SafetensorsFile ref(fixtures() / "adamw8bit" / "reference.safetensors");
  const auto& meta = ref.metadata();
  const int steps = std::stoi(meta.at("steps"));
  std::vector<float> w = f32s(ref.at("param0"));
  const int64_t n = int64_t(w.size()), blocks = (n + 255) / 256;
  ASSERT_GT(n % 256, 0) << "the fixture should end in a partial block";
  auto ops = make_cpu_ops();
  std::array<float, 256> maps[2] = {dynamic_quant_map(true), dynamic_quant_map(false)};
  std::vector<uint8_t> codes[2] = {std::vector<uint8_t>(size_t(n), 0), std::vector<uint8_t>(size_t(n), 0)};
  std::vector<float> absmax[2] = {std::vector<float>(size_t(blocks), 0), std::vector<float>(size_t(blocks), 0)};
  auto state = [&](int k) {
    return Blockwise8{Tensor{codes[k].data(), DType::U8, {n}}, Tensor{absmax[k].data(), DType::F32, {blocks}},
                      Tensor{maps[k].data(), DType::F32, {256}}};
  };
  for (int step = 1; step <= steps; ++step) {
    std::vector<float> g = f32s(ref.at("grad" + std::to_string(step)));
    const AdamWParams p{std::stof(meta.at("lr")),
                        std::stod(meta.at("beta1")),
                        std::stod(meta.at("beta2")),
                        std::stof(meta.at("eps")),
                        std::stof(meta.at("weight_decay")),
                        step,
                        std::stof(meta.at("grad_scale")),
                        nullptr,
                        0};
    ops->adamw_8bit(Tensor{w.data(), DType::F32, {n}}, Tensor{g.data(), DType::F32, {n}}, state(0), state(1), p,
                    nullptr);
    const std::string s = std::to_string(step);
    // torch's lerp/addcmul may round a moment differently by an ulp (fused multiply-adds), which moves a
    // code only where the moment sits on a bucket boundary: allow one step on a few elements.
    for (int k = 0; k < 2; ++k) {
      const auto want = u8s(ref.at((k ? "v_code" : "m_code") + s));
      int64_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_LE(std::abs(int(codes[k][i]) - int(want[i])), 1) << "step " << step << " state " << k << " at " << i;
        differ += codes[k][i] != want[i];
      }
      EXPECT_LE(differ, n / 500) << "step " << step << " state " << k;
      const auto want_abs = f32s(ref.at((k ? "v_absmax" : "m_absmax") + s));
      EXPECT_LE(rel_err(absmax[k].data(), want_abs.data(), want_abs.size()), 1e-6) << "step " << step;
    }
    const auto want_w = f32s(ref.at("param" + s));
    EXPECT_LE(rel_err(w.data(), want_w.data(), want_w.size()), 1e-6) << "step " << step;
  }
}

// Trains a few steps with 8-bit moments, saves, trains on; a fresh optimizer loaded from the file must continue
// bit for bit. A state file of the other kind is one line naming both.
TEST(AdamW8bit, StateSurvivesSaveAndLoadBitForBit) {
  TempDir t;
  auto ops = make_cpu_ops();
  auto model = load_pretrained(fixtures() / "models" / "qwen3-tiny", *ops);
  std::mt19937 rng(test_seed(5u));
  auto random_grads = [&] {
    for (Parameter& p : model->params().all())
      if (p.trainable) {
        auto g = random_vec(size_t(p.grad.numel()), rng, 0.01f);
        std::copy(g.begin(), g.end(), p.grad.f32());
      }
  };
  OptimizerConfig cfg;
  cfg.moments = Moments::Blockwise8;
  cfg.weight_decay = 0.1f;
  AdamW a(model->params(), *ops, Moments::Blockwise8);
  for (int i = 0; i < 3; ++i) {
    random_grads();
    a.step(cfg, 1e-3f);
  }
  a.save(t.path / "opt.safetensors");
  const auto snapshot = [&] {
    std::vector<float> all;
    for (const Parameter& p : model->params().all())
      if (p.trainable) all.insert(all.end(), p.master.f32(), p.master.f32() + p.master.numel());
    return all;
  };
  const auto before = snapshot();
  const std::mt19937 rng_at_save = rng;
  random_grads();
  a.step(cfg, 1e-3f);
  const auto continued = snapshot();
  // Rewind the weights, load the state into a new optimizer, take the same step.
  size_t off = 0;
  for (Parameter& p : model->params().all())
    if (p.trainable) {
      std::copy_n(before.begin() + off, p.master.numel(), p.master.f32());
      off += size_t(p.master.numel());
    }
  AdamW b(model->params(), *ops, Moments::Blockwise8);
  b.load(t.path / "opt.safetensors");
  EXPECT_EQ(b.steps_done(), 3);
  rng = rng_at_save;
  random_grads();
  b.step(cfg, 1e-3f);
  EXPECT_EQ(snapshot(), continued);
  EXPECT_LT(b.state_bytes(), size_t(model->params().numel()) * 3);  // ~2 bytes per parameter, not 8

  AdamW fp32(model->params(), *ops);
  try {
    fp32.load(t.path / "opt.safetensors");
    ADD_FAILURE() << "loaded 8-bit state into fp32 moments";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("saved with adamw_8bit, this run uses adamw (fp32 moments)"),
              std::string::npos)
        << e.what();
  }
}

// The GPU quantises through a bucket table instead of a binary search per value; it must pick the same code
// for every value: each midpoint and its float neighbours (the ties), the bucket edges, ±0, ±1, and random
// values of every magnitude down to 1e-12.
TEST(AdamW8bit, BucketedQuantisingEqualsTheBinarySearch) {
  SOLTRAIN_SEEDED_RNG(rng, 811);
  for (bool is_signed : {true, false}) {
    const auto map = dynamic_quant_map(is_signed);
    float mid[255];
    for (int i = 0; i < 255; ++i) mid[i] = (map[size_t(i)] + map[size_t(i) + 1]) / 2;
    uint8_t below[2][kQuantBuckets];
    for (int b = 0; b < kQuantBuckets; ++b) fill_quant_bucket(below, b, mid);
    std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f};
    for (float m : mid)
      for (float x : {m, std::nextafter(m, 2.0f), std::nextafter(m, -2.0f)}) xs.push_back(x);
    for (int b = 0; b < kQuantBuckets; ++b) {
      const float lo = blockwise8_detail::bucket_low(b), hi = blockwise8_detail::bucket_high(b);
      for (float x : {lo, std::nextafter(lo, 0.0f), std::nextafter(hi, 0.0f)})
        if (x <= 1.0f) xs.push_back(x), xs.push_back(-x);
    }
    std::uniform_real_distribution<float> exponent(-12.0f, 0.0f);
    for (int i = 0; i < 200000; ++i) {
      const float x = std::min(1.0f, std::pow(10.0f, exponent(rng)));
      xs.push_back(rng() % 2 ? x : -x);
    }
    int64_t longest = 0;
    for (float x : xs) {
      ASSERT_EQ(int(quantize_bucketed(x, mid, below)), int(quantize_to_map(x, mid))) << x << " signed " << is_signed;
      longest = std::max<int64_t>(longest, quantize_to_map(x, mid) - below[x < 0][blockwise8_detail::bucket_of(x)]);
    }
    EXPECT_LE(longest, 8) << "a bucket's scan should stay short";
  }
}

}  // namespace
}  // namespace soltrain::test
