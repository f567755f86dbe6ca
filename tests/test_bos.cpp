// The BOS token a tokenizer's post_processor adds (Llama 3.1's TemplateProcessing puts <|begin_of_text|>
// first): text and alpaca rows get it as transformers' tokenizer(text) gives it to Axolotl, once; a chat
// template that writes bos_token itself gets no second one; a tokenizer without one (Qwen's) adds nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/demo_kit.h"
#include "data/dataset.h"
#include "data/shards.h"
#include "data/tokenize_job.h"
#include "data_test_util.h"
#include "io/json_file.h"
#include "llama_tokenizer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int32_t kBos = test::kLlamaBos, kEot = test::kLlamaEot;

// The Llama 3.1 stand-in, with or without the post_processor that adds the BOS.
fs::path bos_tokenizer(const fs::path& dir, bool post_processor) {
  write_byte_tokenizer(dir);
  test::add_llama3_specials(dir, post_processor);
  return dir;
}

std::vector<int32_t> bytes(const std::string& s) {
  return std::vector<int32_t>(s.begin(), s.end());
}

std::vector<int32_t> join(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// One record of `type` tokenized with `chat_template` (for conversations); the document's ids and mask.
ShardSet tokenize_one(const fs::path& tok, const test::TempDir& t, const std::string& record, DatasetType type,
                      const std::string& chat_template = "") {
  static int n = 0;
  const fs::path data = t.path / ("d" + std::to_string(++n) + ".jsonl");
  test::write_text(data, record + "\n");
  TokenizeOptions o;
  o.tokenizer = tok;
  o.sources = {{data, type}};
  o.out = t.path / ("out" + std::to_string(n));
  o.progress = false;
  o.fields.chat_template = chat_template;
  std::ostringstream log;
  run_tokenize(o, log);
  return load_shards(o.out);
}

TEST(Bos, PostProcessorPrefixIsRead) {
  test::TempDir t;
  Tokenizer with = Tokenizer::load(bos_tokenizer(t.path / "with", true));
  EXPECT_EQ(with.special_prefix(), std::vector<int32_t>{kBos});
  EXPECT_TRUE(with.special_suffix().empty());
  EXPECT_EQ(with.encode_with_special_tokens("hi"), (std::vector<int32_t>{kBos, 'h', 'i'}));
  EXPECT_EQ(with.encode("hi"), bytes("hi"));  // add_special_tokens=False: nothing added
  Tokenizer without = Tokenizer::load(bos_tokenizer(t.path / "without", false));
  EXPECT_EQ(without.encode_with_special_tokens("hi"), bytes("hi"));
}

// Axolotl's completion: tokenizer(text) + eos → <|begin_of_text|> text <|im_end|>, all trained.
TEST(Bos, TextRowsStartWithTheBos) {
  test::TempDir t;
  const fs::path tok = bos_tokenizer(t.path / "tok", true);
  const ShardSet s = tokenize_one(tok, t, R"({"text": "abc"})", DatasetType::kText);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{kBos, 'a', 'b', 'c', kEot}));
  EXPECT_EQ(s.mask, std::vector<uint8_t>(5, 1));
  const fs::path plain = bos_tokenizer(t.path / "plain", false);
  EXPECT_EQ(tokenize_one(plain, t, R"({"text": "abc"})", DatasetType::kText).tokens,
            (std::vector<int32_t>{'a', 'b', 'c', kEot}));
}

// Axolotl's alpaca: the prompt with its BOS (untrained), then the response tokenized alone with its BOS
// stripped (strip_bos_token) and eos appended: one BOS, at the start.
TEST(Bos, AlpacaHasOneBosBeforeThePrompt) {
  test::TempDir t;
  const fs::path tok = bos_tokenizer(t.path / "tok", true);
  const ShardSet s =
      tokenize_one(tok, t, R"({"instruction": "Say hi", "input": "", "output": "hi"})", DatasetType::kAlpaca);
  const std::vector<int32_t> prompt = join({{kBos}, bytes(alpaca_prompt("Say hi", ""))});
  EXPECT_EQ(s.tokens, join({prompt, bytes("hi"), {kEot}}));
  std::vector<uint8_t> mask(prompt.size(), 0);
  mask.insert(mask.end(), 3, 1);
  EXPECT_EQ(s.mask, mask);
}

// A chat template that writes bos_token (Axolotl's llama3) is tokenized without special tokens, as
// apply_chat_template does: exactly one BOS.
TEST(Bos, ChatTemplateWritesTheOnlyBos) {
  test::TempDir t;
  const fs::path tok = bos_tokenizer(t.path / "tok", true);
  const ShardSet s =
      tokenize_one(tok, t, R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})",
                   DatasetType::kConversation, "llama3");
  ASSERT_FALSE(s.tokens.empty());
  EXPECT_EQ(s.tokens[0], kBos);
  EXPECT_EQ(std::count(s.tokens.begin(), s.tokens.end(), kBos), 1);
  // <|begin_of_text|> <|start_header_id|>user<|end_header_id|>\n\na<|eot_id|> and the same for "b".
  EXPECT_EQ(s.tokens, join({{kBos, 260},
                            bytes("user"),
                            {261},
                            bytes("\n\na"),
                            {kEot, 260},
                            bytes("assistant"),
                            {261},
                            bytes("\n\nb"),
                            {kEot}}));
}

// A malformed post_processor is one UserError naming the file, never a crash.
TEST(Bos, MalformedPostProcessorIsAUserError) {
  test::TempDir t;
  const fs::path dir = bos_tokenizer(t.path / "tok", false);
  const json tok = read_json_file(dir / "tokenizer.json");
  for (const char* p :
       {R"({"type": "TemplateProcessing", "single": 5, "special_tokens": {}})",
        R"({"type": "TemplateProcessing", "single": ["x"], "special_tokens": {}})",
        R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {}})",
        R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}],
                            "special_tokens": {"<s>": {"ids": ["a"]}}})",
        R"({"type": "Sequence", "processors": 3})", R"({"type": "BertProcessing", "cls": []})", R"({"no_type": 1})"}) {
    json bad = tok;
    bad["post_processor"] = json::parse(p);
    test::write_text(dir / "tokenizer.json", bad.dump());
    EXPECT_THROW(Tokenizer::load(dir), UserError) << p;
  }
}

// An unknown post_processor type is named when special tokens are asked for, not guessed.
TEST(Bos, UnknownPostProcessorIsNamed) {
  test::TempDir t;
  const fs::path dir = bos_tokenizer(t.path / "tok", false);
  json tok = read_json_file(dir / "tokenizer.json");
  tok["post_processor"] = {{"type", "Exotic"}};
  test::write_text(dir / "tokenizer.json", tok.dump());
  Tokenizer k = Tokenizer::load(dir);
  EXPECT_EQ(k.encode("x"), bytes("x"));
  try {
    k.encode_with_special_tokens("x");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("post_processor type 'Exotic' is not supported"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace soltrain
