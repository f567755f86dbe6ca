// Mistral's tekken.json read as a tokenizer (tokenizer/tekken.h). The merges transformers' converter derives from
// the ranks are checked against tiktoken's own algorithm (merge the adjacent pair whose concatenation has the
// lowest rank until none is in the vocabulary), written here over a small random vocabulary; the chat formats
// against texts mistral-common 1.13.1's encode_chat_completion gave (python/tests/test_mistral_common.py checks
// both against mistral-common live on its real tekken files).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

#include "cli_test_util.h"
#include "data_test_util.h"
#include "io/base64.h"
#include "test_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tekken.h"
#include "tokenizer/tokenizer.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A vocabulary of every byte (in a shuffled order) and `extra` tokens grown by joining two earlier ones, each rank
// its position. (A tiktoken vocabulary is grown the same way: every token but the bytes is a merge of two earlier.)
std::vector<std::string> random_vocab(size_t extra, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  std::shuffle(v.begin(), v.end(), rng);
  std::set<std::string> seen(v.begin(), v.end());
  const std::string letters = "abcde ";
  while (v.size() < 256 + extra) {
    // (joins of the letters only, so merges are common in the texts below)
    const auto pick = [&] {
      for (;;) {
        const std::string& t = v[rng() % v.size()];
        if (t.find_first_not_of(letters) == std::string::npos) return t;
      }
    };
    const std::string t = pick() + pick();
    if (t.size() <= 6 && seen.insert(t).second) v.push_back(t);
  }
  return v;
}

// tiktoken's encoding of one piece over `rank`: the piece's own token when it has one, else its byte-pair merge.
std::vector<int64_t> tiktoken_merge(const std::string& piece, const std::map<std::string, int64_t>& rank) {
  if (const auto it = rank.find(piece); it != rank.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.push_back(std::string(1, c));
  for (;;) {
    int64_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (const auto it = rank.find(parts[i] + parts[i + 1]); it != rank.end() && (best < 0 || it->second < best))
        best = it->second, at = i;
    if (best < 0) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  std::vector<int64_t> out;
  for (const auto& p : parts) out.push_back(rank.at(p));
  return out;
}

json tekken_json(const std::vector<std::string>& vocab, const std::string& pattern, const std::string& version,
                 size_t num_special, bool special_list) {
  json j = {{"config",
             {{"pattern", pattern},
              {"num_vocab_tokens", vocab.size()},
              {"default_vocab_size", vocab.size() + num_special},
              {"default_num_special_tokens", num_special},
              {"version", version}}},
            {"vocab", json::array()}};
  for (size_t r = 0; r < vocab.size(); ++r)
    j["vocab"].push_back({{"rank", r}, {"token_bytes", base64(vocab[r])}, {"token_str", nullptr}});
  if (special_list)
    j["special_tokens"] = json::array({{{"rank", 0}, {"token_str", "<unk>"}, {"is_control", true}},
                                       {{"rank", 1}, {"token_str", "<s>"}, {"is_control", true}},
                                       {{"rank", 2}, {"token_str", "</s>"}, {"is_control", true}},
                                       {{"rank", 3}, {"token_str", "[INST]"}, {"is_control", true}},
                                       {{"rank", 4}, {"token_str", "[/INST]"}, {"is_control", true}}});
  return j;
}

TEST(Tekken, EncodesAsTiktokensMergeOverTheRanks) {
  TempDir t;
  const std::vector<std::string> vocab = random_vocab(300, 7);
  std::map<std::string, int64_t> rank;
  for (size_t r = 0; r < vocab.size(); ++r) rank[vocab[r]] = int64_t(r);
  // (an ASCII pattern, so std::regex splits the reference's text as PCRE2 splits soltrain's)
  const std::string pattern = "[a-e]+| ?[^a-e ]+|\\s+";
  const size_t num_special = 16;
  write_text(t.path / "tekken.json", tekken_json(vocab, pattern, "v7", num_special, true).dump());
  Tokenizer tok = Tokenizer::load(t.path);  // (a folder with only tekken.json)
  EXPECT_EQ(tok.vocab_size(), vocab.size() + num_special);
  EXPECT_EQ(tok.token_to_id("</s>"), 2);
  EXPECT_EQ(tok.token_to_id("<SPECIAL_15>"), 15);  // fillers up to default_num_special_tokens
  std::mt19937_64 rng(3);
  const std::string chars = "abcdeabcde   xyz.\n";
  const std::regex split(pattern);
  for (int n = 0; n < 200; ++n) {
    std::string text;
    for (size_t k = rng() % 40; k > 0; --k) text += chars[rng() % chars.size()];
    std::vector<int64_t> want;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), split); it != std::sregex_iterator(); ++it)
      for (int64_t r : tiktoken_merge(it->str(), rank)) want.push_back(r + int64_t(num_special));
    const std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want) << "\"" << text << "\"";
    EXPECT_EQ(tok.decode(got), text);
  }
}

TEST(Tekken, TheFirstLayoutsControlTokensAndTheVocabularyCut) {
  TempDir t;
  std::vector<std::string> vocab = random_vocab(40, 9);
  json j = tekken_json(vocab, "\\s+|\\S+", "v3", 1000, false);
  j["config"]["default_vocab_size"] = 1000 + 256 + 10;  // the file lists more ranks than the vocabulary keeps
  write_text(t.path / "tekken.json", j.dump());
  const TekkenConversion c = convert_tekken(t.path / "tekken.json");
  EXPECT_EQ(c.version, "v3");
  EXPECT_EQ(c.config["bos_token"], "<s>");
  EXPECT_EQ(c.config["eos_token"], "</s>");
  EXPECT_EQ(c.config["pad_token"], "<pad>");
  Tokenizer tok = Tokenizer::from_json(c.tokenizer);
  EXPECT_EQ(tok.vocab_size(), 1266u);
  EXPECT_EQ(tok.token_to_id("[SYSTEM_PROMPT]"), 17);  // mistral-common's DEPRECATED_SPECIAL_TOKENS order
  EXPECT_EQ(tok.token_to_id("[TOOL_CONTENT]"), 19);
  EXPECT_EQ(tok.token_to_id("<SPECIAL_20>"), 20);
  EXPECT_FALSE(tok.token_to_id(byte_level_encode(vocab[256 + 10])).has_value());
}

// The texts mistral-common 1.13.1 gives (encode_chat_completion(...).text, ValidationMode.finetuning).
TEST(Tekken, ChatFormatsRenderAsMistralCommon) {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Ciao  "}])");  // (an assistant's trailing spaces: mistral-common drops them)
  const nlohmann::ordered_json with_system = msgs;
  const auto render = [](const std::string& version, const nlohmann::ordered_json& m) {
    ChatTemplate tmpl(mistral_chat_template(version, "tekken.json"));
    tmpl.set_special_tokens("<s>", "</s>");
    return tmpl.render(nlohmann::ordered_json{{"messages", m}});
  };
  // (v3 puts the system prompt before the last user message, so a conversation's earlier turns with it are no prefix
  // of the whole, which the turns' masks are found by: refused; mistral-common gives "<s>[INST]Hi there[/INST]
  // Hello!</s>[INST]Be brief.\n\nBye[/INST]Ciao</s>")
  EXPECT_THROW(render("v3", msgs), UserError);
  auto one_turn = msgs;
  one_turn.erase(3), one_turn.erase(3);
  EXPECT_EQ(render("v3", one_turn), "<s>[INST]Be brief.\n\nHi there[/INST]Hello!</s>");
  msgs.erase(0);
  EXPECT_EQ(render("v3", msgs), "<s>[INST]Hi there[/INST]Hello!</s>[INST]Bye[/INST]Ciao</s>");
  for (const char* v : {"v7", "v11", "v13"})
    EXPECT_EQ(render(v, with_system),
              "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi there[/INST]Hello!</s>[INST]Bye[/INST]Ciao</s>");
  const auto chunks = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t1"}, {"type": "thinking", "thinking": "t2"},
                                      {"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}])");
  EXPECT_EQ(render("v13", chunks),
            "<s>[SYSTEM_PROMPT]s1\n\ns2[/SYSTEM_PROMPT][INST]u[/INST][THINK]t1[/THINK][THINK]t2[/THINK]b\n\nc</s>");
  // (mistral-common: "Think not implemented for tokenizer < V13.")
  EXPECT_THROW(render("v11", chunks), UserError);
  EXPECT_THROW(mistral_chat_template("v15", "tekken.json"), UserError);
}

TEST(Tekken, AMalformedFileIsOneLineNamingIt) {
  TempDir t;
  json j = tekken_json(random_vocab(4, 3), "\\S+", "v7", 8, true);
  j["config"]["default_vocab_size"] = "many";
  write_text(t.path / "tekken.json", j.dump());
  try {
    convert_tekken(t.path / "tekken.json");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), (t.path / "tekken.json").string() + ": config.default_vocab_size is not a count");
  }
  j["config"]["default_vocab_size"] = 300, j["config"]["version"] = 7;
  write_text(t.path / "tekken.json", j.dump());
  EXPECT_THROW(convert_tekken(t.path / "tekken.json"), UserError);
}

TEST(Tekken, TheKeyWithoutATekkenFileIsOneLine) {
  TempDir t;
  fs::create_directories(t.path / "model");
  write_text(t.path / "data.jsonl", "{\"text\": \"hello\"}\n");
  write_text(t.path / "cfg.yaml",
             "model: model\ndatasets:\n  - path: data.jsonl\n    type: completion\nsequence_len: 32\n"
             "tokenizer_use_mistral_common: true\noutput_dir: out\n");
  const CliRun r = run("tokenize cfg.yaml --quiet", t);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: tokenizer_use_mistral_common: model has no tekken.json\n");
}

}  // namespace
}  // namespace soltrain::test
