// Real example configs of Axolotl, pointed at a tiny local model and data by their paths only, run through
// the soltrain binary: what runs, runs to the end; what asks for a missing feature names it in one line.
#include <gtest/gtest.h>

#include <fstream>

#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "data_test_util.h"
#include "test_util.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct PeerSetup {
  test::TempDir t;
  PeerSetup() {
    DemoModelShape s;
    s.hidden = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.head_dim = 16, s.intermediate = 64;
    s.max_positions = 8192;  // Llama 3's context: the fft-8b example asks for sequence_len 8192
    write_random_model(t.path / "model", s, 7);
    std::ofstream d(t.path / "alpaca.jsonl");
    for (int i = 0; i < 40; ++i)
      d << "{\"instruction\": \"Reverse the word.\", \"input\": \"w" << i << "\", \"output\": \"" << i << "w\"}\n";
  }
  // The fixture config with MODEL_DIR, DATA_FILE and OUTPUT_DIR filled in, written next to the data.
  fs::path config(const std::string& name) const {
    std::string y = read_text(fs::path(SOLTRAIN_FIXTURES) / "peer_configs" / name);
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"MODEL_DIR", (t.path / "model").string()},
                                   {"DATA_FILE", (t.path / "alpaca.jsonl").string()},
                                   {"OUTPUT_DIR", (t.path / "out").string()}})
      y.replace(y.find(from), from.size(), to);
    const fs::path p = t.path / name;
    test::write_text(p, y);
    return p;
  }
};

TEST(PeerConfigs, AxolotlQwen3LoraRunsToTheEnd) {
  PeerSetup s;
  const test::CliRun r = test::run("sft " + s.config("axolotl-qwen3-8b-lora-fused-attn.yaml").string(), s.t);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(all.rfind("sft: LoRA r32 on q,k,v,o,gate,up,down\n", 0), 0u) << all;  // the first line
  // type: alpaca is Axolotl's prompt in bytes (the demo tokenizer), not the chat template: 9140 tokens, of
  // which only the responses "0w".."39w" (110 bytes) and the 40 eos tokens are trained.
  EXPECT_NE(all.find("wrote 40 documents, 9140 tokens (150 trained)"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Its `optimizer: adamw_8bit` (empty wandb_*, deepspeed:, fp16: etc. are accepted) trains with 8-bit moments.
TEST(PeerConfigs, AxolotlLlama3LoraRunsWith8bitAdamW) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-1b.yml");
  const test::CliRun ok = test::run("sft " + cfg.string() + " --set max_steps=2", s.t);
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find(" GiB (8-bit), activations"), std::string::npos) << all;
}

// Llama 3 full fine-tune with paged 8-bit AdamW (gradient_checkpointing_kwargs, empty deepspeed:/fsdp: etc. are
// accepted): runs to the end with 8-bit moments and recompute.
TEST(PeerConfigs, AxolotlLlama3FullFineTuneRunsWith8bitAdamW) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-fft-8b.yaml");
  // one update: 8 micro-batches of 8192 tokens (the example's accumulation), ~10 s on CI's cores
  const test::CliRun r = test::run("sft " + cfg.string() + " --set max_steps=1", s.t);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(all.rfind("sft: full fine-tune\n", 0), 0u) << all;
  EXPECT_NE(all.find(" GiB (8-bit), activations"), std::string::npos) << all;
  EXPECT_NE(all.find("(recompute full, "), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;
}

// Llama 3 8B LoRA over an 8-bit base with embed/lm_head trained next to it: both missing features named, in
// one line, exit 2 (its 8-bit AdamW is not among them).
TEST(PeerConfigs, AxolotlLlama3Lora8bNamesTheMissingFeatures) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-8b.yml");
  const test::CliRun r = test::run("sft " + cfg.string(), s.t);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  const std::string c = cfg.string();
  EXPECT_EQ(r.err,
            "error: " + c + ": 2 problems: " + c +
                ":10: load_in_8bit: 8-bit (LLM.int8) base weights are not built; use load_in_4bit: true (NF4) or "
                "qlora_fp8: true; " +
                c + ":31: lora_modules_to_save: training full modules next to LoRA is not built yet\n");
}

// Llama 3.2 1B QLoRA: the 4-bit base asked for twice (load_in_4bit, adapter: qlora) trains LoRA over NF4, and
// nothing else is refused (attn_implementation, the loss watchdog and 8-bit AdamW are accepted).
TEST(PeerConfigs, AxolotlLlama3QloraTrainsOverAnNf4Base) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-qlora-1b.yml");
  const test::CliRun r = test::run("sft " + cfg.string() + " --set max_steps=2", s.t);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("over a frozen NF4 base (adapter: qlora)"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Surogate's simple example: LoRA settings without `lora: true` train LoRA (Surogate's default), and the run
// says so before anything else; `samples: 100` takes 100 of the dataset's documents.
TEST(PeerConfigs, SurogateSimpleLoraIntentAndSamples) {
  PeerSetup s;
  const fs::path cfg = s.config("surogate-qwen3-0.6b-simple.yaml");
  const test::CliRun ok = test::run("sft " + cfg.string() + " --set max_steps=2", s.t);
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_EQ(all.rfind("sft: LoRA settings are given without `adapter: lora` or `lora: true`: training a LoRA "
                      "adapter\nsft: LoRA r32 on q,k,v,o,gate,up,down\n",
                      0),
            0u)
      << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

}  // namespace
}  // namespace soltrain
