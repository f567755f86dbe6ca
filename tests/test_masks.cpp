// Loss masks from the rendered Qwen3 and Llama 3 templates: exactly the assistant turns and their
// end-of-turn tokens are trained, and the masked ids are the ids of the whole rendered text.
#include <gtest/gtest.h>

#include "chat_test_util.h"
#include "data/sample_encoder.h"
#include "data_test_util.h"

namespace soltrain {
namespace {

using nlohmann::ordered_json;

Sample conversation(const std::string& messages_json, ordered_json extra = ordered_json::object()) {
  Sample s;
  s.vars = extra;
  s.vars["messages"] = ordered_json::parse(messages_json);
  return s;
}

Document encode(test::ChatModel& m, const Sample& s, bool train_on_inputs = false) {
  SampleEncoder enc(m.tok, &m.tmpl, m.tmpl.eos_token(), train_on_inputs);
  Document d = enc.encode(s);
  EXPECT_EQ(d.ids, m.tok.encode(m.tmpl.render(s.vars))) << "ids are those of the whole rendered text";
  return d;
}

const char* kTwoTurns = R"([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},)"
                        R"( {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}])";

TEST(Masks, Qwen3SingleTurnMatchesFixtureIds) {
  test::ChatModel& m = test::chat_model("qwen3");
  const Document d = encode(m, conversation(R"([{"role": "user", "content": "What is 2+2?"},)"
                                            R"( {"role": "assistant", "content": "4"}])"));
  // ids from transformers (tests/fixtures/tokenizer/qwen3_chat.json entry 0).
  const std::vector<int32_t> want = {151644, 872,    198,   3838, 374,    220, 17,     10,  17, 30,     151645,
                                     198,    151644, 77091, 198,  151667, 271, 151668, 271, 19, 151645, 198};
  ASSERT_EQ(d.ids, want);
  // Trained: what the model writes after "<|im_start|>assistant\n" (the template's empty think block,
  // the answer) and <|im_end|>; not the "\n" after it.
  const std::vector<uint8_t> mask = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0};
  EXPECT_EQ(d.mask, mask);
}

TEST(Masks, Qwen3MultiTurnEarlierTurnsWithoutThinkBlock) {
  test::ChatModel& m = test::chat_model("qwen3");
  const Document d = encode(m, conversation(kTwoTurns));
  EXPECT_EQ(test::trained_runs(m, d), (std::vector<std::string>{"4<|im_end|>", "<think>\n\n</think>\n\n6<|im_end|>"}));
}

TEST(Masks, Qwen3SystemToolCallsAndThinkingOff) {
  test::ChatModel& m = test::chat_model("qwen3");
  const Document d =
      encode(m, conversation(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},)"
                             R"( {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":)"
                             R"( {"name": "get_weather", "arguments": {"city": "Paris"}}}]},)"
                             R"( {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}])",
                             ordered_json{{"enable_thinking", false}}));
  const auto runs = test::trained_runs(m, d);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>");
  // With thinking off the empty think block is part of the generation prompt: prompt, not trained.
  EXPECT_EQ(runs[1], "Sunny.<|im_end|>");
}

TEST(Masks, Llama3AssistantContentAndEotOnly) {
  test::ChatModel& m = test::chat_model("llama3");
  const Document d = encode(m, conversation(kTwoTurns));
  EXPECT_EQ(test::trained_runs(m, d), (std::vector<std::string>{"4<|eot_id|>", "6<|eot_id|>"}));
  const int32_t eot = *m.tok.token_to_id("<|eot_id|>");
  // This template always ends with an assistant header (a generation prompt): prompt, not trained.
  EXPECT_EQ(m.tok.decode(std::vector<int32_t>(d.ids.end() - 4, d.ids.end())),
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(std::count(d.mask.end() - 4, d.mask.end(), 1), 0);
  EXPECT_EQ(std::count(d.ids.begin(), d.ids.end(), eot), 4);  // two user and two assistant turns
  // The header before each answer is prompt.
  const int32_t header_end = *m.tok.token_to_id("<|end_header_id|>");
  for (size_t i = 0; i < d.ids.size(); ++i) {
    if (d.ids[i] == header_end) {
      EXPECT_EQ(d.mask[i], 0);
    }
  }
}

TEST(Masks, TrainOnInputsTrainsEverything) {
  test::ChatModel& m = test::chat_model("llama3");
  const Document d = encode(m, conversation(kTwoTurns), true);
  EXPECT_EQ(std::count(d.mask.begin(), d.mask.end(), 1), int64_t(d.ids.size()));
}

// Alpaca: the prompt's tokens are not trained, the response and the eos token are (Axolotl's masking).
TEST(Masks, AlpacaTrainsTheResponseAndEos) {
  test::ChatModel& m = test::chat_model("qwen3");
  Sample s;
  s.is_text = true;
  const std::string prompt = alpaca_prompt("Say hi", "");
  s.text = prompt + "Hello there";
  s.prompt_chars = prompt.size();
  SampleEncoder enc(m.tok, &m.tmpl, m.tmpl.eos_token(), false);
  const Document d = enc.encode(s);
  std::vector<int32_t> want = m.tok.encode(s.text);
  want.push_back(*m.tok.token_to_id(m.tmpl.eos_token()));
  EXPECT_EQ(d.ids, want);
  EXPECT_EQ(test::trained_runs(m, d), (std::vector<std::string>{"Hello there" + m.tmpl.eos_token()}));
  SampleEncoder all(m.tok, &m.tmpl, m.tmpl.eos_token(), true);
  const Document a = all.encode(s);
  EXPECT_EQ(std::count(a.mask.begin(), a.mask.end(), 1), int64_t(a.ids.size()));
}

TEST(Masks, TemplateErrorIsABadRecord) {
  test::ChatModel& m = test::chat_model("qwen3");
  SampleEncoder enc(m.tok, &m.tmpl, "", false);
  // Qwen3's template raises when no user query exists.
  EXPECT_THROW(enc.encode(conversation(R"([{"role": "assistant", "content": "x"}])")), BadRecord);
}

}  // namespace
}  // namespace soltrain
