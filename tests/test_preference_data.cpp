// Preference records (data/preference.h): each shape gives the same prompt and answers, rendered through the
// chat template with only the answer trained; truncation cuts the prompt's start first, then the answer's end;
// unusable records are BadRecords with a reason.
#include <nlohmann/json.hpp>

#include "cli/demo_kit.h"
#include "data/preference.h"
#include "test_util.h"

namespace soltrain {
namespace {

using nlohmann::ordered_json;

struct Encoded {
  std::vector<int32_t> prompt, chosen, rejected;  // the chosen / rejected documents' trained ids
  std::vector<int32_t> chosen_doc;
};

class PreferenceData : public ::testing::Test {
 protected:
  void SetUp() override {
    write_byte_tokenizer(t.path);
    tok.emplace(Tokenizer::load(t.path / "tokenizer.json"));
    tmpl.emplace(ChatTemplate::from_tokenizer_config(t.path / "tokenizer_config.json"));
  }
  Encoded encode(const std::string& record, PreferenceFormat f = PreferenceFormat::kAuto, int64_t seq_len = 256,
                 int64_t max_prompt = 0) {
    PreferenceEncoder enc(*tok, *tmpl, seq_len, max_prompt);
    const auto [c, r] = enc.encode(to_preference_sample(ordered_json::parse(record), f, DatasetFields{}));
    Encoded e;
    e.chosen_doc = c.ids;
    for (size_t i = 0; i < c.ids.size(); ++i) (c.mask[i] ? e.chosen : e.prompt).push_back(c.ids[i]);
    for (size_t i = 0; i < r.ids.size(); ++i)
      if (r.mask[i]) e.rejected.push_back(r.ids[i]);
    EXPECT_EQ(std::vector<int32_t>(r.ids.begin(), r.ids.begin() + std::ptrdiff_t(e.prompt.size())), e.prompt)
        << "both answers follow the same prompt";
    return e;
  }
  std::vector<int32_t> ids(const std::string& s) { return tok->encode(s); }
  test::TempDir t;
  std::optional<Tokenizer> tok;
  std::optional<ChatTemplate> tmpl;
};

TEST_F(PreferenceData, EveryShapeRendersThePromptAndTrainsOnlyTheAnswer) {
  const Encoded want = encode(R"({"prompt": "abc", "chosen": "cba", "rejected": "cbb"})");
  EXPECT_EQ(want.prompt, ids("<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(want.chosen, ids("cba<|im_end|>\n"));
  EXPECT_EQ(want.rejected, ids("cbb<|im_end|>\n"));
  // TRL's conversational form, with the prompt implicit (the shared first messages) or given
  for (const char* rec :
       {R"({"chosen": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}],
            "rejected": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cbb"}]})",
        R"({"prompt": [{"role": "user", "content": "abc"}], "chosen": [{"role": "assistant", "content": "cba"}],
            "rejected": [{"role": "assistant", "content": "cbb"}]})",
        // HuggingFaceH4/ultrafeedback_binarized: a text `prompt` beside whole conversations is left out (TRL's
        // maybe_extract_prompt), the shared first messages are the prompt
        R"({"prompt": "abc", "chosen": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}],
            "rejected": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cbb"}],
            "score_chosen": 8.0, "score_rejected": 3.0})",
        // Axolotl's chat_template.default: the prompt messages and one message per answer
        R"({"messages": [{"role": "user", "content": "abc"}], "chosen": {"role": "assistant", "content": "cba"},
            "rejected": {"role": "assistant", "content": "cbb"}})"}) {
    const Encoded e = encode(rec);
    EXPECT_EQ(e.chosen_doc, want.chosen_doc) << rec;
    EXPECT_EQ(e.rejected, want.rejected) << rec;
  }
  // Axolotl's chatml.argilla (instruction, chosen_response, rejected_response) and chatml.ultra (prompt, the
  // conversations' second messages)
  for (
      const auto& [rec, type] : std::vector<std::pair<std::string, std::string>>{
          {R"({"instruction": "abc", "chosen_response": "cba", "rejected_response": "cbb"})", "chatml.argilla"},
          {R"({"prompt": "abc", "chosen": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}],
                "rejected": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cbb"}]})",
           "chatml.ultra"}}) {
    const Encoded e = encode(rec, *find_preference_format(type));
    EXPECT_EQ(e.chosen_doc, want.chosen_doc) << type;
    EXPECT_EQ(e.rejected, want.rejected) << type;
  }
  // Axolotl's chatml.icr: system and input
  const Encoded icr = encode(R"({"system": "be brief", "input": "abc", "chosen": "cba", "rejected": "cbb"})",
                             *find_preference_format("chatml.icr"));
  EXPECT_EQ(icr.prompt, ids("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nabc<|im_end|>\n"
                            "<|im_start|>assistant\n"));
  EXPECT_EQ(icr.chosen, want.chosen);
  // Axolotl's chatml.intel: system and question
  const Encoded intel = encode(R"({"system": "be brief", "question": "abc", "chosen": "cba", "rejected": "cbb"})");
  EXPECT_EQ(intel.prompt, ids("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nabc<|im_end|>\n"
                              "<|im_start|>assistant\n"));
  EXPECT_EQ(intel.chosen, want.chosen);
}

TEST_F(PreferenceData, TruncationCutsThePromptStartThenTheAnswerEnd) {
  const std::string rec = R"({"prompt": "abcdefghij", "chosen": "jihgfedcba", "rejected": "x"})";
  const Encoded full = encode(rec);
  const Encoded cut = encode(rec, PreferenceFormat::kAuto, 256, 8);
  ASSERT_EQ(cut.prompt.size(), 8u);
  EXPECT_TRUE(std::equal(cut.prompt.begin(), cut.prompt.end(), full.prompt.end() - 8)) << "keeps the prompt's end";
  const Encoded tight = encode(rec, PreferenceFormat::kAuto, 8 + 4, 8);
  EXPECT_EQ(tight.chosen, std::vector<int32_t>(full.chosen.begin(), full.chosen.begin() + 4));
}

TEST_F(PreferenceData, UnusableRecordsSayWhy) {
  auto reason = [&](const std::string& rec, int64_t seq_len = 256) -> std::string {
    try {
      encode(rec, PreferenceFormat::kAuto, seq_len);
    } catch (const BadRecord& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(reason(R"({"prompt": "abc", "chosen": "cba"})"), "no \"rejected\" field");
  EXPECT_EQ(reason(R"({"prompt": "abc", "chosen": "", "rejected": "x"})"), "the chosen answer is empty");
  EXPECT_NE(reason(R"({"prompt": "abcdefghijklmnop", "chosen": "a", "rejected": "b"})", 20).find("no room"),
            std::string::npos);
  EXPECT_EQ(reason(R"({"chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant",
                 "content": "b"}]})"),
            "chosen and rejected share no prompt message");
}

// Axolotl's ORPO argilla rows: chosen / rejected whole conversations; the prompt is the chosen one before its last
// message (after an optional system field).
TEST_F(PreferenceData, ArgillaConversationsSplitAtTheirLastMessage) {
  const Encoded want = encode(R"({"prompt": "abc", "chosen": "cba", "rejected": "cbb"})");
  const Encoded e = encode(R"({"prompt": "abc", "chosen": [{"role": "user", "content": "abc"}, {"role": "assistant",
      "content": "cba"}], "rejected": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cbb"}]})",
                           PreferenceFormat::kArgillaChat);
  EXPECT_EQ(e.chosen_doc, want.chosen_doc);
  EXPECT_EQ(e.rejected, want.rejected);
}

// KTO's unpaired records: TRL's prompt / completion / label and Axolotl's KTO shapes (ultra: prompt and system;
// argilla: instruction; intel: question; argilla_chat: the conversation in `completion`) all give the same
// document, the completion trained; the label is a boolean (or 0 / 1); missing fields say which.
TEST_F(PreferenceData, UnpairedRecordsOfEveryShape) {
  PreferenceEncoder enc(*tok, *tmpl, 256, 0);
  auto doc = [&](const std::string& rec, bool* desirable = nullptr) {
    const UnpairedSample u = to_unpaired_sample(ordered_json::parse(rec), DatasetFields{});
    if (desirable) *desirable = u.desirable;
    return enc.encode(u);
  };
  const Encoded want = encode(R"({"prompt": "abc", "chosen": "cba", "rejected": "cbb"})");
  bool good = false;
  const Document d = doc(R"({"prompt": "abc", "completion": "cba", "label": true})", &good);
  EXPECT_TRUE(good);
  EXPECT_EQ(d.ids, want.chosen_doc);
  std::vector<int32_t> trained;
  for (size_t i = 0; i < d.ids.size(); ++i)
    if (d.mask[i]) trained.push_back(d.ids[i]);
  EXPECT_EQ(trained, want.chosen);
  for (const char* rec : {R"({"instruction": "abc", "completion": "cba", "label": 0})",
                          R"({"question": "abc", "completion": [{"role": "assistant", "content": "cba"}], "label": 0})",
                          R"({"prompt": [{"role": "user", "content": "abc"}], "completion": "cba", "label": false})",
                          R"({"completion": [{"role": "user", "content": "abc"}, {"role": "assistant",
                              "content": "cba"}], "label": false})"}) {
    good = true;
    EXPECT_EQ(doc(rec, &good).ids, want.chosen_doc) << rec;
    EXPECT_FALSE(good) << rec;
  }
  const Document sys = doc(R"({"system": "be brief", "prompt": "abc", "completion": "cba", "label": true})");
  EXPECT_EQ(sys.ids, ids("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nabc<|im_end|>\n"
                         "<|im_start|>assistant\ncba<|im_end|>\n"));
  auto reason = [&](const std::string& rec) -> std::string {
    try {
      doc(rec);
    } catch (const BadRecord& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(reason(R"({"prompt": "abc", "completion": "cba"})"), "no \"label\" field");
  EXPECT_EQ(reason(R"({"prompt": "abc", "completion": "cba", "label": "yes"})"), "\"label\" is not true or false");
  EXPECT_EQ(reason(R"({"prompt": "abc", "label": true})"), "no \"completion\" field");
  EXPECT_EQ(reason(R"({"prompt": "abc", "completion": "", "label": true})"), "the completion answer is empty");
  EXPECT_TRUE(is_unpaired_format("llama3.ultra") && is_unpaired_format("chatml.argilla") &&
              is_unpaired_format("auto") && !is_unpaired_format("chatml.intel.x") &&
              !is_unpaired_format("chat_template.default"));
}

}  // namespace
}  // namespace soltrain
