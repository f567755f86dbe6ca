// The QLoRA formats against torch, through the fixtures tests/tools/check_quant.py writes on a machine with
// torch (tests/fixtures/quant): FP8 casts bit for bit equal to torch's float8_e4m3fn / float8_e5m2, NF4
// dequantised values equal to a torch implementation of bitsandbytes' code book lookup over our blocks and
// packed codes equal to bitsandbytes' quantize_4bit, FP8 blocks equal to transformers' quantizer, and an
// official-layout FP8 checkpoint giving the logits of its dequantised twin. Each skips, naming the tool, until
// its fixture exists.
#include <cmath>
#include <cstring>

#include "data/batch_file.h"
#include "io/safetensors.h"
#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

fs::path quant_fixture(const std::string& name) {
  return fixtures() / "quant" / name;
}
#define SKIP_WITHOUT(path)                                                                                        \
  if (!fs::exists(path))                                                                                          \
  GTEST_SKIP() << path.string()                                                                                   \
               << " is missing: run `python3 tests/tools/check_quant.py build/soltrain` on a machine with torch " \
                  "and commit tests/fixtures/quant"

std::vector<uint8_t> bytes_of(const TensorEntry& e) {
  const auto* p = static_cast<const uint8_t*>(e.data);
  return std::vector<uint8_t>(p, p + e.bytes);
}

TEST(QuantFixtures, Fp8CastsEqualTorchBitForBit) {
  const fs::path f = quant_fixture("fp8_casts.safetensors");
  SKIP_WITHOUT(f);
  const SafetensorsFile ref(f);
  const std::vector<float> x = to_f32(ref.at("x")), scales = to_f32(ref.at("scales"));
  ASSERT_EQ(ref.at("e4m3").dtype, DType::F8E4M3);
  ASSERT_EQ(ref.at("e5m2").dtype, DType::F8E5M2);
  const auto e4 = bytes_of(ref.at("e4m3")), e5 = bytes_of(ref.at("e5m2"));
  ASSERT_EQ(e4.size(), x.size() * scales.size());
  size_t bad4 = 0, bad5 = 0;
  for (size_t s = 0; s < scales.size(); ++s)
    for (size_t i = 0; i < x.size(); ++i) {
      const float p = x[i] * scales[s];  // the fp32 product torch cast
      const size_t k = s * x.size() + i;
      if (quant::f32_to_e4m3(p, false) != e4[k] && bad4++ < 5)
        ADD_FAILURE() << "e4m3 of " << p << ": ours " << int(quant::f32_to_e4m3(p, false)) << ", torch " << int(e4[k]);
      if (quant::f32_to_e5m2(p, false) != e5[k] && bad5++ < 5)
        ADD_FAILURE() << "e5m2 of " << p << ": ours " << int(quant::f32_to_e5m2(p, false)) << ", torch " << int(e5[k]);
    }
  EXPECT_EQ(bad4, 0u);
  EXPECT_EQ(bad5, 0u);
}

TEST(QuantFixtures, Nf4EqualsBitsandbytesInTorch) {
  const fs::path f = quant_fixture("nf4.safetensors");
  SKIP_WITHOUT(f);
  const SafetensorsFile ref(f);
  int checked = 0;
  for (const auto& [name, e] : ref.entries()) {
    if (name.find('.') != std::string::npos) continue;
    SCOPED_TRACE(name);
    const std::vector<float> w = to_f32(e);
    const int64_t n = int64_t(w.size());
    const quant::Nf4Layout l(n);
    std::vector<uint8_t> data(size_t(l.data_bytes())), scale(size_t(l.scale_bytes()));
    nf4_quantize(w.data(), n, data.data(), scale.data());
    EXPECT_EQ(data, bytes_of(ref.at(name + ".packed")));  // bitsandbytes' quantize_4bit in torch picked these
    std::vector<float> back(static_cast<size_t>(n));
    nf4_dequantize(data.data(), scale.data(), n, back.data());
    EXPECT_EQ(back, to_f32(ref.at(name + ".dequantised")));  // torch's code book lookup over our blocks
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(QuantFixtures, Fp8BlocksEqualTransformersQuantizer) {
  const fs::path f = quant_fixture("fp8_blocks.safetensors");
  SKIP_WITHOUT(f);
  const SafetensorsFile ref(f);
  int checked = 0;
  for (const auto& [name, e] : ref.entries()) {
    if (name.find('.') != std::string::npos) continue;
    SCOPED_TRACE(name);
    const std::vector<float> w = to_f32(e);
    const int64_t rows = e.shape[0], cols = e.shape[1];
    std::vector<uint8_t> q(w.size());
    std::vector<float> s(size_t(((rows + 127) / 128) * ((cols + 127) / 128))), back(w.size());
    fp8_block_quantize(w.data(), rows, cols, q.data(), s.data());
    EXPECT_EQ(q, bytes_of(ref.at(name + ".q")));
    EXPECT_EQ(s, to_f32(ref.at(name + ".scale_inv")));
    fp8_block_dequantize(q.data(), s.data(), rows, cols, back.data());
    EXPECT_EQ(back, to_f32(ref.at(name + ".dequantised")));
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

// The official layout loads as stored under LoRA (the FP8 base kept) and dequantised without it; both give
// the logits transformers computes on the dequantised bf16 twin.
TEST(QuantFixtures, Fp8CheckpointGivesItsDequantisedTwinsLogits) {
  const fs::path dir = quant_fixture("qwen3-fp8");
  SKIP_WITHOUT(dir);
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  const SafetensorsFile ref(dir / "expected.safetensors");
  const std::vector<float> expected = to_f32(ref.at("logits"));
  auto ops = make_cpu_ops();
  for (bool lora : {true, false}) {
    SCOPED_TRACE(lora ? "QLoRA over the stored FP8" : "dequantised into a full model");
    std::optional<LoraConfig> cfg;
    if (lora) cfg = LoraConfig{8, 16.0f, 0.0f, all_lora_module_names(), false, 1};
    auto model = load_pretrained(dir, *ops, cfg);
    if (lora) {
      EXPECT_EQ(model->params().at("model.layers.0.self_attn.q_proj.weight").format, WeightFormat::Fp8Block);
      EXPECT_GT(model->params().quantised_bytes(), 0u);
    }
    std::vector<float> logits(expected.size());
    model->plan(batch.rows, batch.seq_len);
    model->step(batch, false, logits.data());
    EXPECT_LE(rel_err(logits.data(), expected.data(), expected.size()), 1e-2);
  }
}

}  // namespace
}  // namespace soltrain::test
