// The peers' data rules soltrain follows: Surogate's `type: auto` (its AutoPreprocessor's columns),
// Hugging Face's split slices (`train[:20%]`), Surogate's completion_field and Axolotl's
// dataset_exact_deduplication.
#include <gtest/gtest.h>

#include "cli/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "train/train_data.h"

namespace soltrain {
namespace {

using nlohmann::ordered_json;

// The messages `type: auto` makes of one record (its type and fields detected from the record itself).
std::string auto_messages(const std::string& record) {
  const ordered_json r = ordered_json::parse(record);
  DatasetFields f;
  const DatasetType t = detect_auto(r, f);
  const Sample s = to_sample(r, t, f);
  return s.is_text ? "text: " + s.text : s.vars["messages"].dump();
}

TEST(SurogateAuto, QueryAndResponseColumns) {
  // GSM8K's columns: question → user, answer → assistant.
  EXPECT_EQ(auto_messages(R"({"question": "1+1?", "answer": "2"})"),
            R"([{"role":"user","content":"1+1?"},{"role":"assistant","content":"2"}])");
  // Column names match in any case; system_prompt is the system message.
  EXPECT_EQ(auto_messages(R"({"Problem": "p", "Solution": "s", "system_prompt": "Be exact."})"),
            R"([{"role":"system","content":"Be exact."},{"role":"user","content":"p"},)"
            R"({"role":"assistant","content":"s"}])");
  // A list of answers trains on the first (ResponsePreprocessor's default).
  EXPECT_EQ(auto_messages(R"({"prompt": "p", "answers": ["a", "b"]})"),
            R"([{"role":"user","content":"p"},{"role":"assistant","content":"a"}])");
  // `text` is a response next to a query ...
  EXPECT_EQ(auto_messages(R"({"prompt": "p", "text": "t"})"),
            R"([{"role":"user","content":"p"},{"role":"assistant","content":"t"}])");
  // ... and a text document alone (where Surogate would make it a lone assistant turn).
  EXPECT_EQ(auto_messages(R"({"text": "t"})"), "text: t");
}

// Surogate's safe_rename_columns: two candidates for one side rename neither, unless one is the target name.
TEST(SurogateAuto, TwoCandidatesForOneSideTakeNeither) {
  EXPECT_THROW(auto_messages(R"({"prompt": "p", "question": "q", "answer": "a"})"), BadRecord);
  EXPECT_EQ(auto_messages(R"({"query": "q", "prompt": "p", "answer": "a"})"),
            R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"}])");
  EXPECT_THROW(auto_messages(R"({"question": "q"})"), BadRecord);  // no response column
  try {
    auto_messages(R"({"question": "q", "answer": "a", "solution": "s"})");
    FAIL();
  } catch (const BadRecord& e) {
    EXPECT_NE(std::string(e.what()).find("no response (response, answer"), std::string::npos) << e.what();
  }
}

TEST(SurogateAuto, MessagesAndAlpacaColumns) {
  // "conversation" (singular) with ShareGPT's from/value, told apart by the first message.
  EXPECT_EQ(auto_messages(R"({"conversation": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})"),
            R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])");
  EXPECT_EQ(auto_messages(R"({"messages": [{"role": "user", "content": "hi"}], "system": "S"})"),
            R"([{"role":"system","content":"S"},{"role":"user","content":"hi"}])");
  // instruction and input: Alpaca, the user turn "{instruction}\n{input}".
  EXPECT_EQ(auto_messages(R"({"instruction": "Reverse", "input": "ab", "output": "ba"})"),
            R"([{"role":"user","content":"Reverse\nab"},{"role":"assistant","content":"ba"}])");
}

// Surogate's conversation completion_field: the completion message(s) follow the prompt's.
TEST(SurogateAuto, CompletionFieldAppendsMessages) {
  DatasetFields f;
  f.messages = "prompt";
  f.completion = "completion";
  const auto list = ordered_json::parse(
      R"({"prompt": [{"role": "user", "content": "ab"}], "completion": [{"role": "assistant", "content": "ba"}]})");
  EXPECT_EQ(to_sample(list, DatasetType::kConversation, f).vars["messages"].dump(),
            R"([{"role":"user","content":"ab"},{"role":"assistant","content":"ba"}])");
  const auto one = ordered_json::parse(
      R"({"prompt": [{"role": "user", "content": "ab"}], "completion": {"role": "assistant", "content": "ba"}})");
  EXPECT_EQ(to_sample(one, DatasetType::kConversation, f).vars["messages"].size(), 2u);
  const auto bad = ordered_json::parse(R"({"prompt": [{"role": "user", "content": "ab"}], "completion": "ba"})");
  EXPECT_THROW(to_sample(bad, DatasetType::kConversation, f), BadRecord);
}

ShardSet documents(int n) {
  ShardSet s;
  for (int d = 0; d < n; ++d) {
    s.tokens.push_back(d);
    s.mask.push_back(1);
    s.doc_offsets.push_back(int64_t(s.tokens.size()));
  }
  return s;
}

std::vector<int32_t> slice(int n, const std::string& from, const std::string& to) {
  return slice_documents(documents(n), {from, to}).tokens;
}

// datasets' ReadInstruction, rounding "closest": round(p * n / 100), negative bounds from the end.
TEST(SplitSlice, AsHuggingFaceDatasets) {
  EXPECT_EQ(slice(40, "", "20%"), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(slice(10, "-3", ""), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(slice(10, "2", "-6"), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(slice(10, "95%", ""), (std::vector<int32_t>{}));      // round(9.5) = 10 (halves to even)
  EXPECT_EQ(slice(10, "85%", ""), (std::vector<int32_t>{8, 9}));  // round(8.5) = 8
  EXPECT_EQ(slice(10, "", "100"), slice(10, "", ""));             // clamped
}

TEST(SplitSlice, ConfigSyntax) {
  const std::string head = "model: m\noutput_dir: o\ndatasets:\n  - path: d.jsonl\n    split: ";
  const TrainConfig c = parse_train_config(head + "train[:20%]\n", "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.datasets[0].split, "train");
  ASSERT_TRUE(c.datasets[0].slice);
  EXPECT_EQ(*c.datasets[0].slice, (std::pair<std::string, std::string>{"", "20%"}));
  EXPECT_FALSE(parse_train_config(head + "test\n", "cfg.yaml", {}, TrainMode::kSft).datasets[0].slice);
  for (const char* bad : {"train[20%]", "train[:x]", "x[]", "train[:5", "train[1:2:3]"}) try {
      parse_train_config(head + bad + "\n", "cfg.yaml", {}, TrainMode::kSft);
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("cfg.yaml:5: split: \"") + bad +
                                           "\" is not valid: expected a split name, optionally sliced as "
                                           "name[from:to] (e.g. train[:20%], train[10:-10])");
    }
}

TEST(ExactDeduplication, KeepsTheFirstOfEqualDocuments) {
  ShardSet s;
  // Documents: [1 2] [1 2] [1 2 (mask differs)] [3] [1 2]
  s.tokens = {1, 2, 1, 2, 1, 2, 3, 1, 2};
  s.mask = {0, 1, 0, 1, 1, 1, 1, 0, 1};
  s.doc_offsets = {0, 2, 4, 6, 7, 9};
  EXPECT_EQ(drop_duplicate_documents(s, nullptr), 2);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 1, 2, 3}));
  EXPECT_EQ(s.doc_offsets, (std::vector<int64_t>{0, 2, 4, 5}));
  ShardSet val;  // [3] is in the training data, [4] is not
  val.tokens = {3, 4};
  val.mask = {1, 1};
  val.doc_offsets = {0, 1, 2};
  EXPECT_EQ(drop_duplicate_documents(val, &s), 1);
  EXPECT_EQ(val.tokens, (std::vector<int32_t>{4}));
}

// Preference pairs (two documents each) deduplicated as wholes: a pair equal in both answers is dropped, one that
// shares only its chosen answer is kept.
TEST(ExactDeduplication, PairsAreComparedWhole) {
  ShardSet s;
  // Pairs: ([1] [2]) ([1] [2]) ([1] [3]) ([1] [2])
  s.tokens = {1, 2, 1, 2, 1, 3, 1, 2};
  s.mask = {1, 1, 1, 1, 1, 1, 1, 1};
  s.doc_offsets = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(drop_duplicate_documents(s, nullptr, 2), 2);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 1, 3}));
  EXPECT_EQ(s.doc_offsets, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// Axolotl's min_sample_len: documents of fewer tokens are dropped (its filter keeps len >= min), the rest kept in
// order with their masks.
TEST(MinSampleLen, DropsTheShorterDocuments) {
  ShardSet s;
  // Documents: [1 2 3] [4] [5 6] [7 8 9 10]
  s.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  s.mask = {0, 1, 1, 1, 0, 1, 1, 1, 0, 1};
  s.doc_offsets = {0, 3, 4, 6, 10};
  EXPECT_EQ(drop_short_documents(s, 3), 2);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3, 7, 8, 9, 10}));
  EXPECT_EQ(s.mask, (std::vector<uint8_t>{0, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(s.doc_offsets, (std::vector<int64_t>{0, 3, 7}));
  EXPECT_EQ(drop_short_documents(s, 1), 0);
}

}  // namespace
}  // namespace soltrain
