// Tokenizer tests: exact HF ids on the real Qwen3 / Llama 3 tokenizers, and small hand-made tokenizer.json
// files for byte fallback, Metaspace, merge formats and error messages.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "core/error.h"
#include "io/json_file.h"
#include "test_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {
namespace {

using nlohmann::json;

std::filesystem::path tokenizers_dir() {
  if (const char* env = std::getenv("SOLTRAIN_TOKENIZERS")) return env;
  return SOLTRAIN_TOKENIZERS;
}

// Loading a 150k-token vocabulary takes a while; each real tokenizer is loaded once per test run.
Tokenizer& real_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const auto dir = tokenizers_dir() / name;
    if (!std::filesystem::exists(dir / "tokenizer.json"))
      throw std::runtime_error(cat(dir.string(), "/tokenizer.json is missing: run tests/tools/fetch_tokenizers.sh ",
                                   tokenizers_dir().string()));
    slot = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  }
  return *slot;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

void check_fixture(const std::string& name) {
  Tokenizer& tok = real_tokenizer(name);
  const json cases = read_json_file(test::fixtures() / "tokenizer" / (name + "_encode_shared.json"));
  ASSERT_GT(cases.size(), 400u);
  int encoded = 0, decoded = 0;
  for (const json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(got, want) << name << " text: " << json(text).dump() << "\n got  " << show(got) << "\n want "
                         << show(want);
    encoded += got == want;
    if (c["decoded_ok"].get<bool>()) {
      EXPECT_EQ(tok.decode(want), text) << name << " decode of " << show(want);
      ++decoded;
    }
  }
  EXPECT_EQ(encoded, int(cases.size()));
  std::cout << name << ": " << encoded << "/" << cases.size() << " encodings exact, " << decoded
            << " decode round trips checked\n";
}

TEST(TokenizerReal, Qwen3MatchesHF) {
  check_fixture("qwen3");
}
TEST(TokenizerReal, Llama3MatchesHF) {
  check_fixture("llama3");
}

// Rendered chat templates (special tokens mid-text) encode to the ids HF gives; the templates themselves
// are tested with the chat-template code.
void check_chat_fixture(const std::string& name) {
  Tokenizer& tok = real_tokenizer(name);
  const json cases = read_json_file(test::fixtures() / "tokenizer" / (name + "_chat.json"));
  ASSERT_GT(cases.size(), 5u);
  for (const json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << name << " text: " << json(text).dump();
    EXPECT_EQ(tok.decode(want), text);
  }
}

TEST(TokenizerReal, Qwen3ChatTextMatchesHF) {
  check_chat_fixture("qwen3");
}
TEST(TokenizerReal, Llama3ChatTextMatchesHF) {
  check_chat_fixture("llama3");
}

TEST(TokenizerReal, SpecialTokensAndSkip) {
  Tokenizer& tok = real_tokenizer("qwen3");
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok.vocab_size(), 151669u);
  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "user\nhi");
}

// Byte-level BPE without a normalizer loses nothing: decode(encode(x)) == x for any UTF-8 text, including
// text full of special-token fragments, odd whitespace and unpaired combining marks.
TEST(TokenizerReal, Llama3RoundTripsRandomText) {
  Tokenizer& tok = real_tokenizer("llama3");
  const std::vector<std::string> atoms = {"a",
                                          "Z",
                                          " ",
                                          "  ",
                                          "\n",
                                          "\r\n",
                                          "\t",
                                          "7",
                                          "123",
                                          "'s",
                                          "'LL",
                                          "<|",
                                          "|>",
                                          "<|eot_id|>",
                                          "<|begin_of_text",
                                          "\xC3\xA9",
                                          "e\xCC\x81",
                                          "\xE4\xB8\xAD",
                                          "\xF0\x9F\xA4\x97",
                                          "\xE1\xA0\x8E",
                                          "\xC2\xA0",
                                          "!?",
                                          "\xE2\x80\x8B",
                                          "\xEF\xBF\xBD",
                                          "x",
                                          ".",
                                          "--"};
  std::mt19937 rng(7);
  for (int k = 0; k < 300; ++k) {
    std::string text;
    const int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << json(text).dump();
  }
}

// ---- Small hand-made tokenizers ----

const char* kLlama2Vocab = R"({"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5, "▁": 6,
  "h": 7, "e": 8, "l": 9, "o": 10, "▁h": 11, "ll": 12, "▁he": 13, "llo": 14, "▁hello": 15, "w": 16, "▁w": 17})";

const char* kAddedTokens = R"([
  {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}])";

// Llama 2 / SentencePiece-converted style: Prepend + Replace normalizer, no pre-tokenizer, byte fallback,
// merges written as pairs.
json llama2_style() {
  json j;
  j["added_tokens"] = json::parse(kAddedTokens);
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})");
  j["pre_tokenizer"] = nullptr;
  j["model"] = {
      {"type", "BPE"},
      {"unk_token", "<unk>"},
      {"byte_fallback", true},
      {"fuse_unk", true},
      {"dropout", nullptr},
      {"vocab", json::parse(kLlama2Vocab)},
      {"merges", json::parse(R"([["▁", "h"], ["l", "l"], ["▁h", "e"], ["ll", "o"], ["▁he", "llo"], ["▁", "w"]])")}};
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  return j;
}

TEST(TokenizerSmall, ByteFallbackLlama2Style) {
  Tokenizer tok = Tokenizer::from_json(llama2_style());
  // "▁hello" merges fully; "\n" and "é" are not in the vocab and fall back to their UTF-8 bytes.
  const std::vector<int32_t> ids = tok.encode("hello\n\xC3\xA9");
  EXPECT_EQ(ids, (std::vector<int32_t>{15, 3, 4, 5}));
  EXPECT_EQ(tok.decode(ids), "hello\n\xC3\xA9");
  // 'z' has no byte token either: it becomes <unk>, and fuse_unk joins the two.
  EXPECT_EQ(tok.encode("hzz"), (std::vector<int32_t>{11, 0}));
  // Text after a special token is normalized on its own, so it gets its own "▁" (as in HF).
  EXPECT_EQ(tok.encode("<s>hello hello"), (std::vector<int32_t>{1, 15, 15}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, 15, 15}, true), "hello hello");
  // A lone byte that is not valid UTF-8 decodes to U+FFFD.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{15, 4}), "hello\xEF\xBF\xBD");
}

// Newer Llama / Mistral style: Metaspace pre-tokenizer and decoder, merges as "a b" strings.
json metaspace_style(const std::string& scheme) {
  json j = llama2_style();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}};
  j["model"]["merges"] = json::parse(R"(["▁ h", "l l", "▁h e", "ll o", "▁he llo", "▁ w"])");
  return j;
}

TEST(TokenizerSmall, MetaspaceAndStringMerges) {
  Tokenizer first = Tokenizer::from_json(metaspace_style("first"));
  EXPECT_EQ(first.encode("hello hello"), (std::vector<int32_t>{15, 15}));
  // "first" only prepends at the very start of the input, not after a special token.
  EXPECT_EQ(first.encode("<s>hello"), (std::vector<int32_t>{1, 7, 8, 14}));
  EXPECT_EQ(first.decode(std::vector<int32_t>{15, 15}), "hello hello");
  Tokenizer always = Tokenizer::from_json(metaspace_style("always"));
  EXPECT_EQ(always.encode("<s>hello"), (std::vector<int32_t>{1, 15}));
  Tokenizer never = Tokenizer::from_json(metaspace_style("never"));
  EXPECT_EQ(never.encode("hello"), (std::vector<int32_t>{7, 8, 14}));
}

TEST(TokenizerSmall, MergePairsAndStringsAgree) {
  Tokenizer pairs = Tokenizer::from_json(metaspace_style("always"));
  json j = metaspace_style("always");
  j["model"]["merges"] = llama2_style()["model"]["merges"];
  Tokenizer strings = Tokenizer::from_json(j);
  for (const char* text : {"hello", "hello world", "hell", "wow hello\nhe"})
    EXPECT_EQ(pairs.encode(text), strings.encode(text)) << text;
}

// GPT-2 style: ByteLevel with add_prefix_space and its built-in regex, and the ByteLevel decoder.
TEST(TokenizerSmall, ByteLevelGpt2Style) {
  json j;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"vocab", json::parse(R"({"Ġ": 0, "h": 1, "i": 2, "Ġh": 3, "Ġhi": 4, "!": 5, "Ċ": 6})")},
                {"merges", json::parse(R"(["Ġ h", "Ġh i"])")}};
  Tokenizer tok = Tokenizer::from_json(j);
  // " hi hi!\n" splits into " hi" " hi" "!" "\n"; bytes 0x20 and 0x0A are spelled Ġ and Ċ.
  const auto ids = tok.encode("hi hi!\n");
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 4, 5, 6}));
  EXPECT_EQ(tok.decode(ids), " hi hi!\n");
}

// Added tokens: lstrip/rstrip swallow the spaces around them, single_word needs word boundaries, and
// normalized=true tokens are matched in the normalized text.
TEST(TokenizerSmall, AddedTokenOptions) {
  json j;
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", "X"}}}, {"content", "a"}};
  j["model"] = {
      {"type", "BPE"}, {"vocab", json::parse(R"({"a": 0, "b": 1, " ": 2, "x": 3})")}, {"merges", json::array()}};
  j["added_tokens"] = json::parse(R"([
    {"id": 10, "content": "<m>", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": true},
    {"id": 11, "content": "ab", "single_word": true, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
    {"id": 12, "content": "aa", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false},
    {"id": 13, "content": "XX", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}])");
  Tokenizer tok = Tokenizer::from_json(j);
  EXPECT_EQ(tok.encode("a  <m>  b"), (std::vector<int32_t>{0, 10, 1}));
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{11}));
  EXPECT_EQ(tok.encode(" ab b"), (std::vector<int32_t>{2, 11, 2, 1}));
  EXPECT_EQ(tok.encode("xab"), (std::vector<int32_t>{3, 0, 1}));           // "ab" inside a word is not the token
  EXPECT_EQ(tok.encode("Xa"), (std::vector<int32_t>{12}));                 // normalized to "aa" first
  EXPECT_EQ(tok.encode("XXa"), (std::vector<int32_t>{13, 0}));             // raw match wins before normalization
  EXPECT_EQ(tok.decode(std::vector<int32_t>{11, 10, 12}, true), "ab aa");  // no decoder: joined by spaces
}

// An id far past the count of tokens is refused, not allocated for (the fuzz job's find: an added token with id
// 2^31 - 1 asked the id table for 68 GB); ids just past the vocabulary (Qwen's, Llama 3's added tokens) are fine.
TEST(TokenizerSmall, IdsFarPastTheTokensAreRefused) {
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", json::parse(R"({"a": 0, "b": 1})")}, {"merges", json::array()}};
  j["added_tokens"] = json::parse(R"([{"id": 5, "content": "<s>", "special": true}])");
  EXPECT_EQ(Tokenizer::from_json(j).vocab_size(), 6u);
  for (const char* bad : {R"([{"id": 2147483647, "content": "<s>", "special": true}])",
                          R"([{"id": 300000000, "content": "<s>", "special": true}])"}) {
    j["added_tokens"] = json::parse(bad);
    try {
      Tokenizer::from_json(j);
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("is far past the 3 tokens"), std::string::npos) << e.what();
    }
  }
  j["added_tokens"] = json::array();
  j["model"]["vocab"] = json::parse(R"({"a": 0, "b": 1000000000})");
  EXPECT_THROW(Tokenizer::from_json(j), UserError);
}

// Split behaviours on a character-level vocab (HF's SplitDelimiterBehavior), observed through the ids.
TEST(TokenizerSmall, SplitBehaviors) {
  const auto make = [](const std::string& behavior, bool invert) {
    json j;
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    j["model"] = {{"type", "BPE"},
                  {"vocab", json::parse(R"({"a": 0, "-": 1, "a-": 2, "-a": 3, "--": 4, "aa": 5})")},
                  {"merges", json::parse(R"(["a -", "- a", "- -", "a a"])")}};
    return Tokenizer::from_json(j);
  };
  const std::string text = "a--a";
  EXPECT_EQ(make("Removed", false).encode(text), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(make("Isolated", false).encode(text), (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_EQ(make("MergedWithPrevious", false).encode(text), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(make("MergedWithNext", false).encode(text), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(make("Contiguous", false).encode(text), (std::vector<int32_t>{0, 4, 0}));
  EXPECT_EQ(make("Removed", true).encode(text), (std::vector<int32_t>{1, 1}));
}

// Patterns use Oniguruma's \s (as HF does), which unlike PCRE2's own excludes U+180E.
TEST(TokenizerSmall, RegexSpaceIsOniguruma) {
  Regex space("\\s+", "test");
  EXPECT_TRUE(space.find_all("\xE1\xA0\x8E").empty());
  EXPECT_EQ(space.find_all(" \xC2\xA0\xE3\x80\x80").size(), 1u);
  Regex not_space("[^\\s]+", "test");
  EXPECT_EQ(not_space.find_all("a\xE1\xA0\x8E b").size(), 2u);
  Regex quoted(regex_escape("\\s"), "test");  // a literal backslash-s stays literal
  EXPECT_EQ(quoted.find_all("x\\sy").size(), 1u);
}

// A message check: the UserError thrown by fn contains `needle`.
template <typename Fn>
void expect_user_error(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerSmall, UnsupportedComponentsAreNamed) {
  json j = llama2_style();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_user_error([&] { Tokenizer::from_json(j); },
                    "tokenizer.json: pre_tokenizer type 'Whitespace' is not supported");
  j = llama2_style();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  expect_user_error([&] { Tokenizer::from_json(j); }, "normalizer type 'BertNormalizer' is not supported");
  j = llama2_style();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_user_error([&] { Tokenizer::from_json(j); }, "decoder type 'WordPiece' is not supported");
  j = llama2_style();
  j["model"]["type"] = "Unigram";
  expect_user_error([&] { Tokenizer::from_json(j); }, "model type 'Unigram' is not supported");
}

TEST(TokenizerSmall, CorruptFilesGiveOneLine) {
  test::TempDir dir;
  {
    std::ofstream(dir.path / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": {";
  }
  expect_user_error([&] { Tokenizer::load(dir.path); }, "not valid JSON");
  expect_user_error([&] { Tokenizer::load(dir.path / "missing"); }, "cannot open");

  json j = llama2_style();
  j["model"]["merges"] = json::parse(R"(["▁ h", "q r"])");
  expect_user_error([&] { Tokenizer::from_json(j); }, "merge 1 uses 'q', which is not in the vocab");
  j["model"]["merges"] = json::parse(R"(["▁h"])");
  expect_user_error([&] { Tokenizer::from_json(j); }, "is not two tokens separated by a space");
  j = llama2_style();
  j["model"].erase("vocab");
  expect_user_error([&] { Tokenizer::from_json(j); }, "missing field 'vocab'");
  j = llama2_style();
  j["model"]["unk_token"] = "<nope>";
  expect_user_error([&] { Tokenizer::from_json(j); }, "unk_token '<nope>' is not in the vocab");

  Tokenizer tok = Tokenizer::from_json(llama2_style());
  expect_user_error([&] { tok.encode("bad \xFF byte"); }, "not valid UTF-8");
  expect_user_error([&] { tok.decode(std::vector<int32_t>{99}); }, "token id 99 is outside the vocabulary");
}

// The CLI end to end: JSON lines in, ids out; a bad line is exit code 2 with one message.
TEST(TokenizerCli, EncodeJsonLines) {
  test::TempDir dir;
  {
    std::ofstream(dir.path / "tokenizer.json") << llama2_style().dump();
  }
  {
    std::ofstream(dir.path / "in.jsonl") << R"({"text": "hello\n\u00e9"})"
                                         << "\n\n"
                                         << R"({"text": ""})"
                                         << "\n";
  }
  {
    std::ofstream(dir.path / "bad.jsonl") << R"({"txt": 1})"
                                          << "\n";
  }
  const std::string bin = SOLTRAIN_BIN;
  const auto run = [&](const std::string& in, const std::string& out) {
    const std::string cmd = bin + " encode --tokenizer " + dir.path.string() + " < " + (dir.path / in).string() +
                            " > " + (dir.path / out).string() + " 2>&1";
    return WEXITSTATUS(std::system(cmd.c_str()));
  };
  ASSERT_EQ(run("in.jsonl", "out.jsonl"), 0);
  std::ifstream out(dir.path / "out.jsonl");
  std::string l1, l2, l3;
  std::getline(out, l1);
  std::getline(out, l2);
  EXPECT_EQ(l1, R"({"ids": [15, 3, 4, 5]})");
  EXPECT_EQ(l2, R"({"ids": []})");
  EXPECT_FALSE(std::getline(out, l3));
  EXPECT_EQ(run("bad.jsonl", "err.txt"), 2);
  std::ifstream err(dir.path / "err.txt");
  std::getline(err, l1);
  EXPECT_EQ(l1, R"(error: stdin line 1: expected an object with a string field "text")");
}

}  // namespace
}  // namespace soltrain
