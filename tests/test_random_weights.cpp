// `soltrain bench --random-weights` (model/random_weights.h): a model from config.json alone, its weights drawn as
// transformers initialises them (matrices normal(0, initializer_range), norms ones, biases zeros; fresh adapters as
// PEFT's), and a whole bench step on it whose loss is a random model's, ln(vocab).
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/format.h"
#include "io/atomic_file.h"
#include "model/random_weights.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

// A tiny Qwen2-MoE (shared expert, q/k/v biases) with its own initializer_range, as config.json only.
std::filesystem::path config_only(const TempDir& t) {
  const auto cfg = nlohmann::json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 96, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": false, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
    "initializer_range": 0.05})");
  const auto dir = t.path / "model";
  std::filesystem::create_directories(dir);
  write_file_atomic(dir / "config.json", cfg.dump(2));
  return dir;
}

std::vector<float> values(Ops& ops, const Transformer& m, const std::string& name) {
  for (const Parameter& p : m.params().all())
    if (p.name == name) {
      std::vector<float> v(size_t(shape_numel(p.shape)));
      m.params().download(ops, p, v.data());
      return v;
    }
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

TEST(RandomWeights, DrawnAsTransformersInitialisesThem) {
  TempDir t;
  const auto dir = config_only(t);
  auto ops = make_cpu_ops();
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  auto m = random_pretrained(dir, *ops, lora, true, 11);
  double sum = 0, sq = 0;
  size_t n = 0;
  for (const Parameter& p : m->params().all()) {
    const std::vector<float> v = values(*ops, *m, p.name);
    if (is_lora_name(p.name)) {
      const bool zero = std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; });
      EXPECT_EQ(zero, p.name.find("lora_B") != std::string::npos) << p.name;  // PEFT: A drawn, B zeros
    } else if (p.shape.size() == 1) {
      const float want = p.name.ends_with("norm.weight") ? 1.0f : 0.0f;
      for (float x : v) ASSERT_EQ(x, want) << p.name;
    } else {
      for (float x : v) sum += x, sq += double(x) * x, ++n;
    }
  }
  const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(sd, 0.05, 0.05 * 0.02) << "initializer_range from config.json";
  // each parameter from its own start in the pool: two experts' matrices differ
  EXPECT_NE(values(*ops, *m, "model.layers.0.mlp.experts.0.gate_proj.weight"),
            values(*ops, *m, "model.layers.0.mlp.experts.1.gate_proj.weight"));
}

// reinit_weights (Axolotl's: pretraining from scratch): every base value drawn on its own as _init_weights draws a
// model built from its config: each matrix normal(0, initializer_range), the padding row zero, norms ones, biases
// zeros; the same seed draws the same model, another seed another.
TEST(RandomWeights, ReinitDrawsEveryWeightAfresh) {
  TempDir t;
  const auto dir = config_only(t);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg["pad_token_id"] = 3;
  write_file_atomic(dir / "config.json", cfg.dump(2));
  auto ops = make_cpu_ops();
  auto m = random_pretrained(dir, *ops, std::nullopt, true, 11);
  const std::vector<float> before = values(*ops, *m, "model.layers.1.self_attn.q_proj.weight");
  init_weights(*m, 7);
  std::map<std::string, std::vector<float>> first;
  for (const Parameter& p : m->params().all()) {
    const std::vector<float> v = values(*ops, *m, p.name);
    first[p.name] = v;
    if (p.shape.size() == 1) {
      const float want = p.name.ends_with("norm.weight") ? 1.0f : 0.0f;
      for (float x : v) ASSERT_EQ(x, want) << p.name;
      continue;
    }
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    const double n = double(v.size()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5.0 * 0.05 / std::sqrt(n)) << p.name;
    EXPECT_NEAR(sd, 0.05, 0.05 * 6.0 / std::sqrt(2.0 * n)) << p.name;  // (six standard errors)
  }
  const std::vector<float>& embed = first["model.embed_tokens.weight"];
  for (int j = 0; j < 64; ++j) {
    EXPECT_EQ(embed[size_t(3 * 64 + j)], 0.0f);  // transformers zeroes padding_idx's row
    EXPECT_NE(embed[size_t(2 * 64 + j)], 0.0f);
  }
  EXPECT_NE(first["model.layers.1.self_attn.q_proj.weight"], before);
  EXPECT_NE(first["model.layers.0.mlp.experts.0.gate_proj.weight"],
            first["model.layers.0.mlp.experts.1.gate_proj.weight"]);
  init_weights(*m, 7);
  for (const auto& [name, v] : first) EXPECT_EQ(values(*ops, *m, name), v) << name;
  init_weights(*m, 8);
  EXPECT_NE(values(*ops, *m, "model.layers.1.self_attn.q_proj.weight"),
            first["model.layers.1.self_attn.q_proj.weight"]);
}

TEST(RandomWeights, BenchTimesAModelFromItsConfigAlone) {
  TempDir t;
  const std::string model = config_only(t).string();
  const std::string bench = "bench --model " + model + " --device cpu --batch-size 2 --seq-len 16 --steps 1 --warmup 0";
  for (const std::string args : {"", " --lora-rank 4", " --lora-rank 4 --qlora nf4"}) {
    SCOPED_TRACE(args);
    const CliRun run = test::run(bench + " --random-weights" + args, t);
    ASSERT_EQ(run.code, 0) << run.err;
    const double loss = nlohmann::json::parse(run.out)["loss"].get<double>();
    EXPECT_NEAR(loss, std::log(96.0), 0.25) << "a random model's loss";
  }
  const CliRun without = test::run(bench, t);  // the folder has no weights to read
  EXPECT_EQ(without.code, 2) << without.err;
}

}  // namespace
}  // namespace soltrain::test
