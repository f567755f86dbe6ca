// FP8 block checkpoints in the official Qwen3 FP8 layout, made here from the qwen3-tiny fixture with the CPU
// quantiser: they load as stored under LoRA (and dequantised without it) with the logits of their dequantised
// twin; merge writes a plain bf16 model; a wrong block size or scale layout is one line naming the tensor.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "data/batch_file.h"
#include "kernels/cpu/quantize.h"
#include "model/checkpoint.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

bool is_projection(const std::string& n) {
  for (const char* p : kLoraModuleNames)
    if (n.ends_with(std::string(p) + ".weight")) return true;
  return false;
}

// qwen3-tiny as an FP8 checkpoint (and its dequantised fp32 twin); `tile_rows` != 128 writes a scale grid of
// another block size.
// `bf16_scales` stores scale_inv in BF16, as later Qwen FP8 releases do (the twin uses the rounded scales).
void write_fp8_model(const fs::path& src, const fs::path& dst, const fs::path& twin, int64_t tile_rows = 128,
                     const nlohmann::json& quant = {{"quant_method", "fp8"},
                                                    {"fmt", "e4m3"},
                                                    {"activation_scheme", "dynamic"},
                                                    {"weight_block_size", {128, 128}}},
                     bool bf16_scales = false) {
  const SafetensorsFile in(src / "model.safetensors");
  std::vector<std::vector<uint8_t>> store;
  store.reserve(3 * in.entries().size());
  std::vector<NamedTensor> fp8, dense;
  auto keep = [&](std::vector<NamedTensor>& out, const std::string& name, DType t, Shape s, const void* p) {
    const size_t n = size_t(shape_numel(s)) * dtype_size(t);
    store.emplace_back(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    out.push_back({name, Tensor{store.back().data(), t, std::move(s), Device::CPU}});
  };
  for (const auto& [name, e] : in.entries()) {
    std::vector<float> w = to_f32(e);
    if (is_projection(name)) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      std::vector<uint8_t> q(w.size());
      std::vector<float> s(size_t(((rows + 127) / 128) * ((cols + 127) / 128)));
      fp8_block_quantize(w.data(), rows, cols, q.data(), s.data());
      std::vector<uint16_t> s16(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        s16[i] = f32_to_bf16(s[i]);
        if (bf16_scales) s[i] = bf16_to_f32(s16[i]);
      }
      fp8_block_dequantize(q.data(), s.data(), rows, cols, w.data());
      keep(fp8, name, DType::F8E4M3, e.shape, q.data());
      const int64_t scale_rows = (rows + tile_rows - 1) / tile_rows;
      s.resize(size_t(scale_rows * ((cols + 127) / 128)), 1.0f);
      s16.resize(s.size(), f32_to_bf16(1.0f));
      if (bf16_scales)
        keep(fp8, name + "_scale_inv", DType::BF16, {scale_rows, (cols + 127) / 128}, s16.data());
      else
        keep(fp8, name + "_scale_inv", DType::F32, {scale_rows, (cols + 127) / 128}, s.data());
    } else {
      keep(fp8, name, DType::F32, e.shape, w.data());
    }
    keep(dense, name, DType::F32, e.shape, w.data());
  }
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  for (const auto& [dir, tensors, q] : {std::tuple{dst, &fp8, true}, std::tuple{twin, &dense, false}}) {
    fs::create_directories(dir);
    write_safetensors(dir / "model.safetensors", *tensors);
    nlohmann::json c = cfg;
    if (q) c["quantization_config"] = quant;
    std::ofstream(dir / "config.json") << c.dump(2);
  }
}

class Fp8Scales : public ::testing::TestWithParam<bool> {};

TEST_P(Fp8Scales, LoadsAsStoredWithItsTwinsLogits) {
  TempDir t;
  const fs::path src = fixtures() / "models" / "qwen3-tiny";
  write_fp8_model(src, t.path / "fp8", t.path / "twin", 128,
                  {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}}, GetParam());
  const HostBatch batch = load_batch_file(src / "batch.safetensors");
  auto ops = make_cpu_ops();
  const LoraConfig lora{4, 8.0f, 0.0f, all_lora_module_names(), false, 1};
  auto twin = load_pretrained(t.path / "twin", *ops, lora);
  std::vector<float> expected(batch.input_ids.size() * size_t(twin->config().vocab_size)), got(expected.size());
  twin->plan(batch.rows, batch.seq_len);
  twin->step(batch, false, expected.data());
  for (bool with_lora : {true, false}) {
    SCOPED_TRACE(with_lora ? "LoRA: FP8 as stored" : "full: dequantised");
    auto model = load_pretrained(t.path / "fp8", *ops, with_lora ? std::optional(lora) : std::nullopt);
    EXPECT_EQ(model->params().at("model.layers.1.mlp.down_proj.weight").format,
              with_lora ? WeightFormat::Fp8Block : WeightFormat::Dense);
    model->plan(batch.rows, batch.seq_len);
    model->step(batch, false, got.data());
    EXPECT_LT(rel_err(got.data(), expected.data(), got.size()), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8Checkpoint, Fp8Scales, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "bf16_scales" : "f32_scales";
                         });

TEST(Fp8Checkpoint, MergeWritesAPlainBf16Model) {
  TempDir t;
  const fs::path src = fixtures() / "models" / "qwen3-tiny";
  write_fp8_model(src, t.path / "fp8", t.path / "twin");
  auto ops = make_cpu_ops();
  auto model = load_pretrained(t.path / "fp8", *ops, LoraConfig{4, 8.0f, 0.0f, {"q_proj", "down_proj"}, false, 1});
  std::mt19937 rng(3);
  for (Parameter& p : model->params().all())
    if (p.trainable) {
      const auto v = random_vec(size_t(p.master.numel()), rng, 0.1f);
      model->params().upload(*ops, p, v.data());
    }
  save_adapter(*model, t.path / "adapter", {(t.path / "fp8").string()});
  merge_adapter(t.path / "fp8", t.path / "adapter", t.path / "merged");
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(t.path / "merged" / "config.json"));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  const SafetensorsFile merged(t.path / "merged" / "model.safetensors");
  for (const auto& [name, e] : merged.entries()) {
    EXPECT_FALSE(name.ends_with("_scale_inv")) << name;
    if (is_projection(name)) {
      EXPECT_EQ(e.dtype, DType::BF16) << name;
    }
  }
  // The merged model computes what the FP8 base with its adapter computes (up to bf16 weights).
  const HostBatch batch = load_batch_file(src / "batch.safetensors");
  std::vector<float> a(batch.input_ids.size() * size_t(model->config().vocab_size)), b(a.size());
  model->plan(batch.rows, batch.seq_len);
  model->step(batch, false, a.data());
  auto merged_model = load_pretrained(t.path / "merged", *ops);
  merged_model->plan(batch.rows, batch.seq_len);
  merged_model->step(batch, false, b.data());
  EXPECT_LT(rel_err(b.data(), a.data(), a.size()), 1e-2);
}

// One line naming the tensor or key, exit code 2.
TEST(Fp8Checkpoint, UnknownBlockSizeOrScaleLayoutIsOneLine) {
  TempDir t;
  const fs::path src = fixtures() / "models" / "qwen3-tiny";
  write_fp8_model(src, t.path / "rows64", t.path / "twin", 64);
  write_fp8_model(src, t.path / "block64", t.path / "twin", 128,
                  {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {64, 64}}});
  write_fp8_model(src, t.path / "bnb", t.path / "twin", 128, {{"quant_method", "bitsandbytes"}});
  const fs::path batch = src / "batch.safetensors";
  for (const auto& [dir, message] :
       {std::pair{"rows64",
                  "tensor 'model.layers.0.mlp.gate_proj.weight_scale_inv': shape [3, 1] is not one "
                  "scale per 128x128 block"},
        std::pair{"block64", "quantization_config.weight_block_size [64,64] is not supported"},
        std::pair{"bnb", "stored as FP8 blocks, but config.json's quantization_config is bitsandbytes"}}) {
    SCOPED_TRACE(dir);
    const CliRun r = run("dump --model " + (t.path / dir).string() + " --batch " + batch.string() + " --out " +
                             (t.path / "out.safetensors").string(),
                         t);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace soltrain::test
