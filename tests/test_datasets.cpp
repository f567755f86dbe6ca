// Dataset formats (text, instruction, conversation in both styles, auto-detection), bad records with
// file:line under both policies, and the tokenize job's shards: contents, reuse and invalidation.
#include <gtest/gtest.h>

#include <sstream>

#include "data/dataset.h"
#include "data/record_reader.h"
#include "data/sample_encoder.h"
#include "data/shards.h"
#include "data/tokenize_job.h"
#include "data_test_util.h"
#include "io/sha256.h"
#include "test_util.h"

namespace soltrain {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

// Every record of a file, converted with the type detected from the first one (as tokenize does).
std::vector<Sample> read_all(const fs::path& p, DatasetType type = DatasetType::kAuto, DatasetFields f = {}) {
  RecordReader r(p);
  std::vector<Sample> out;
  ordered_json rec;
  std::string where, error;
  while (r.next(rec, where, error)) {
    EXPECT_EQ(error, "") << where;
    if (type == DatasetType::kAuto) type = detect_auto(rec, f);
    out.push_back(to_sample(rec, type, f));
  }
  return out;
}

TEST(Datasets, TextAutoDetectedAndCustomField) {
  test::TempDir t;
  test::write_text(t.path / "a.jsonl", "{\"text\": \"hello\"}\n\n{\"text\": \"world\", \"meta\": 1}\n");
  auto s = read_all(t.path / "a.jsonl");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(s[0].is_text);
  EXPECT_EQ(s[1].text, "world");
  test::write_text(t.path / "b.json", "[{\"body\": \"x\"}, {\"body\": \"y\"}]");
  DatasetFields f;
  f.text = "body";
  s = read_all(t.path / "b.json", DatasetType::kAuto, f);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].text, "y");
}

TEST(Datasets, InstructionBecomesUserAndAssistantTurns) {
  test::TempDir t;
  test::write_text(t.path / "a.jsonl",
                   "{\"instruction\": \"Translate\", \"input\": \"chat\", \"output\": \"cat\"}\n"
                   "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
                   "{\"instruction\": \"No input key\", \"output\": \"ok\"}\n");
  auto s = read_all(t.path / "a.jsonl");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].vars["messages"].dump(),
            R"([{"role":"user","content":"Translate\nchat"},{"role":"assistant","content":"cat"}])");
  EXPECT_EQ(s[1].vars["messages"][0]["content"], "Say hi");
  EXPECT_EQ(s[2].vars["messages"][1]["content"], "ok");
}

// `type: alpaca` is Axolotl's prompt as plain text (not the chat template); the response follows it.
TEST(Datasets, AlpacaIsAxolotlsPromptWithAndWithoutInput) {
  test::TempDir t;
  test::write_text(t.path / "a.jsonl",
                   "{\"instruction\": \"Translate\", \"input\": \"chat\", \"output\": \"cat\"}\n"
                   "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n");
  auto s = read_all(t.path / "a.jsonl", *find_dataset_type("alpaca"));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(s[0].is_text);
  const std::string with_input =
      "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
      "response that appropriately completes the request.\n\n### Instruction:\nTranslate\n\n### Input:\nchat\n\n"
      "### Response:\n";
  EXPECT_EQ(s[0].text, with_input + "cat");
  EXPECT_EQ(s[0].prompt_chars, with_input.size());
  const std::string no_input =
      "Below is an instruction that describes a task. Write a response that appropriately completes the request."
      "\n\n### Instruction:\nSay hi\n\n### Response:\n";
  EXPECT_EQ(s[1].text, no_input + "hi");
  EXPECT_EQ(s[1].prompt_chars, no_input.size());
  EXPECT_EQ(to_string(*find_dataset_type("alpaca")), "alpaca");
}

TEST(Datasets, ConversationOpenAIKeepsExtraKeysAndToolsInOrder) {
  test::TempDir t;
  test::write_text(
      t.path / "a.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, )"
      R"("tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": 2}}}]}], )"
      R"("tools": [{"name": "f"}]})"
      "\n");
  auto s = read_all(t.path / "a.jsonl");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_FALSE(s[0].is_text);
  EXPECT_EQ(s[0].vars["messages"][1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":1,"a":2})");
  EXPECT_EQ(s[0].vars["tools"].dump(), R"([{"name":"f"}])");
}

TEST(Datasets, ConversationShareGPTRolesMappedAndSystemPromptPrepended) {
  test::TempDir t;
  test::write_text(t.path / "a.json",
                   R"([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},)"
                   R"( {"conversations": [{"from": "system", "value": "own"}, {"from": "human", "value": "q"}]}])");
  DatasetFields f;
  f.system_prompt = "Be brief.";
  auto s = read_all(t.path / "a.json", DatasetType::kConversation, f);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].vars["messages"].dump(), R"([{"role":"system","content":"Be brief."},{"role":"user","content":"q"},)"
                                          R"({"role":"assistant","content":"a"}])");
  EXPECT_EQ(s[1].vars["messages"][0]["content"], "own");  // a record's own system message wins
  f.roles["bot"] = "assistant";
  test::write_text(t.path / "b.jsonl", R"({"conversations": [{"from": "bot", "value": "x"}]})");
  EXPECT_EQ(read_all(t.path / "b.jsonl", DatasetType::kAuto, f)[0].vars["messages"][1]["role"], "assistant");
}

TEST(Datasets, MissingFileAndUndetectableTypeAreClear) {
  try {
    RecordReader r("/nonexistent/data.jsonl");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/data.jsonl: dataset file not found");
  }
  DatasetFields f;
  EXPECT_THROW(detect_auto(ordered_json{{"prompt", "x"}}, f), BadRecord);
}

// One bad record of each kind; the message names the file and line and why.
struct BadCase {
  std::string line, why;
};

const std::vector<BadCase> kBadCases = {
    {"{not json", "not valid JSON"},
    {R"({"messages": [{"role": "user"}]})", "message 0: missing field \"content\""},
    {R"({"messages": "hi"})", "field \"messages\" is string, expected an array"},
    {R"({"messages": []})", "empty conversation"},
    {R"({"messages": [{"role": "wizard", "content": "x"}]})", "message 0: unknown role \"wizard\""},
    {R"({"messages": [{"role": "user", "content": 3}]})", "field \"content\" is number, expected a string"},
    {R"({"conversations": [{"from": "alien", "value": "x"}]})", "unknown role \"alien\""},
};

TokenizeOptions options(const fs::path& data, const fs::path& out) {
  TokenizeOptions o;
  o.tokenizer = test::tokenizer_folder("qwen3");
  o.sources = {{data, DatasetType::kAuto}};
  o.out = out;
  o.progress = false;
  return o;
}

const char* kGood = R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})";

TEST(Datasets, EveryBadRecordIsErrorWithFileAndLine) {
  test::TempDir t;
  for (const BadCase& c : kBadCases) {
    test::write_text(t.path / "d.jsonl", std::string(kGood) + "\n\n" + c.line + "\n" + kGood + "\n");
    std::ostringstream log;
    try {
      run_tokenize(options(t.path / "d.jsonl", t.path / "out"), log);
      ADD_FAILURE() << "no error for " << c.line;
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind((t.path / "d.jsonl").string() + ":3: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(c.why), std::string::npos) << msg;
    }
    EXPECT_FALSE(fs::exists(t.path / "out")) << "nothing written on error";
  }
}

TEST(Datasets, BadRecordsSkippedAndCounted) {
  test::TempDir t;
  std::string data = std::string(kGood) + "\n";
  for (const BadCase& c : kBadCases) data += c.line + "\n";
  test::write_text(t.path / "d.jsonl", data + kGood + "\n");
  TokenizeOptions o = options(t.path / "d.jsonl", t.path / "out");
  o.bad_records = BadRecordPolicy::kSkip;
  std::ostringstream log;
  const TokenizeResult r = run_tokenize(o, log);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.skipped, int64_t(kBadCases.size()));
  EXPECT_NE(log.str().find("skipped 7 bad records (first: " + (t.path / "d.jsonl").string() + ":2: not valid JSON"),
            std::string::npos)
      << log.str();
}

TEST(Datasets, TextDocumentsEndWithEosAndTrainEverywhere) {
  test::TempDir t;
  test::write_text(t.path / "d.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"Second\"}\n");
  std::ostringstream log;
  run_tokenize(options(t.path / "d.jsonl", t.path / "out"), log);
  const ShardSet s = load_shards(t.path / "out");
  Tokenizer tok = Tokenizer::load(test::tokenizer_folder("qwen3"));
  std::vector<int32_t> want = tok.encode("Hello world");
  const int32_t eos = *tok.token_to_id(read_eos_token(test::tokenizer_folder("qwen3") / "tokenizer_config.json"));
  want.push_back(eos);
  const std::vector<int32_t> second = tok.encode("Second");
  ASSERT_EQ(s.documents(), 2);
  EXPECT_EQ(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.doc_offsets[1]), want);
  EXPECT_EQ(s.doc_offsets[2] - s.doc_offsets[1], int64_t(second.size() + 1));
  EXPECT_EQ(s.tokens.back(), eos);
  EXPECT_EQ(std::count(s.mask.begin(), s.mask.end(), 1), int64_t(s.tokens.size()));
}

TEST(Datasets, ShardsReusedUntilInputOrSettingsChange) {
  test::TempDir t;
  test::write_text(t.path / "d.jsonl", std::string(kGood) + "\n");
  const TokenizeOptions o = options(t.path / "d.jsonl", t.path / "out");
  std::ostringstream log1, log2, log3, log4;
  EXPECT_FALSE(run_tokenize(o, log1).reused);
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(t.path / "out" / "manifest.json"));
  EXPECT_EQ(m["key"]["inputs"][0]["sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(m["key"]["inputs"][0]["size"], fs::file_size(t.path / "d.jsonl"));
  EXPECT_EQ(m["key"]["tokenizer"]["tokenizer.json"].get<std::string>().size(), 64u);
  EXPECT_TRUE(run_tokenize(o, log2).reused);
  EXPECT_NE(log2.str().find("is up to date"), std::string::npos) << log2.str();

  test::write_text(t.path / "d.jsonl", std::string(kGood) + "\n" + kGood + "\n");
  const TokenizeResult changed = run_tokenize(o, log3);
  EXPECT_FALSE(changed.reused);
  EXPECT_EQ(changed.documents, 2);
  EXPECT_EQ(load_shards(t.path / "out").documents(), 2);

  TokenizeOptions o2 = o;
  o2.train_on_inputs = true;
  EXPECT_FALSE(run_tokenize(o2, log4).reused);
}

TEST(Shards, SplitAtTheTokenLimitAndLoadBackInOrder) {
  test::TempDir t;
  ShardWriter w(t.path, 5);
  w.add({{1, 2, 3}, {1, 1, 1}});
  w.add({{4, 5}, {0, 1}});
  w.add({{6, 7, 8, 9}, {1, 0, 1, 0}});
  const auto shards = w.finish();
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].tokens, 5);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : shards) list.push_back({{"name", s.name}, {"tokens", s.tokens}, {"documents", s.documents}});
  test::write_text(t.path / "manifest.json", nlohmann::json{{"version", kShardFormatVersion}, {"shards", list}}.dump());
  const ShardSet s = load_shards(t.path);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(s.mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 0, 1, 0}));
  EXPECT_EQ(s.doc_offsets, (std::vector<int64_t>{0, 3, 5, 9}));
  fs::resize_file(t.path / "shard-00001.tokens", 4);
  EXPECT_THROW(load_shards(t.path), UserError);
}

}  // namespace
}  // namespace soltrain

namespace soltrain {
namespace {

// FIPS 180-4 example values, and a file hashed across block boundaries.
TEST(Sha256, KnownAnswers) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  test::TempDir t;
  test::write_text(t.path / "a", std::string(1000000, 'a'));
  EXPECT_EQ(sha256_file(t.path / "a"), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_NE(sha256_file_edges(t.path / "a", 1000), sha256_file(t.path / "a"));
}

}  // namespace
}  // namespace soltrain
