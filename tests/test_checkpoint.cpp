// Saving a model as an HF folder and loading it back: bit-exact, sharded or not, atomic, and with clear
// errors when weights and config disagree.
#include <bit>
#include <fstream>

#include "core/error.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

// Perturbs every parameter with fresh noise so a save that wrote the original file back would fail.
void perturb(Transformer& m, std::mt19937& rng) {
  for (Parameter& p : m.params().all()) {
    const auto noise = random_vec(size_t(p.value.numel()), rng, 0.01f);
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.f32()[i] += noise[size_t(i)];
  }
}

void expect_same_bits(const Transformer& a, const Transformer& b) {
  ASSERT_EQ(a.params().all().size(), b.params().all().size());
  for (const Parameter& p : a.params().all()) {
    const Parameter& q = b.params().at(p.name);
    ASSERT_EQ(p.shape, q.shape) << p.name;
    EXPECT_EQ(0, std::memcmp(p.value.data, q.value.data, p.value.bytes())) << p.name;
  }
}

TEST(Checkpoint, SaveThenLoadIsBitExact) {
  SOLTRAIN_SEEDED_RNG(rng, 201u);
  auto ops = make_cpu_ops();
  for (const char* name : {"qwen3-tiny", "llama3-tiny-scaled"}) {
    const auto src = fixtures() / "models" / name;
    auto model = load_pretrained(src, *ops);
    perturb(*model, rng);
    TempDir t;
    save_pretrained(*model, t.path / "out", src, DType::F32);
    expect_same_bits(*model, *load_pretrained(t.path / "out", *ops));
    EXPECT_TRUE(std::filesystem::exists(t.path / "out" / "model.safetensors"));
    // tied models store no lm_head, as transformers does
    const SafetensorsFile f(t.path / "out" / "model.safetensors");
    EXPECT_EQ(f.find("lm_head.weight") != nullptr, !model->config().tie_word_embeddings);
    // config.json keeps the original's fields (including the 4.x RoPE keys)
    const auto cfg = read_json_file(t.path / "out" / "config.json");
    EXPECT_EQ(cfg["architectures"][0], model->config().architecture);
    EXPECT_EQ(parse_model_config(cfg).rope.type, model->config().rope.type);
  }
}

TEST(Checkpoint, ShardedSaveLoadsBackBitExact) {
  SOLTRAIN_SEEDED_RNG(rng, 202u);
  auto ops = make_cpu_ops();
  const auto src = fixtures() / "models" / "llama-tiny";
  auto model = load_pretrained(src, *ops);
  perturb(*model, rng);
  TempDir t;
  save_pretrained(*model, t.path / "out", src, DType::F32, 64 * 1024);
  EXPECT_TRUE(std::filesystem::exists(t.path / "out" / "model.safetensors.index.json"));
  expect_same_bits(*model, *load_pretrained(t.path / "out", *ops));
}

TEST(Checkpoint, SavingOverAnExistingFolderReplacesItWhole) {
  auto ops = make_cpu_ops();
  const auto src = fixtures() / "models" / "qwen3-tiny";
  auto model = load_pretrained(src, *ops);
  TempDir t;
  std::filesystem::create_directories(t.path / "out");
  std::ofstream(t.path / "out" / "stale.txt") << "old";
  save_pretrained(*model, t.path / "out", src, DType::F32);
  EXPECT_FALSE(std::filesystem::exists(t.path / "out" / "stale.txt"));
  EXPECT_TRUE(std::filesystem::exists(t.path / "out" / "model.safetensors"));
  for (auto& e : std::filesystem::directory_iterator(t.path))  // no temporary leftovers
    EXPECT_EQ(e.path().filename(), "out");
}

TEST(Checkpoint, WeightsThatDisagreeWithTheConfigAreUserErrors) {
  auto ops = make_cpu_ops();
  TempDir t;
  std::filesystem::copy(fixtures() / "models" / "qwen3-tiny", t.path / "m");
  auto cfg = read_json_file(t.path / "m" / "config.json");
  cfg["intermediate_size"] = 128;  // weights are 160 wide
  std::ofstream(t.path / "m" / "config.json") << cfg.dump();
  try {
    load_pretrained(t.path / "m", *ops);
    ADD_FAILURE() << "loaded mis-shaped weights";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.gate_proj.weight"), std::string::npos) << e.what();
  }
  cfg["intermediate_size"] = 160;
  cfg["num_hidden_layers"] = 3;  // a layer the weights do not have
  std::ofstream(t.path / "m" / "config.json") << cfg.dump();
  EXPECT_THROW(load_pretrained(t.path / "m", *ops), UserError);
  EXPECT_THROW(load_pretrained(t.path / "nowhere", *ops), UserError);
}

}  // namespace
}  // namespace soltrain::test

namespace soltrain::test {
namespace {

// Checkpoints on the hub are mostly bf16 (some f16): they load widened exactly to fp32.
TEST(Checkpoint, LoadsBf16AndF16Weights) {
  auto ops = make_cpu_ops();
  const auto src = fixtures() / "models" / "qwen3-tiny";
  auto ref = load_pretrained(src, *ops);
  for (DType dt : {DType::BF16, DType::F16}) {
    TempDir t;
    std::filesystem::create_directories(t.path / "m");
    std::filesystem::copy_file(src / "config.json", t.path / "m" / "config.json");
    std::vector<std::vector<uint16_t>> half;
    std::vector<NamedTensor> tensors;
    for (const Parameter& p : ref->params().all()) {
      half.emplace_back(size_t(p.value.numel()));
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        const float x = p.value.f32()[i];
        // f16 by the compiler's own conversion, bf16 by ours (round to nearest even)
        half.back()[size_t(i)] = dt == DType::BF16 ? f32_to_bf16(x) : std::bit_cast<uint16_t>(_Float16(x));
      }
      tensors.push_back({p.name, Tensor{half.back().data(), dt, p.shape}});
    }
    write_checkpoint(t.path / "m", tensors, size_t(1) << 30);
    auto m = load_pretrained(t.path / "m", *ops);
    size_t k = 0;
    for (const Parameter& p : m->params().all()) {
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        const float want =
            dt == DType::BF16 ? bf16_to_f32(half[k][size_t(i)]) : float(std::bit_cast<_Float16>(half[k][size_t(i)]));
        ASSERT_EQ(p.value.f32()[i], want) << p.name << "[" << i << "] " << dtype_name(dt);
      }
      const double err = rel_err(p.value.f32(), ref->params().at(p.name).value.f32(), size_t(p.value.numel()));
      EXPECT_LT(err, dt == DType::BF16 ? 5e-3 : 5e-4) << p.name;
      EXPECT_GT(err, 0) << p.name;  // rounding really happened
      ++k;
    }
  }
}

}  // namespace
}  // namespace soltrain::test
