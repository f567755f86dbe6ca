// The demo's reversal task with label noise (bench/convergence.sh's task): the noise replaces only answers,
// leaves the prompts and the noiseless file as they were, and hits about the fraction asked for. And the
// demo model's shape options (demo-setup --hidden-size ...): the defaults are the demo's model, others are written.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/demo_kit.h"
#include "core/error.h"
#include "test_util.h"

namespace soltrain {
namespace {

struct Pair {
  std::string word, answer;
};

std::vector<Pair> read_pairs(const std::filesystem::path& file) {
  std::vector<Pair> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out.push_back({j["messages"][0]["content"], j["messages"][1]["content"]});
  }
  return out;
}

std::string slurp(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(DemoTask, LabelNoiseReplacesAboutThatFractionOfAnswersOnly) {
  test::TempDir t;
  const int n = 4000;
  write_reversal_dataset(t.path / "clean.jsonl", n, 7);
  write_reversal_dataset(t.path / "zero.jsonl", n, 7, 0.0);
  write_reversal_dataset(t.path / "noisy.jsonl", n, 7, 0.25);
  // No noise asked: byte for byte the file every existing test and fixture was made from.
  EXPECT_EQ(slurp(t.path / "clean.jsonl"), slurp(t.path / "zero.jsonl"));

  const auto clean = read_pairs(t.path / "clean.jsonl"), noisy = read_pairs(t.path / "noisy.jsonl");
  ASSERT_EQ(clean.size(), size_t(n));
  ASSERT_EQ(noisy.size(), size_t(n));
  int replaced = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(noisy[i].word, clean[i].word) << "record " << i;  // the prompts stay
    ASSERT_EQ(noisy[i].answer.size(), clean[i].answer.size()) << "record " << i;
    for (char ch : noisy[i].answer) EXPECT_TRUE(ch >= 'a' && ch <= 'z') << "record " << i;
    if (noisy[i].answer != std::string(clean[i].word.rbegin(), clean[i].word.rend())) ++replaced;
  }
  // Binomial(4000, 0.25 × (1 − the chance a random word is the reversal, ≤ 26^-3)): sd 27, so ±150 is > 5 sd.
  EXPECT_NEAR(replaced, 1000, 150);
}

TEST(DemoTask, ModelShapeOptions) {
  // demo-setup's defaults give the demo's model exactly.
  const DemoModelShape demo{}, same = demo_model_shape(128, 4, 4, 0, 384);
  EXPECT_EQ(same.hidden, demo.hidden);
  EXPECT_EQ(same.layers, demo.layers);
  EXPECT_EQ(same.heads, demo.heads);
  EXPECT_EQ(same.kv_heads, demo.kv_heads);
  EXPECT_EQ(same.head_dim, demo.head_dim);
  EXPECT_EQ(same.intermediate, demo.intermediate);
  EXPECT_EQ(same.vocab, demo.vocab);

  // Another shape reaches config.json and the weights.
  test::TempDir t;
  write_random_model(t.path / "model", demo_model_shape(96, 2, 6, 3, 160), 1);
  std::ifstream in(t.path / "model" / "config.json");
  const auto cfg = nlohmann::json::parse(in);
  EXPECT_EQ(cfg["hidden_size"], 96);
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["num_attention_heads"], 6);
  EXPECT_EQ(cfg["num_key_value_heads"], 3);
  EXPECT_EQ(cfg["head_dim"], 16);
  EXPECT_EQ(cfg["intermediate_size"], 160);
  EXPECT_TRUE(std::filesystem::exists(t.path / "model" / "model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(t.path / "model" / "tokenizer.json"));

  EXPECT_EQ(demo_model_shape(512, 4, 8, 0, 1536).kv_heads, 4);  // half the heads by default
  EXPECT_EQ(demo_model_shape(64, 1, 1, 0, 64).kv_heads, 1);
  EXPECT_THROW(demo_model_shape(100, 4, 8, 0, 384), UserError);  // 100 / 8 heads
  EXPECT_THROW(demo_model_shape(128, 4, 4, 3, 384), UserError);  // 4 heads over 3 kv heads
}

}  // namespace
}  // namespace soltrain
