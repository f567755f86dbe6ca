// Real example configs of Axolotl, pointed at a tiny local model and data by their paths only, run through
// the soltrain binary: what runs, runs to the end; what asks for a missing feature names it in one line.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "data/batch_file.h"
#include "data/dataset.h"
#include "data/pair_loader.h"
#include "data/shards.h"
#include "data_test_util.h"
#include "inputs_guard.h"
#include "io/safetensors.h"
#include "llama_tokenizer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The model and every data file the configs point at: 40 records each, in the shapes the configs' own
// datasets have (alpaca rows, OpenAI messages, ShareGPT conversations, GSM8K question/answer, prompt/completion
// message lists).
struct PeerSetup {
  test::TempDir t;
  PeerSetup() {
    DemoModelShape s;
    s.hidden = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.head_dim = 16, s.intermediate = 64;
    s.max_positions = 8192;  // Llama 3's context: the fft-8b example asks for sequence_len 8192
    write_random_model(t.path / "model", s, 7);
    // The same model with the Llama 3.1 stand-in tokenizer (its chat specials, BOS added by the
    // post_processor), for the Llama examples whose templates and BOS it exercises.
    write_random_model(t.path / "llama", s, 7);
    test::add_llama3_specials(t.path / "llama", true);
    std::ofstream d(t.path / "alpaca.jsonl"), m(t.path / "messages.jsonl"), g(t.path / "sharegpt.jsonl"),
        q(t.path / "gsm8k.jsonl"), pc(t.path / "prompt_completion.jsonl"), pref(t.path / "dpo_chat.jsonl"),
        jeo(t.path / "jeopardy.jsonl"), txt(t.path / "text.jsonl");
    for (int i = 0; i < 40; ++i) {
      const std::string w = "w" + std::to_string(i), r = std::to_string(i) + "w";
      d << "{\"instruction\": \"Reverse the word.\", \"input\": \"" << w << "\", \"output\": \"" << r << "\"}\n";
      m << R"({"messages": [{"role": "user", "content": "Reverse )" << w << R"("}, {"role": "assistant", "content": ")"
        << r << "\"}]}\n";
      g << R"({"conversations": [{"from": "human", "value": "Reverse )" << w << R"("}, {"from": "gpt", "value": ")" << r
        << "\"}]}\n";
      q << R"({"question": "Reverse )" << w << R"(", "answer": ")" << r << "\"}\n";
      pc << R"({"prompt": [{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": ")" << w
         << R"("}], "completion": [{"role": "assistant", "content": ")" << r << "\"}]}\n";
      // openaccess-ai-collective/jeopardy's columns; plain text rows (Axolotl's completion type)
      jeo << R"({"question": "This word reversed is )" << w << R"(", "category": "WORDS", "answer": ")" << r
          << R"(", "value": "$200", "round": "Jeopardy!"})"
          << "\n";
      txt << R"({"text": "Reverse )" << w << " and you get " << r << "\"}\n";
      // Axolotl's chat_template.default preference rows (field_messages: conversation, chosen/rejected turns)
      pref << R"({"conversation": [{"role": "user", "content": "Reverse )" << w
           << R"("}], "chosen": {"role": "assistant", "content": ")" << r
           << R"("}, "rejected": {"role": "assistant", "content": ")" << w << "\"}}\n";
    }
    // A folder dataset with train and test splits of text rows ("Text", as Trelis/tiny-shakespeare has it).
    fs::create_directories(t.path / "shakespeare");
    std::ofstream train(t.path / "shakespeare" / "train-00000-of-00001.jsonl"),
        test(t.path / "shakespeare" / "test-00000-of-00001.jsonl");
    for (int i = 0; i < 30; ++i) train << R"({"Text": "To be, or not to be, line )" << i << "\"}\n";
    for (int i = 0; i < 5; ++i) test << R"({"Text": "That is the question, line )" << i << "\"}\n";
    train.close(), test.close(), d.close(), m.close(), g.close(), q.close(), pc.close(), pref.close(), jeo.close(),
        txt.close();
    guard.arm({t.path / "model", t.path / "llama", t.path / "alpaca.jsonl", t.path / "messages.jsonl",
               t.path / "sharegpt.jsonl", t.path / "gsm8k.jsonl", t.path / "prompt_completion.jsonl",
               t.path / "dpo_chat.jsonl", t.path / "jeopardy.jsonl", t.path / "text.jsonl", t.path / "shakespeare",
               fs::path(SOLTRAIN_FIXTURES) / "peer_configs"});
  }
  test::InputsGuard guard;  // (after t: compared before the folder goes)
  // The fixture config with MODEL_DIR (`model`: "model" or "llama"), every DATA_FILE (as `data`) and
  // OUTPUT_DIR filled in, written next to the data.
  fs::path config(const std::string& name, const std::string& data = "alpaca.jsonl",
                  const std::string& model = "model") const {
    std::string y = read_text(fs::path(SOLTRAIN_FIXTURES) / "peer_configs" / name);
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"MODEL_DIR", (t.path / model).string()},
                                   {"DATA_FILE", (t.path / data).string()},
                                   {"OUTPUT_DIR", (t.path / "out").string()}}) {
      EXPECT_NE(y.find(from), std::string::npos) << name << " has no " << from;
      for (size_t at = y.find(from); at != std::string::npos; at = y.find(from, at + to.size()))
        y.replace(at, from.size(), to);
    }
    const fs::path p = t.path / name;
    test::write_text(p, y);
    return p;
  }
  // `soltrain sft` on the config with overrides; stdout and stderr together.
  test::CliRun sft(const fs::path& cfg, const std::string& sets = "") const {
    return test::run("sft " + cfg.string() + (sets.empty() ? "" : " " + sets), t);
  }
};

// "error: CFG: N problems: CFG:L1: ...; CFG:L2: ..." as the reader joins a config's problems.
std::string problems(const fs::path& cfg, const std::vector<std::pair<int, std::string>>& lines) {
  const std::string c = cfg.string();
  std::string out = "error: ";
  if (lines.size() > 1) out += c + ": " + std::to_string(lines.size()) + " problems: ";
  for (size_t i = 0; i < lines.size(); ++i)
    out += (i ? "; " : "") + c + ":" + std::to_string(lines[i].first) + ": " + lines[i].second;
  return out + "\n";
}

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
  EXPECT_NE(all.find("  8-bit\n  activations"), std::string::npos) << all;
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
  // its special_tokens: {pad_token: <|end_of_text|>}, new to the stand-in tokenizer: added, said first
  EXPECT_EQ(all.rfind("sft: tokenizer: pad_token <|end_of_text|>; 1 new tokens (<|end_of_text|> = ", 0), 0u) << all;
  EXPECT_NE(all.find("\nsft: full fine-tune\n"), std::string::npos) << all;
  EXPECT_NE(read_text(s.t.path / "out" / "model" / "tokenizer_config.json").find("\"pad_token\": \"<|end_of_text|>\""),
            std::string::npos);
  EXPECT_NE(all.find("  8-bit\n  activations"), std::string::npos) << all;
  EXPECT_NE(all.find("  recompute full, "), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;
}

// Llama 3 8B LoRA over an 8-bit base with embed_tokens and lm_head trained next to it (lora_modules_to_save, PEFT's
// modules_to_save): on the tied stand-in as written (two untied copies, as PEFT trains them, both resized for its new
// pad token) and on an untied model it trains and the adapter holds both in full under PEFT's names.
TEST(PeerConfigs, AxolotlLlama3Lora8bTrainsEmbeddingAndHeadBesideTheAdapters) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-8b.yml");
  const test::CliRun tied = test::run("sft " + cfg.string() + " --set max_steps=1", s.t);
  ASSERT_EQ(tied.code, 0) << tied.out << tied.err;
  {
    const SafetensorsFile adapter(s.t.path / "out" / "adapter" / "adapter_model.safetensors");
    const int32_t pad =
        *Tokenizer::load(s.t.path / "out" / "adapter" / "tokenizer.json").token_to_id("<|end_of_text|>");
    for (const char* name : {"base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"}) {
      ASSERT_TRUE(adapter.find(name)) << name;
      EXPECT_GT(adapter.find(name)->shape[0], pad) << name;
    }
  }
  {  // untie the stand-in: its own lm_head (the embedding's values), tie_word_embeddings false
    const fs::path m = s.t.path / "model";
    nlohmann::json config = nlohmann::json::parse(read_text(m / "config.json"));
    config["tie_word_embeddings"] = false;
    test::write_text(m / "config.json", config.dump(2));
    std::vector<std::vector<float>> store;
    std::vector<NamedTensor> tensors;
    {
      const SafetensorsFile f(m / "model.safetensors");
      for (const auto& [name, e] : f.entries()) {
        store.emplace_back(size_t(shape_numel(e.shape)));
        read_as_f32(e, e.shape, store.back().data(), name);
        tensors.push_back({name, Tensor{store.back().data(), DType::F32, e.shape, Device::CPU}});
        if (name == "model.embed_tokens.weight")
          tensors.push_back({"lm_head.weight", Tensor{store.back().data(), DType::F32, e.shape, Device::CPU}});
      }
    }
    write_safetensors(m / "model.safetensors", tensors);
    s.guard.changed_on_purpose();
  }
  const test::CliRun r = test::run("sft " + cfg.string() + " --set max_steps=2 --set overwrite_output_dir=true", s.t);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const SafetensorsFile adapter(s.t.path / "out" / "adapter" / "adapter_model.safetensors");
  EXPECT_TRUE(adapter.find("base_model.model.model.embed_tokens.weight"));
  // its special_tokens' pad_token, new to the stand-in tokenizer: added, the embedding trained in full holds its row
  EXPECT_NE(
      read_text(s.t.path / "out" / "adapter" / "tokenizer_config.json").find("\"pad_token\": \"<|end_of_text|>\""),
      std::string::npos);
  const std::optional<int32_t> pad =
      Tokenizer::load(s.t.path / "out" / "adapter" / "tokenizer.json").token_to_id("<|end_of_text|>");
  ASSERT_TRUE(pad.has_value());
  EXPECT_GT(adapter.find("base_model.model.model.embed_tokens.weight")->shape[0], *pad);
  EXPECT_TRUE(adapter.find("base_model.model.lm_head.weight"));
  const nlohmann::json acfg = nlohmann::json::parse(read_text(s.t.path / "out" / "adapter" / "adapter_config.json"));
  EXPECT_EQ(acfg["modules_to_save"], nlohmann::json({"embed_tokens", "lm_head"}));
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

// Llama 3 8B Instruct LoRA over an 8-bit base (load_in_8bit: LLM.int8's row-wise int8), `chat_template: llama3` on
// a messages dataset: the run renders Axolotl's llama3 template and trains to the end over the int8 base.
TEST(PeerConfigs, AxolotlLlama3InstructLoraTrainsOverInt8AndRendersLlama3) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-instruct-lora-8b.yml", "messages.jsonl", "llama");
  // One update on rows of 256 (the example's rows are 4096 wide and unpacked: all padding here).
  const test::CliRun ok = s.sft(cfg, "--set max_steps=1 --set sequence_len=256");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE((ok.out + ok.err).find("over a frozen LLM.int8 (row-wise int8) base (load_in_8bit)"), std::string::npos)
      << ok.out << ok.err;
  // Axolotl's llama3 template: 7 special tokens (BOS written by the template, not a second one from the
  // tokenizer; header start and end, eot, twice) and the bytes of "user", "\n\nReverse wI", "assistant",
  // "\n\nIw"; the assistant's "Iw" and its <|eot_id|> trained.
  size_t tokens = 0, trained = 0;
  for (int i = 0; i < 40; ++i) {
    const size_t digits = std::to_string(i).size();
    tokens += 7 + 4 + (11 + digits) + 9 + (2 + digits + 1);
    trained += digits + 1 + 1;
  }
  const std::string all = ok.out + ok.err;
  EXPECT_NE(
      all.find("wrote 40 documents, " + std::to_string(tokens) + " tokens (" + std::to_string(trained) + " trained)"),
      std::string::npos)
      << all;
}

// Axolotl's Triton LoRA kernel switches (lora_mlp_kernel, lora_qkv_kernel, lora_o_kernel) are soltrain's own
// LoRA path: the example runs to the end as it is.
TEST(PeerConfigs, AxolotlLlama3LoraKernelsRunsToTheEnd) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("axolotl-llama-3-lora-1b-kernels.yml", "alpaca.jsonl", "llama"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  // (its pad_token <|end_of_text|> is new to the stand-in tokenizer: said first)
  EXPECT_EQ(all.rfind("sft: tokenizer: pad_token <|end_of_text|>; 1 new tokens", 0), 0u) << all;
  EXPECT_NE(all.find("\nsft: LoRA r16 on gate,down,up,q,v,k,o\n"), std::string::npos) << all;  // the config's order
  // Axolotl's alpaca with Llama 3.1's tokenizer: the Qwen run's 9140 tokens plus one BOS per document, none
  // of them trained.
  EXPECT_NE(all.find("wrote 40 documents, 9180 tokens (150 trained)"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Sequential packing with curriculum sampling, its embedding and LM head trained beside the adapters (the stand-in
// ties them: two untied copies, as PEFT trains them, saved under PEFT's names): the documents are trained (over the
// example's 8-bit base) in the datasets' order (the first micro-batch starts with the first record).
TEST(PeerConfigs, AxolotlSamplePackingSequentiallyTrainsInOrder) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-1b-sample-packing-sequentially.yml", "alpaca.jsonl", "llama");
  const fs::path dump = s.t.path / "batches";
  const std::string sets = "--set max_steps=1";
  const test::CliRun ok = s.sft(cfg, sets + " --dump-batches " + dump.string());
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const SafetensorsFile adapter(s.t.path / "out" / "adapter" / "adapter_model.safetensors");
  EXPECT_TRUE(adapter.find("base_model.model.model.embed_tokens.weight"));
  EXPECT_TRUE(adapter.find("base_model.model.lm_head.weight"));
  const HostBatch b = load_batch_file(dump / "step-1-micro-0.safetensors");
  // The first record as Axolotl tokenizes alpaca with Llama 3.1's tokenizer: BOS, prompt, response, eos.
  std::vector<int32_t> first = {test::kLlamaBos};
  for (char ch : alpaca_prompt("Reverse the word.", "w0") + "0w") first.push_back(int32_t(uint8_t(ch)));
  first.push_back(test::kLlamaEot);
  ASSERT_GE(b.input_ids.size(), first.size());
  EXPECT_EQ(std::vector<int32_t>(b.input_ids.begin(), b.input_ids.begin() + long(first.size())), first);
  // The same run shuffled (curriculum_sampling off) starts elsewhere: the check above can fail.
  const test::CliRun shuffled = s.sft(cfg, sets + " --set curriculum_sampling=false --set overwrite_output_dir=true " +
                                               "--dump-batches " + (s.t.path / "shuffled").string());
  ASSERT_EQ(shuffled.code, 0) << shuffled.out << shuffled.err;
  const HostBatch c = load_batch_file(s.t.path / "shuffled" / "step-1-micro-0.safetensors");
  EXPECT_NE(std::vector<int32_t>(c.input_ids.begin(), c.input_ids.begin() + long(first.size())), first);
}

// Axolotl leaves documents longer than sequence_len out (its excess_length_strategy default, drop) where soltrain's
// own configs cut them: at a sequence_len that holds the one-digit words' documents (BOS, alpaca prompt, answer,
// eot), the two-digit ones (30 in each of the example's two datasets) are left out and the run says so;
// excess_length_strategy: truncate keeps them, raise refuses the run.
TEST(PeerConfigs, AxolotlConfigsLeaveOverlongDocumentsOut) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-1b-sample-packing-sequentially.yml", "alpaca.jsonl", "llama");
  const size_t fits = 1 + alpaca_prompt("Reverse the word.", "w0").size() + 2 + 1;  // w0..w9 (w10: 2 more)
  const std::string sets = "--set max_steps=1 --set sequence_len=" + std::to_string(fits);
  const test::CliRun drop = s.sft(cfg, sets);
  ASSERT_EQ(drop.code, 0) << drop.out << drop.err;
  EXPECT_NE((drop.out + drop.err)
                .find("sft: excess_length_strategy drop: left out 60 documents longer than "
                      "sequence_len " +
                      std::to_string(fits) + "\n"),
            std::string::npos)
      << drop.out << drop.err;
  const test::CliRun cut = s.sft(cfg, sets + " --set excess_length_strategy=truncate --set overwrite_output_dir=true");
  ASSERT_EQ(cut.code, 0) << cut.out << cut.err;
  EXPECT_EQ((cut.out + cut.err).find("left out"), std::string::npos) << cut.out << cut.err;
  const test::CliRun raise = s.sft(cfg, sets + " --set excess_length_strategy=raise --set overwrite_output_dir=true");
  EXPECT_EQ(raise.code, 2) << raise.out << raise.err;
  EXPECT_NE(raise.err.find("tokens is longer than sequence_len " + std::to_string(fits) +
                           " (excess_length_strategy: raise; drop or truncate take it)"),
            std::string::npos)
      << raise.err;
}

// The same dataset twice with dataset_exact_deduplication (the tied stand-in's embedding and LM head trained beside
// the adapters): the second copy's 40 documents are dropped.
TEST(PeerConfigs, AxolotlDeduplicateDropsTheSecondCopy) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-1b-deduplicate-sft.yml", "alpaca.jsonl", "llama");
  const test::CliRun ok = s.sft(cfg, "--set max_steps=1");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("dataset_exact_deduplication: dropped 40 duplicate documents, 40 left\n"), std::string::npos)
      << all;
}

// The DPO twin of the example above (the same preference dataset twice, dataset_exact_deduplication, over an 8-bit
// base): the second copy's 40 pairs are dropped, as Axolotl drops duplicate preference rows.
TEST(PeerConfigs, AxolotlDeduplicateDpoDropsTheSecondCopyOfEachPair) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-1b-deduplicate-dpo.yml", "dpo_chat.jsonl", "llama");
  const test::CliRun ok = s.sft(cfg, "--set max_steps=1 --set sequence_len=256");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("dataset_exact_deduplication: dropped 40 duplicate pairs, 40 left\n"), std::string::npos) << all;
}

// Llama 3 8B QLoRA with paged 32-bit AdamW (fp32 AdamW): the 4-bit base it asks for twice (load_in_4bit,
// adapter: qlora) is NF4 now, and the example trains LoRA over it to the end.
TEST(PeerConfigs, AxolotlLlama3QloraTrainsOverNf4) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-qlora.yml");
  const test::CliRun r = s.sft(cfg, "--set max_steps=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("over a frozen NF4 base"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Qwen3 32B QLoRA runs unchanged: torchao's 4-bit AdamW (adamw_torch_4bit) over the NF4 base, the Cut Cross Entropy
// plugin, chat_template: qwen3, a ShareGPT dataset mapped by message_property_mappings, split train[:20%],
// gradient_checkpointing: offload: 20% of 40 conversations, with Axolotl's qwen3 template.
TEST(PeerConfigs, AxolotlQwen3QloraRunsWithFourBitOptimizerAndQwen3Template) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-qwen3-32b-qlora.yaml", "sharegpt.jsonl");
  const test::CliRun ok = s.sft(cfg, "--set max_steps=1");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("  recompute full, "), std::string::npos) << all;
  // Axolotl's qwen3 template on each conversation: "<|im_start|>user\nReverse wI<|im_end|>\n<|im_start|>assistant
  // \n<think>\n\n</think>\n\nIw<|im_end|>\n" (the last assistant turn shows an empty think block): 4 special
  // tokens and 46 + 2 * digits(I) bytes; then train[:20%] keeps the first 8 of the 40.
  int64_t tokens = 0;
  for (int i = 0; i < 40; ++i) tokens += 50 + 2 * int64_t(std::to_string(i).size());
  EXPECT_NE(all.find("wrote 40 documents, " + std::to_string(tokens) + " tokens"), std::string::npos) << all;
  EXPECT_NE(all.find("; 8 training documents ("), std::string::npos) << all;
}

// Axolotl's Qwen2 DPO example (`rl: dpo` in an sft config; chat_template: qwen_25; chat_template.default rows
// with field_messages / field_chosen / field_rejected): preference training runs and logs TRL's metrics.
TEST(PeerConfigs, AxolotlQwen2DpoRunsPreferenceTraining) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-qwen2-dpo.yaml", "dpo_chat.jsonl");
  // Two updates on rows of 256 (the example's 4 epochs of unpacked 2048-token rows take a minute on a CPU).
  const test::CliRun r = s.sft(cfg, "--set max_steps=2 --set sequence_len=256");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string metrics = read_text(s.t.path / "out" / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"rewards/accuracies\""), std::string::npos) << metrics.substr(0, 400);
}

// Surogate's Qwen3 LoRA bf16 example as it is: `type: auto` on GSM8K-style question/answer rows (Surogate's
// AutoPreprocessor: question → user, answer → assistant), 10 steps, to the end.
TEST(PeerConfigs, SurogateQwen3LoraAutoRunsToTheEnd) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("surogate-qwen3-lora-bf16.yaml", "gsm8k.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(all.rfind("sft: LoRA r16 on q,k,v,o,gate,up,down\n", 0), 0u) << all;
  EXPECT_NE(all.find("sft: done, 10 steps"), std::string::npos) << all;
  // The demo model's template (ChatML) around each question and answer: 40 conversations.
  EXPECT_NE(all.find("wrote 40 documents"), std::string::npos) << all;
}

// Surogate's Llama 3.2 1B LoRA example (the same keys, 100 steps: 2 here) runs to the end.
TEST(PeerConfigs, SurogateLlamaLoraRunsToTheEnd) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("surogate-llama31-lora-bf16.yaml", "gsm8k.jsonl"), "--set max_steps=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << r.out << r.err;
}

// Surogate's reverse-text example as it is: LoRA under its FP8 recipe (the CPU emulates the FP8 GEMMs), the
// prompt messages plus the completion message trained (completion_field), and the adapter merged into
// output_dir/merged (merge_adapter).
TEST(PeerConfigs, SurogateReverseTextTrainsUnderFp8ThenMerges) {
  PeerSetup s;
  const fs::path cfg = s.config("surogate-reverse-text-qwen3.yaml", "prompt_completion.jsonl");
  // One update on rows of 256 (the example's 16 x 2 rows of 4096 would take minutes on a CPU).
  const test::CliRun ok = s.sft(cfg, "--set max_steps=1 --set sequence_len=256");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("recipe fp8-hybrid: the decoder layers' projections in FP8"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "merged" / "model.safetensors")) << all;
  EXPECT_NE(all.find("merged model saved to "), std::string::npos) << all;
}

// Surogate's bitsandbytes QLoRA example names the FP8 recipe over an NF4 base (qlora_bnb): it trains as written,
// the frozen NF4 base dequantised once into the recipe's FP8 copies.
TEST(PeerConfigs, SurogateQloraBnbTrainsFp8OverNf4) {
  PeerSetup s;
  const fs::path cfg = s.config("surogate-qwen3-lora-qbnb.yaml", "gsm8k.jsonl");
  const test::CliRun ok = s.sft(cfg, "--set max_steps=2");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("over a frozen NF4 base"), std::string::npos) << all;
  EXPECT_NE(all.find("recipe fp8-hybrid: the decoder layers' projections in FP8"), std::string::npos) << all;
}

// Multi-GPU examples: FSDP's FULL_SHARD runs as ZeRO-3 (soltrain's ranks: one here, so nothing is sharded) and
// its offload_params as offload_master + offload_optimizer, said in the run's first line; over an NF4 base
// (QLoRA) the quantised base stays on the device. Liger's keys are accepted.
TEST(PeerConfigs, AxolotlFsdpRunsAsZero3WithOffload) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-fft-8b-liger-fsdp.yaml", "sharegpt.jsonl", "llama");
  // one update of 4 micro-batches of 2 x 512 (the example's 4096-token rows take far longer on CI's cores)
  const test::CliRun r = s.sft(cfg, "--set max_steps=1 --set sequence_len=512");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  const std::string note =
      "sft: fsdp, fsdp_config (FULL_SHARD, offload_params) run as zero_stage: 3, offload_master: "
      "true, offload_optimizer: true (the ranks are soltrain's own: gpus: N or mpirun; one rank "
      "shards nothing)\n";
  EXPECT_EQ(all.rfind(note, 0), 0u) << all;  // the first line
  EXPECT_NE(all.find("sft: offload: host memory holds the fp32 masters"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;

  const fs::path q = s.config("axolotl-qwen3-qlora-fsdp.yaml");
  const test::CliRun rq = s.sft(q, "--set max_steps=1");
  ASSERT_EQ(rq.code, 0) << rq.out << rq.err;
  const std::string qall = rq.out + rq.err;
  EXPECT_EQ(qall.rfind(note, 0), 0u) << qall;  // (offload_weights streams bf16 bases only: not named)
  EXPECT_NE(qall.find("over a frozen NF4 base"), std::string::npos) << qall;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << qall;
}

// Llama 3.2 3B with FP8 over FSDP2 (fsdp_version: 2, reshard_after_forward: true = ZeRO-3) runs to the end under
// fp8-hybrid; its cosine floor (cosine_min_lr_ratio: 1.0, a constant lr after the warmup), compile, Liger and
// save_only_model settings are accepted.
TEST(PeerConfigs, AxolotlFp8Fsdp2RunsAsZero3) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-3b-fp8-fsdp2.yaml");
  const test::CliRun r = s.sft(cfg);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("sft: fsdp_version, fsdp_config (FULL_SHARD, reshard_after_forward: true) run as zero_stage: 3 "
                     "(the ranks"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("sft: recipe fp8-hybrid"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;
}

// use_ray hands the job to soltrain's Python Ray launcher (python/tests/test_ray.py runs it on a local cluster):
// an interpreter without it is one line. The DeepSpeed file the example names (deepspeed_configs/zero3.json, not in
// the working folder) is read as Axolotl ships it: ZeRO-3, and without Ray the example trains.
TEST(PeerConfigs, AxolotlRayNamesRayAndRunsDeepspeedAsZero3) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-lora-1b-ray.yml", "alpaca.jsonl", "llama");
  setenv("SOLTRAIN_PYTHON", "/nonexistent/python3", 1);
  const test::CliRun r = s.sft(cfg);
  unsetenv("SOLTRAIN_PYTHON");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(
      r.err,
      "error: this config is a Ray job (use_ray, distributed), started by soltrain's Python package with Ray "
      "installed (pip install \".[ray]\"); /nonexistent/python3 cannot import soltrain.ray and ray (SOLTRAIN_PYTHON "
      "names another interpreter)\n");
  const test::CliRun ok = s.sft(cfg, "--set use_ray=false --set max_steps=1 --set sequence_len=256");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("sft: deepspeed (ZeRO-3) run as zero_stage: 3 (the ranks"), std::string::npos) << all;
}

// Llama 3 Instruct DPO over an 8-bit base: preference training runs over the int8 base on chat_template.default
// rows with Axolotl's llama3 template.
TEST(PeerConfigs, AxolotlLlama3DpoTrainsOverInt8) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-3-instruct-dpo-lora-8b.yml", "dpo_chat.jsonl", "llama");
  const test::CliRun ok = s.sft(cfg, "--set max_steps=2 --set sequence_len=256");
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE((ok.out + ok.err).find("over a frozen LLM.int8 (row-wise int8) base"), std::string::npos)
      << ok.out << ok.err;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << ok.out << ok.err;
}

// Mistral 7B LoRA over an 8-bit base, as Axolotl's example has it (model_type / tokenizer_type, 8192-token packed
// rows): a tiny MistralForCausalLM (sliding_window 4096, which the short packed documents never reach) trains LoRA
// over the LLM.int8 base to the end.
// The Llama stand-in as a MistralForCausalLM (sliding_window 4096), in s.t.path / "mistral".
void add_mistral(const PeerSetup& s) {
  fs::copy(s.t.path / "llama", s.t.path / "mistral", fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(read_text(s.t.path / "mistral" / "config.json"));
  config["architectures"] = {"MistralForCausalLM"};
  config["model_type"] = "mistral";
  config["sliding_window"] = 4096;
  test::write_text(s.t.path / "mistral" / "config.json", config.dump(2));
}

TEST(PeerConfigs, AxolotlMistralLoraTrainsOverInt8) {
  PeerSetup s;
  add_mistral(s);
  const fs::path cfg = s.config("axolotl-mistral-lora.yml", "alpaca.jsonl", "mistral");
  const test::CliRun r = s.sft(cfg, "--set max_steps=1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("over a frozen LLM.int8 (row-wise int8) base (load_in_8bit)"), std::string::npos) << all;
  EXPECT_NE(all.find("sft: MistralForCausalLM on cpu"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Axolotl's Mistral QLoRA ORPO example (`rl: orpo`, orpo_alpha, chat_template.argilla rows: chosen and rejected
// whole conversations, as argilla/ultrafeedback-binarized-preferences-cleaned has them): ORPO without a reference
// over the NF4 base, its beta from orpo_alpha, TRL's ORPO metrics (nll_loss) logged, the adapter written.
TEST(PeerConfigs, AxolotlMistralOrpoRunsWithoutAReference) {
  PeerSetup s;
  add_mistral(s);
  {
    std::ofstream a(s.t.path / "argilla.jsonl");
    for (int i = 0; i < 40; ++i) {
      const std::string w = "w" + std::to_string(i), q = "Reverse " + w;
      a << R"({"source": "evol_instruct", "prompt": ")" << q << R"(", "chosen": [{"role": "user", "content": ")" << q
        << R"("}, {"role": "assistant", "content": ")" << std::to_string(i) << R"(w"}], "chosen-rating": 5, )"
        << R"("rejected": [{"role": "user", "content": ")" << q << R"("}, {"role": "assistant", "content": ")" << w
        << R"("}], "rejected-rating": 1})"
        << "\n";
    }
  }
  const fs::path cfg = s.config("axolotl-mistral-qlora-orpo.yml", "argilla.jsonl", "mistral");
  const test::CliRun r = s.sft(cfg, "--set max_steps=2 --set sequence_len=256");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("dpo: orpo loss, beta 0.1, NLL term (chosen prompt and answer) 1; LoRA r32"), std::string::npos)
      << all;
  EXPECT_NE(all.find("(no reference model)"), std::string::npos) << all;
  EXPECT_NE(all.find("NF4"), std::string::npos) << all;
  const std::string metrics = read_text(s.t.path / "out" / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"nll_loss\""), std::string::npos) << metrics.substr(0, 400);
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// `rl: simpo` (Axolotl's: TRL's CPOTrainer with loss_type simpo) on the Qwen2 DPO example: no reference, TRL's
// CPOConfig defaults (cpo_alpha 1, simpo_gamma 0.5) unless set; rl_beta is its beta.
TEST(PeerConfigs, AxolotlSimpoRunsWithoutAReference) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-qwen2-dpo.yaml", "dpo_chat.jsonl");
  const test::CliRun r = s.sft(cfg,
                               "--set rl=simpo --set rl_beta=2.0 --set simpo_gamma=0.8 --set max_steps=1 "
                               "--set sequence_len=256");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("dpo: simpo loss, beta 2, simpo_gamma 0.8, cpo_alpha 1; "), std::string::npos) << all;
  EXPECT_NE(all.find("(no reference model)"), std::string::npos) << all;
}

// Axolotl's Llama 3.2 QLoRA KTO example (`rl: kto`, rl_beta, kto_desirable_weight, llama3.ultra rows: prompt,
// completion, label): KTO over the NF4 base, the examples in order, each with its KL document as TRL builds it
// (its prompt and the previous example's completion within blocks of micro_batch_size), TRL's kl metric logged.
TEST(PeerConfigs, AxolotlKtoTrainsOnUnpairedExamples) {
  PeerSetup s;
  {
    std::ofstream k(s.t.path / "kto.jsonl");
    for (int i = 0; i < 40; ++i) {
      const std::string w = "w" + std::to_string(i);
      k << R"({"prompt": "Reverse )" << w << R"(", "completion": ")" << (i % 3 ? std::to_string(i) + "w" : w)
        << R"(", "label": )" << (i % 3 ? "true" : "false") << "}\n";
    }
  }
  const fs::path cfg = s.config("axolotl-llama-3-qlora-1b-kto.yaml", "kto.jsonl", "llama");
  const test::CliRun r = s.sft(cfg, "--set max_steps=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("dpo: kto loss, beta 0.5, desirable_weight 0.2, undesirable_weight 1; examples in order with "
                     "their KL documents; LoRA r32 on q,k,v,o,gate,up,down over a frozen NF4 base"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("wrote 40 examples with their KL documents"), std::string::npos) << all;
  const std::string metrics = read_text(s.t.path / "out" / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"kl\""), std::string::npos) << metrics.substr(0, 400);
  EXPECT_EQ(metrics.find("accuracies"), std::string::npos) << "KTO's examples are unpaired";
  // The prepared documents: 2i the example (its label on the first mask byte), 2i+1 its prompt with the previous
  // example's completion, the first of each block of 2 taking the block's last.
  fs::path prepared;
  for (const auto& e : fs::recursive_directory_iterator(s.t.path))
    if (e.is_directory() && e.path().filename().string().starts_with("dpo-train-0-")) prepared = e.path();
  ASSERT_FALSE(prepared.empty());
  const ShardSet docs = load_shards(prepared);
  ASSERT_EQ(docs.documents(), 80);
  auto part = [&](int64_t d, bool completion) {
    std::vector<int32_t> v;
    for (int64_t i = docs.doc_offsets[size_t(d)]; i < docs.doc_offsets[size_t(d) + 1]; ++i)
      if ((docs.mask[size_t(i)] == 1) == completion) v.push_back(docs.tokens[size_t(i)]);  // (2: the label)
    return v;
  };
  for (int64_t i = 0; i < 40; ++i) {
    const int64_t prev = i % 2 == 0 ? i + 1 : i - 1;  // blocks of micro_batch_size 2
    EXPECT_EQ(part(2 * i + 1, false), part(2 * i, false)) << i;
    EXPECT_EQ(part(2 * i + 1, true), part(2 * prev, true)) << i;
    EXPECT_EQ(docs.mask[size_t(docs.doc_offsets[size_t(2 * i)])] == kUndesirableMark, i % 3 == 0) << i;
  }
}

// TRL's KTO variant loss_type apo_zero_unpaired on the same example: no KL estimate (each KL document is one token,
// never scored), the line says so; under rl: dpo the loss type is one line.
TEST(PeerConfigs, AxolotlKtoApoZeroUnpairedMakesNoKlEstimate) {
  PeerSetup s;
  {
    std::ofstream k(s.t.path / "kto.jsonl");
    for (int i = 0; i < 8; ++i)
      k << R"({"prompt": "Reverse w)" << i << R"(", "completion": ")" << i << R"(w", "label": )"
        << (i % 3 ? "true" : "false") << "}\n";
  }
  const fs::path cfg = s.config("axolotl-llama-3-qlora-1b-kto.yaml", "kto.jsonl", "llama");
  const test::CliRun r = s.sft(cfg, "--set max_steps=1 --set loss_type=apo_zero_unpaired");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("undesirable_weight 1; loss_type apo_zero_unpaired (no KL estimate); LoRA r32"),
            std::string::npos)
      << r.out << r.err;
  fs::path prepared;
  for (const auto& e : fs::recursive_directory_iterator(s.t.path))
    if (e.is_directory() && e.path().filename().string().starts_with("dpo-train-0-")) prepared = e.path();
  ASSERT_FALSE(prepared.empty());
  const ShardSet docs = load_shards(prepared);
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(docs.doc_offsets[size_t(2 * i + 2)] - docs.doc_offsets[size_t(2 * i + 1)], 1);
  const test::CliRun dpo = s.sft(s.config("axolotl-qwen2-dpo.yaml", "dpo_chat.jsonl"),
                                 "--set loss_type=apo_zero_unpaired --set max_steps=1");
  EXPECT_EQ(dpo.code, 2) << dpo.out << dpo.err;
  EXPECT_NE(dpo.err.find("loss_type apo_zero_unpaired is KTO's (TRL's KTOTrainer): set rl: kto"), std::string::npos)
      << dpo.err;
}

// Axolotl's Qwen2 reward-model example (reward_model: true, AutoModelForSequenceClassification with num_labels 1,
// bradley_terry.chat_template rows: system, input, chosen, rejected as argilla/distilabel-intel-orca-dpo-pairs has
// them): a Bradley-Terry reward model trained in full, TRL's RewardTrainer metrics logged, saved as the family's
// *ForSequenceClassification with its score head, id2label and the tokenizer's pad id (its eos here).
TEST(PeerConfigs, AxolotlRewardModelTrainsASequenceClassifier) {
  PeerSetup s;
  {
    std::ofstream a(s.t.path / "orca_pairs.jsonl");
    for (int i = 0; i < 24; ++i) {
      const std::string w = "w" + std::to_string(i);
      a << R"({"system": ")" << (i % 2 ? "You reverse words." : "") << R"(", "input": "Reverse )" << w
        << R"(", "chosen": ")" << std::to_string(i) << R"(w", "rejected": ")" << w << R"(", "generations": []})"
        << "\n";
    }
  }
  const fs::path cfg = s.config("axolotl-qwen2-reward-model.yaml", "orca_pairs.jsonl");
  const test::CliRun r = s.sft(cfg, "--set max_steps=2 --set sequence_len=256");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("reward: Bradley-Terry reward model, Qwen3ForSequenceClassification"), std::string::npos) << all;
  EXPECT_NE(all.find("24 training pairs"), std::string::npos) << all;
  const std::string metrics = read_text(s.t.path / "out" / "metrics.jsonl");
  for (const char* k : {"\"accuracy\"", "\"margin\"", "\"mean_reward\"", "\"min_reward\"", "\"max_reward\""})
    EXPECT_NE(metrics.find(k), std::string::npos) << k << metrics.substr(0, 400);
  const fs::path model = s.t.path / "out" / "model";
  const nlohmann::json config = nlohmann::json::parse(read_text(model / "config.json"));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForSequenceClassification");
  EXPECT_EQ(config["id2label"], nlohmann::json({{"0", "LABEL_0"}}));
  ASSERT_TRUE(config["pad_token_id"].is_number_integer()) << config.dump();
  const CheckpointReader ckpt(model);
  EXPECT_TRUE(ckpt.has("score.weight"));
  EXPECT_FALSE(ckpt.has("lm_head.weight"));
  // the saved reward model is read back as a classifier (its pad id from its config), and refused as a causal LM
  const test::CliRun again =
      s.sft(cfg, cat("--set max_steps=1 --set sequence_len=256 --set base_model=", model.string(),
                     " --set output_dir=", (s.t.path / "out2").string()));
  EXPECT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_EQ((again.out + again.err).find("score.weight is new"), std::string::npos) << again.out << again.err;
  const test::CliRun causal =
      s.sft(s.config("axolotl-llama-3-lora-1b.yml"), cat("--set base_model=", model.string(), " --set max_steps=1"));
  EXPECT_EQ(causal.code, 2) << causal.out << causal.err;
  EXPECT_NE(causal.err.find("is a sequence classifier (a reward model): train it with reward_model: true"),
            std::string::npos)
      << causal.err;
  // a preference loss's settings are not silently ignored
  const test::CliRun beta = s.sft(cfg, "--set rl_beta=0.2 --set loss_type=ipo --set max_steps=1");
  EXPECT_EQ(beta.code, 2) << beta.out << beta.err;
  EXPECT_NE(beta.err.find("reward_model: true: loss_type, beta set a preference loss, and a reward model's loss "
                          "(Bradley-Terry) has no such setting: leave them out"),
            std::string::npos)
      << beta.err;
}

// Axolotl's qwen2/prm.yaml (a process reward model: TRL's PRMTrainer on stepwise_supervised rows) runs unchanged: the
// model read as its token classifier with two labels (a new biased score head), each step's label on the last token
// of the step and its "\n" separator, saved as *ForTokenClassification; what cannot go with it is one line.
TEST(PeerConfigs, AxolotlProcessRewardModelTrainsATokenClassifier) {
  PeerSetup s;
  {
    std::ofstream a(s.t.path / "shepherd.jsonl"), bad(s.t.path / "shepherd_bad.jsonl");
    for (int i = 0; i < 24; ++i)
      a << R"({"prompt": "Add )" << i << R"( and 1.", "completions": ["Take )" << i << R"(.", "Add one: )" << i + 1
        << R"(."], "labels": [true, )" << (i % 3 ? "true" : "false") << "]}\n";
    bad << R"({"prompt": "Add 1 and 1.", "completions": ["Two."], "labels": [2]})"
        << "\n";
  }
  const fs::path cfg = s.config("axolotl-qwen2-prm.yaml", "shepherd.jsonl");
  const test::CliRun r = s.sft(cfg, "--set max_steps=2 --set sequence_len=64 --set micro_batch_size=4");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("score.bias is new"), std::string::npos) << all;
  // the prepared documents: two labels each (the mask byte holds label + 1), each on a step's "\n"
  fs::path prepared;
  for (const auto& e : fs::recursive_directory_iterator(s.t.path))
    if (e.is_directory() && e.path().filename().string().starts_with("train-0-shepherd")) prepared = e.path();
  ASSERT_FALSE(prepared.empty());
  const ShardSet docs = load_shards(prepared);
  ASSERT_TRUE(docs.token_labels);
  ASSERT_EQ(docs.documents(), 24);
  Tokenizer tok = Tokenizer::load(s.t.path / "model" / "tokenizer.json");
  const std::vector<int32_t> newline = tok.encode("\n");
  ASSERT_EQ(newline.size(), 1u);
  for (int64_t d = 0; d < 24; ++d) {
    std::vector<int> labels;
    for (int64_t i = docs.doc_offsets[size_t(d)]; i < docs.doc_offsets[size_t(d) + 1]; ++i)
      if (docs.mask[size_t(i)]) {
        labels.push_back(docs.mask[size_t(i)] - 1);
        EXPECT_EQ(docs.tokens[size_t(i)], newline[0]) << d;
      }
    EXPECT_EQ(labels, (std::vector<int>{1, d % 3 ? 1 : 0})) << d;
    EXPECT_EQ(docs.mask[size_t(docs.doc_offsets[size_t(d) + 1] - 1)], d % 3 ? 2 : 1) << "the last step's label last";
  }
  const fs::path model = s.t.path / "out" / "model";
  const nlohmann::json config = nlohmann::json::parse(read_text(model / "config.json"));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForTokenClassification");
  EXPECT_EQ(config["id2label"], nlohmann::json({{"0", "LABEL_0"}, {"1", "LABEL_1"}}));
  const CheckpointReader ckpt(model);
  EXPECT_TRUE(ckpt.has("score.weight") && ckpt.has("score.bias"));
  EXPECT_FALSE(ckpt.has("lm_head.weight"));
  // read back as a token classifier (its own head), refused as a causal LM and as a reward model
  const test::CliRun again = s.sft(cfg, cat("--set max_steps=1 --set sequence_len=64 --set base_model=", model.string(),
                                            " --set output_dir=", (s.t.path / "out2").string()));
  EXPECT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_EQ((again.out + again.err).find("is new"), std::string::npos) << again.out << again.err;
  const test::CliRun causal =
      s.sft(s.config("axolotl-llama-3-lora-1b.yml"), cat("--set base_model=", model.string(), " --set max_steps=1"));
  EXPECT_EQ(causal.code, 2) << causal.out << causal.err;
  EXPECT_NE(causal.err.find("is a token classifier (a process reward model): train it with process_reward_model: true"),
            std::string::npos)
      << causal.err;
  // stepwise rows without process_reward_model, other rows with it, a label past num_labels, one label: one line each
  auto refused = [&](const fs::path& c, const std::string& sets, const std::string& line) {
    const test::CliRun x = s.sft(c, sets + " --set max_steps=1 --set sequence_len=64");
    EXPECT_EQ(x.code, 2) << sets << x.out << x.err;
    EXPECT_NE(x.err.find(line), std::string::npos) << sets << x.err;
  };
  refused(cfg, "--set process_reward_model=false --set num_labels=null",
          "stepwise_supervised data (a label per step) trains a process reward model: set process_reward_model: true");
  const auto dataset = [&](const char* file, const char* type) {
    return cat("'--set=datasets=[{path: ", (s.t.path / file).string(), ", type: ", type, "}]'");
  };
  refused(cfg, dataset("alpaca.jsonl", "alpaca"),
          "process_reward_model: true trains on stepwise_supervised datasets only");
  refused(cfg, dataset("shepherd_bad.jsonl", "stepwise_supervised"),
          "a step's label is 2 but num_labels is 2 (labels are 0 .. num_labels - 1)");
  refused(cfg, "--set num_labels=1", "num_labels 1: a process reward model labels each step with one of 2 or more");
  refused(cfg, "--set adapter=lora --set merge_adapter=true",
          "merging a process reward model's adapter (its score head beside the LoRA tensors) is not built yet");
  refused(s.config("axolotl-llama-3-lora-1b.yml"), "--set train_on_last_step_only=true",
          "train_on_last_step_only is a process reward model's setting (process_reward_model: true)");
  // TRL's PRMConfig options: another separator, and only the last step labelled in the training data (the
  // validation data keeps every label, as TRL's is_eval)
  const test::CliRun trl = s.sft(
      cfg, cat("--set max_steps=1 --set sequence_len=64 --set output_dir=", (s.t.path / "out3").string(),
               " --set train_on_last_step_only=true '--set=step_separator=\" ;\"' '--set=validation_datasets=[{path: ",
               (s.t.path / "shepherd.jsonl").string(), ", type: stepwise_supervised}]'"));
  ASSERT_EQ(trl.code, 0) << trl.out << trl.err;
  const int32_t separator_end = tok.encode(" ;").back();
  for (const char* kind : {"train-0-shepherd", "validation-0-shepherd"}) {
    fs::path dir;
    for (const auto& e : fs::recursive_directory_iterator(s.t.path / "out3"))
      if (e.is_directory() && e.path().filename().string().starts_with(kind)) dir = e.path();
    ASSERT_FALSE(dir.empty()) << kind;
    const ShardSet set = load_shards(dir);
    const bool train = std::string(kind).starts_with("train");
    for (int64_t d = 0; d < set.documents(); ++d) {
      int labels = 0;
      for (int64_t i = set.doc_offsets[size_t(d)]; i < set.doc_offsets[size_t(d) + 1]; ++i)
        if (set.mask[size_t(i)]) {
          ++labels;
          EXPECT_EQ(set.tokens[size_t(i)], separator_end) << kind << d;
        }
      EXPECT_EQ(labels, train ? 1 : 2) << kind << " " << d;
    }
  }
}

// Surogate's Qwen3 examples with its own spellings: `recompute: false` (a bool there; true is soltrain's full) trains
// with nothing recomputed; the Ray cluster block (`distributed:`) is a Ray job (one line where Ray is not installed);
// NVFP4's backend setting is not a second problem beside the refused recipe.
TEST(PeerConfigs, SurogateRecomputeBoolRayAndFp4Backend) {
  PeerSetup s;
  const fs::path norecompute = s.config("surogate-qwen3-lora-bf16-bench-norecompute.yaml", "gsm8k.jsonl");
  const test::CliRun r = s.sft(norecompute, "--set max_steps=1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("recompute none, "), std::string::npos) << r.out << r.err;
  const fs::path ray = s.config("surogate-qwen3-lora-bf16-ray.yaml", "gsm8k.jsonl");  // (a Ray job: test_ray.py)
  setenv("SOLTRAIN_PYTHON", "/nonexistent/python3", 1);
  const test::CliRun rr = s.sft(ray);
  unsetenv("SOLTRAIN_PYTHON");
  EXPECT_EQ(rr.code, 2) << rr.out << rr.err;
  EXPECT_NE(rr.err.find("error: this config is a Ray job (use_ray, distributed), started by"), std::string::npos)
      << rr.err;
  const fs::path fp4 = s.config("surogate-qwen3-lora-fp4.yaml", "gsm8k.jsonl");
  const test::CliRun rf = s.sft(fp4);
  EXPECT_EQ(rf.code, 2) << rf.out << rf.err;
  EXPECT_EQ(rf.err, problems(fp4, {{18,
                                    "recipe: \"nvfp4\": soltrain's recipes are bf16 and fp8-hybrid (NVFP4 needs a "
                                    "Blackwell GPU and is not built)"}}));
}

// Axolotl's archived Falcon 7B LoRA example (its `type: alpaca:chat`, Axolotl's base:prompt_style form of
// alpaca_chat; the empty gptq_* / torchdistx_path / max_packed_sequence_len keys; batch_size 2 over micro-batches
// of 1: an accumulation of 2) on the stand-in model (its Falcon special tokens dropped: the stand-in's tokenizer
// has others), over an 8-bit base.
TEST(PeerConfigs, AxolotlFalconAlpacaChatRunsOverInt8) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-falcon-7b-lora.yml", "alpaca.jsonl", "llama");
  const test::CliRun r = s.sft(cfg, "--set max_steps=1 --set special_tokens=null");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("over a frozen LLM.int8 (row-wise int8) base (load_in_8bit)"), std::string::npos)
      << r.out << r.err;
  EXPECT_NE((r.out + r.err).find(" steps, gradient accumulation 2, "), std::string::npos) << r.out << r.err;
}

// Llama 2 full fine-tune with the old flash-attn fused-kernel switches (flash_attn_cross_entropy, flash_attn_fuse_mlp:
// soltrain's kernels are its own, the same math) and model_type / tokenizer_type: runs to the end.
TEST(PeerConfigs, AxolotlLlama2FftOptimizedRunsToTheEnd) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-llama-2-fft-optimized.yml", "alpaca.jsonl", "llama");
  const test::CliRun r = s.sft(cfg, "--set max_steps=1 --set sequence_len=512");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << r.out << r.err;
}

// Axolotl's ALST example (long-context Llama 3.1 8B over DeepSpeed ZeRO-3): sequence_len 500_000 and
// min_sample_len 200_000 (YAML 1.1 digit groups), tiled_mlp, activation_offloading: legacy and the DeepSpeed file
// are read, and its hub dataset's data_files (cli/hub_inputs.h); what it still asks that soltrain lacks is named in
// one line: context parallelism.
TEST(PeerConfigs, AxolotlAlstNamesOnlyWhatIsMissing) {
  PeerSetup s;
  const fs::path cfg = s.config("axolotl-alst-llama3-8b-deepspeed.yaml", "alpaca.jsonl", "llama");
  const test::CliRun r = s.sft(cfg);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  // (its optimizer, adamw_torch_8bit, is torchao's AdamW8bit: read as such)
  EXPECT_EQ(r.err, problems(cfg, {{25,
                                   "context_parallel_size: context parallelism is not built yet; soltrain fits "
                                   "long sequences on one GPU (recompute, offload_activations, token tiles)"}}));
}

// Qwen3 8B LoRA with torch.compile (torch_compile_mode) runs to the end as it is.
TEST(PeerConfigs, AxolotlQwen3CompileRunsToTheEnd) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("axolotl-qwen3-8b-lora-fused-attn-compile.yaml"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(all.rfind("sft: LoRA r32 on q,k,v,o,gate,up,down\n", 0), 0u) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Surogate's pretraining example as written: `soltrain pt` trains it with its NorMuon optimizer under its FP8 recipe
// on the train split's text and validates on the test split (a folder with both), loss_scale: all and the unread
// truncation_strategy / use_chat_template accepted; the checkpoint holds NorMuon's state.
TEST(PeerConfigs, SurogatePretrainingRunsWithNormuonUnderFp8) {
  PeerSetup s;
  const fs::path cfg = s.config("surogate-pt-qwen3.yaml", "shakespeare");
  const test::CliRun ok = test::run("pt " + cfg.string() + " --set max_steps=2 --set save_steps=2", s.t);
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_EQ(SafetensorsFile(s.t.path / "out" / "checkpoint-2" / "optimizer.safetensors").metadata().at("optimizer"),
            "normuon");
  const std::string all = ok.out + ok.err;
  EXPECT_NE(all.find("; 30 training documents ("), std::string::npos) << all;
  EXPECT_NE(all.find("recipe fp8-hybrid: the decoder layers' projections in FP8"), std::string::npos) << all;
  EXPECT_NE(all.find(", 5 validation;"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;
}

// Axolotl's archived Jeopardy bot: `type: jeopardy` is its AlpacaPrompter over question / category and the response
// "what is " + answer (prompt_tokenizers.py JeopardyPromptTokenizingStrategy); its `tokens:` map (the first releases'
// special tokens) is read as special_tokens, said. The demo tokenizer is byte-level: the 40 prompts are Axolotl's
// "{system}\n\n### Instruction:\n{question}\n\n### Input:\n{category}\n\n### Response:\n" (9,390 bytes), the
// trained responses "what is 0w".."what is 39w" (430) plus an eos each.
TEST(PeerConfigs, AxolotlJeopardyRunsWithItsPrompt) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("axolotl-jeopardy-bot.yml", "jeopardy.jsonl"), "--set max_steps=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(all.rfind("sft: tokens: a map of special tokens (an early Axolotl form) is read as special_tokens\n"
                      "sft: sample_packing is not given: soltrain packs documents into rows (Axolotl's default is "
                      "false, a row per document, which gives more and smaller steps: set sample_packing: false for "
                      "that)\n"
                      "sft: tokenizer: bos_token <s>, eos_token </s>, unk_token <unk>; 3 new tokens",
                      0),
            0u)
      << all;
  EXPECT_NE(all.find("wrote 40 documents, 9860 tokens (470 trained)"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;
}

// Axolotl's archived XGen QLoRA with early_stopping_patience 3 over evals_per_epoch 4: with a threshold no fall in
// the validation loss passes (set here; the example's is 0), the run stops after the fourth evaluation (the first
// sets the best, three more without gain); saves_per_epoch 1 leaves no checkpoint per evaluation, so the last
// step's adapter is the final one, said. (sample_packing: false, Axolotl's default, given: an epoch is 38 steps;
// sequence_len 64 so that those rows are not padded to 8192 on CI's cores.)
TEST(PeerConfigs, AxolotlXgenStopsEarly) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("axolotl-xgen-7b-8k-qlora.yml", "text.jsonl"),
                               "--set early_stopping_threshold=100 --set sample_packing=false --set sequence_len=64");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("sft: note: early stopping keeps the last step's model (the best is restored only with a "
                     "checkpoint at every evaluation"),
            std::string::npos)
      << all;
  // 38 training documents a step (micro-batch 1, no packing), 4 epochs: evaluations every 9 steps
  EXPECT_NE(all.find("step 36: early stopping: 3 evaluations in a row without a validation loss below the best by "
                     "more than 100 ("),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("sft: done, 36 steps;"), std::string::npos) << all;
  EXPECT_TRUE(fs::exists(s.t.path / "out" / "adapter" / "adapter_model.safetensors")) << all;
}

// Axolotl's Llama 2 LoftQ example (peft: {loftq_config: {loftq_bits: 4}}): each adapted projection starts as its NF4
// round trip with the adapter at the SVD of what that loses (python/tests/test_loftq.py checks it against PEFT's
// loftq_init); the adapter is saved as PEFT writes a LoftQ one.
TEST(PeerConfigs, AxolotlLoftqRunsToTheEnd) {
  PeerSetup s;
  const test::CliRun r = s.sft(s.config("axolotl-llama-2-loftq.yml", "alpaca.jsonl", "llama"), "--set max_steps=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json cfg = nlohmann::json::parse(read_text(s.t.path / "out" / "adapter" / "adapter_config.json"));
  EXPECT_EQ(cfg["init_lora_weights"], "loftq");
  EXPECT_EQ(cfg["loftq_config"], (nlohmann::json{{"loftq_bits", 4}, {"loftq_iter", 1}}));
}

// Axolotl's QAT examples (model/qat.h; python/tests/test_qat.py checks the fake quantisation against torchao): int4
// weights with int8 activations under FSDP's full_shard (ZeRO-3 here), and NVFP4 weights and activations. Each trains
// fake-quantised and saves the plain model.
TEST(PeerConfigs, AxolotlQatExamplesRunToTheEnd) {
  for (const auto& [name, scheme] :
       {std::pair<std::string, std::string>{"axolotl-llama-3-3b-qat-fsdp2.yaml",
                                            "int4 (group 32) weights, int8 (per token) activations"},
        {"axolotl-llama-3-3b-qat-nvfp4.yaml",
         "nvfp4 (block 16, per-tensor scale) weights, nvfp4 (block 16, "
         "per-tensor scale) activations"}}) {
    PeerSetup s;
    const test::CliRun r = s.sft(s.config(name, "alpaca.jsonl", "llama"),
                                 "--set max_steps=2 --set micro_batch_size=1 --set sequence_len=256");
    ASSERT_EQ(r.code, 0) << name << r.out << r.err;
    const std::string all = r.out + r.err;
    EXPECT_NE(all.find("sft: qat: " + scheme + " fake-quantised in every projection and the LM head"),
              std::string::npos)
        << all;
    EXPECT_TRUE(fs::exists(s.t.path / "out" / "model" / "model.safetensors")) << all;
  }
}

}  // namespace
}  // namespace soltrain
