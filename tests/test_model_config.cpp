// config.json parsing: the families (Mistral's sliding window), both generations of RoPE keys, and a clear error for
// everything unsupported.
#include "core/error.h"
#include "model/config.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

nlohmann::json base() {
  return nlohmann::json::parse(R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "rope_theta": 1000000.0, "tie_word_embeddings": true})");
}

void expect_error(const nlohmann::json& j, const std::string& needle) {
  try {
    parse_model_config(j, "m/config.json");
    ADD_FAILURE() << "accepted; expected an error with '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("m/config.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, ParsesTheFixtures) {
  const auto q = load_model_config(fixtures() / "models" / "qwen3-tiny");
  EXPECT_STREQ(q.spec->architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(q.qk_norm);
  EXPECT_TRUE(q.tie_word_embeddings);
  EXPECT_EQ(q.num_kv_heads, 2);
  EXPECT_EQ(q.rope.theta, 1e6);  // from transformers 5's rope_parameters
  const auto l = load_model_config(fixtures() / "models" / "llama3-tiny-scaled");
  EXPECT_STREQ(l.spec->architecture, "LlamaForCausalLM");
  EXPECT_EQ(l.head_dim, 24);  // not hidden_size / heads = 16
  EXPECT_TRUE(l.qkv_bias && l.o_bias && l.mlp_bias);
  EXPECT_EQ(l.rope.type, "llama3");  // from transformers 4's rope_scaling
  EXPECT_EQ(l.rope.theta, 500000.0);
  const auto q2 = load_model_config(fixtures() / "models" / "qwen2-tiny-mqa-bias");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
  EXPECT_EQ(q2.num_kv_heads, 1);
}

TEST(ModelConfig, DefaultsFollowTransformers) {
  auto j = base();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j.erase("tie_word_embeddings");
  const auto c = parse_model_config(j);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelConfig, RopeScalingVariants) {
  auto j = base();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};  // the oldest spelling
  const auto c = parse_model_config(j);
  EXPECT_EQ(c.rope.type, "linear");
  const auto plain = rope_inv_freq(RopeConfig{"default", 1e6}, 32);
  const auto lin = rope_inv_freq(c.rope, 32);
  for (size_t i = 0; i < lin.size(); ++i) EXPECT_FLOAT_EQ(lin[i], plain[i] / 4);
  EXPECT_FLOAT_EQ(plain[0], 1.0f);
  EXPECT_NEAR(plain[1], std::pow(1e6, -2.0 / 32), 1e-7);
}

// Mistral: Llama's layer with no biases (attention_bias is not read) and no q/k norm; sliding_window an integer or
// null (no window), refused otherwise.
TEST(ModelConfig, MistralReadsItsSlidingWindow) {
  auto j = base();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["attention_bias"] = true;  // (transformers' Mistral has no such setting)
  j["sliding_window"] = 4096;
  const ModelConfig m = parse_model_config(j, "m/config.json");
  EXPECT_STREQ(m.spec->architecture, "MistralForCausalLM");
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_FALSE(m.qkv_bias || m.o_bias || m.mlp_bias || m.qk_norm);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse_model_config(j, "m/config.json").sliding_window, 0);
  j["sliding_window"] = 0;
  expect_error(j, "sliding_window");
  // the other families keep Qwen2's switch: a window in use there is refused
  EXPECT_EQ(parse_model_config(base(), "m/config.json").sliding_window, 0);
}

TEST(ModelConfig, UnsupportedIsAClearError) {
  auto j = base();
  j["architectures"] = {"GemmaForCausalLM"};
  expect_error(j, "GemmaForCausalLM");
  j = base();
  j["hidden_act"] = "gelu";
  expect_error(j, "gelu");
  j = base();
  j["use_sliding_window"] = true;
  expect_error(j, "sliding");
  j = base();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  expect_error(j, "sliding_attention");
  j = base();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error(j, "yarn");
  j = base();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error(j, "low_freq_factor");
  j = base();
  j["num_key_value_heads"] = 3;
  expect_error(j, "multiple");
  j = base();
  j.erase("vocab_size");
  expect_error(j, "vocab_size");
  j = base();
  j["hidden_size"] = "64";
  expect_error(j, "hidden_size");
  j = base();
  j["head_dim"] = 15;
  expect_error(j, "head_dim");
}

}  // namespace
}  // namespace soltrain::test
