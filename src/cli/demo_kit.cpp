#include "cli/demo_kit.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "kernels/ops.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "tokenizer/hf_tokenizer_json.h"

namespace soltrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// GPT-2's byte → printable character map that ByteLevel tokenizers use for their vocabulary.
std::string byte_symbol(int b) {
  int cp = b;
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (!printable) {
    int n = 0;  // the non-printable bytes take code points 256, 257, ... in byte order
    for (int k = 0; k < b; ++k)
      if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

DemoModelShape demo_model_shape(int hidden, int layers, int heads, int kv_heads, int intermediate) {
  if (hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads < 0 || intermediate <= 0)
    user_error("demo model: sizes must be positive (hidden ", hidden, ", layers ", layers, ", heads ", heads,
               ", kv heads ", kv_heads, ", intermediate ", intermediate, ")");
  if (kv_heads == 0) kv_heads = std::max(1, heads / 2);
  if (hidden % heads != 0)
    user_error("demo model: hidden size ", hidden, " is not a multiple of the ", heads, " heads");
  if (heads % kv_heads != 0) user_error("demo model: ", heads, " heads are not a multiple of ", kv_heads, " kv heads");
  DemoModelShape s;
  s.hidden = hidden;
  s.layers = layers;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = hidden / heads;
  s.intermediate = intermediate;
  return s;
}

void write_byte_tokenizer(const fs::path& dir) {
  fs::create_directories(dir);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  json added = json::array();
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int i = 0; i < 3; ++i) added.push_back(hf_added_special_token(256 + i, specials[i]));
  const json tok = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", hf_byte_level(false, true, true)},
                    {"post_processor", nullptr},
                    {"decoder", hf_byte_level(true, true, true)},
                    {"model", hf_bpe_model(std::move(vocab), json::array(), /*ignore_merges=*/false)}};
  write_file_atomic(dir / "tokenizer.json", tok.dump(1) + "\n");
  const std::string tmpl =
      "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                    {"eos_token", "<|im_end|>"},
                    {"pad_token", "<|endoftext|>"},
                    {"bos_token", nullptr},
                    {"chat_template", tmpl},
                    {"model_max_length", 4096}};
  write_file_atomic(dir / "tokenizer_config.json", cfg.dump(2) + "\n");
}

void write_random_model(const fs::path& dir, const DemoModelShape& s, uint64_t seed) {
  // config.json and the tokenizer are staged next to the target, then save_pretrained writes the folder.
  const fs::path src = dir.parent_path() / (dir.filename().string() + ".init");
  fs::remove_all(src);
  write_byte_tokenizer(src);
  const json cfg = {{"architectures", {"Qwen3ForCausalLM"}},
                    {"model_type", "qwen3"},
                    {"hidden_size", s.hidden},
                    {"intermediate_size", s.intermediate},
                    {"num_hidden_layers", s.layers},
                    {"num_attention_heads", s.heads},
                    {"num_key_value_heads", s.kv_heads},
                    {"head_dim", s.head_dim},
                    {"hidden_act", "silu"},
                    {"max_position_embeddings", s.max_positions},
                    {"rms_norm_eps", 1e-6},
                    {"rope_theta", 1000000.0},
                    {"attention_bias", false},
                    {"tie_word_embeddings", true},
                    {"vocab_size", s.vocab},
                    {"bos_token_id", nullptr},
                    {"eos_token_id", 258},
                    {"pad_token_id", 256},
                    {"torch_dtype", "float32"}};
  json full = cfg;
  if (s.experts > 0) {
    full["architectures"] = {"Qwen3MoeForCausalLM"};
    full["model_type"] = "qwen3_moe";
    full["num_experts"] = s.experts;
    full["num_experts_per_tok"] = s.experts_per_tok;
    full["moe_intermediate_size"] = s.moe_intermediate;
    full["norm_topk_prob"] = true;
    full["output_router_logits"] = true;
    full["router_aux_loss_coef"] = 0.01;
  }
  write_file_atomic(src / "config.json", full.dump(2) + "\n");
  auto ops = make_cpu_ops();
  Transformer model(load_model_config(src), *ops);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);  // HF's initializer_range default
  std::vector<float> host;
  for (Parameter& p : model.params().all()) {
    host.resize(size_t(shape_numel(p.shape)));
    const bool is_norm = p.name.ends_with("norm.weight");
    for (float& x : host) x = is_norm ? 1.0f : normal(rng);
    ops->copy(p.master, Tensor{host.data(), DType::F32, p.shape, Device::CPU});
  }
  model.params().sync_values(*ops);
  save_pretrained(model, dir, src, DType::F32);
  fs::remove_all(src);
}

void write_reversal_dataset(const fs::path& file, int n, uint64_t seed, double label_noise) {
  std::mt19937_64 rng(seed);
  // The noise draws come from a stream of their own, so the words (and, at label_noise 0, the whole file) are
  // the same as without noise.
  std::mt19937_64 noise_rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string word(size_t(3 + rng() % 4), ' ');
    for (char& ch : word) ch = char('a' + rng() % 26);
    std::string reversed(word.rbegin(), word.rend());
    if (label_noise > 0 && coin(noise_rng) < label_noise)
      for (char& ch : reversed) ch = char('a' + noise_rng() % 26);
    const json rec = {
        {"messages", {{{"role", "user"}, {"content", word}}, {{"role", "assistant"}, {"content", reversed}}}}};
    out += rec.dump() + "\n";
  }
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  write_file_atomic(file, out);
}

void write_reversal_preferences(const fs::path& file, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    // Words from a..t; the near miss has one letter replaced by one of u..z, which no word has. Measured on
    // the demo model from random weights: with the replacement drawn from a..z instead (any letter the word
    // lacks), 150 DPO steps fit the training pairs but held-out accuracy stayed near 0.5; this way the
    // preference is one a small model learns and carries to new words in a few dozen steps.
    std::string word(size_t(3 + rng() % 4), ' ');
    for (char& ch : word) ch = char('a' + rng() % 20);
    const std::string reversed(word.rbegin(), word.rend());
    std::string near = reversed;
    near[size_t(rng() % near.size())] = char('u' + rng() % 6);
    out += json{{"prompt", word}, {"chosen", reversed}, {"rejected", near}}.dump() + "\n";
  }
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  write_file_atomic(file, out);
}

}  // namespace soltrain
