// The peers' dataset types, string for string and mask for mask against what their source does: Axolotl's
// alpaca_chat and input_output, chat_template's roles_to_train / train_on_eos / field_system, Surogate's
// instruction prompt and system_prompt_type, and the config keys that choose them.
#include <gtest/gtest.h>

#include <algorithm>

#include "chat_test_util.h"
#include "cli/config.h"
#include "data/dataset.h"
#include "data/named_templates.h"
#include "data/sample_encoder.h"
#include "data/shards.h"
#include "data/tokenize_job.h"
#include "data_test_util.h"
#include "test_util.h"

namespace soltrain {
namespace {

using nlohmann::ordered_json;

Sample sample(const std::string& record, const std::string& type, const DatasetFields& f = {}) {
  return to_sample(ordered_json::parse(record), *find_dataset_type(type), f);
}

// Axolotl src/axolotl/prompters.py, AlpacaPrompter with PromptStyle.CHAT ("chat"), as alpaca_chat.py loads it.
TEST(DatasetTypes, AlpacaChatIsAxolotlsChatStylePrompt) {
  const Sample with = sample(R"({"instruction": "Translate", "input": "chat", "output": "cat"})", "alpaca_chat");
  const std::string p1 =
      "SYSTEM: Below is an instruction that describes a task, paired with an input that provides further context. "
      "Write a response that appropriately completes the request.\nUSER: Translate\nchat\nASSISTANT:";
  EXPECT_TRUE(with.is_text);
  EXPECT_EQ(with.text, p1 + "cat");
  EXPECT_EQ(with.prompt_chars, p1.size());
  const Sample without = sample(R"({"instruction": "Say hi", "output": "hi"})", "alpaca_chat");
  const std::string p2 =
      "SYSTEM: Below is an instruction that describes a task. Write a response that appropriately completes the "
      "request.\nUSER: Say hi\nASSISTANT:";
  EXPECT_EQ(without.text, p2 + "hi");
  EXPECT_EQ(without.prompt_chars, p2.size());
}

// Surogate surogate/core/datasets/preprocessor/instruction.py: "{instruction}\n{input}", the instruction alone
// without input; system_prompt_type: field takes the record's column, and no system message where it is null.
TEST(DatasetTypes, SurogateInstructionPromptAndSystemField) {
  DatasetFields f;
  f.system = "sys";
  const Sample s =
      sample(R"({"instruction": "Translate", "input": "chat", "output": "cat", "sys": "Be brief."})", "instruction", f);
  EXPECT_EQ(s.vars["messages"].dump(),
            R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Translate\nchat"},)"
            R"({"role":"assistant","content":"cat"}])");
  const Sample none = sample(R"({"instruction": "Hi", "output": "Hello", "sys": null})", "instruction", f);
  EXPECT_EQ(none.vars["messages"].size(), 2u);
  // field_system on a conversation: the record's system message, not passed on as a template variable.
  const Sample c = sample(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],)"
                          R"( "sys": "S"})",
                          "chat_template", f);
  EXPECT_EQ(c.vars["messages"][0].dump(), R"({"role":"system","content":"S"})");
  EXPECT_FALSE(c.vars.contains("sys"));
}

TEST(DatasetTypes, SystemPromptTypeAndChatTemplateKeysInConfigs) {
  const std::string base = "model: m\noutput_dir: o\ndatasets:\n  - path: d.jsonl\n    type: instruction\n";
  TrainConfig c = parse_train_config(base +
                                         "    system_prompt_type: field\n    system_prompt_field: sys\n"
                                         "    system_prompt: ignored\n    samples: 10\n    split: train\n",
                                     "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.datasets[0].fields.system, "sys");
  EXPECT_EQ(c.datasets[0].fields.system_prompt, "");
  EXPECT_EQ(c.datasets[0].samples, 10);
  EXPECT_EQ(c.datasets[0].split, "train");
  c = parse_train_config(base + "    system_prompt_type: fixed\n    system_prompt_field: sys\n    system_prompt: S\n",
                         "cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.datasets[0].fields.system, "");
  EXPECT_EQ(c.datasets[0].fields.system_prompt, "S");
  const std::string chat = "model: m\noutput_dir: o\ndatasets:\n  - path: d.jsonl\n    type: chat_template\n";
  c = parse_train_config(chat +
                             "    field_messages: conv\n    message_property_mappings: {role: from, content: value}\n"
                             "    roles: {user: [human]}\n    roles_to_train: [human, assistant]\n"
                             "    train_on_eos: all\n    field_system: sys\n    chat_template: tokenizer_default\n",
                         "cfg.yaml", {}, TrainMode::kSft);
  const DatasetFields& f = c.datasets[0].fields;
  EXPECT_EQ(f.messages, "conv");
  EXPECT_EQ(f.role, "from");
  EXPECT_EQ(f.content, "value");
  EXPECT_EQ(f.roles_to_train, (std::vector<std::string>{"user", "assistant"}));
  EXPECT_EQ(f.train_on_eos, "all");
  EXPECT_EQ(f.system, "sys");
  // Axolotl's chat_template takes a record's "system" field unless field_system names another; Surogate's
  // conversation type has no such default.
  EXPECT_EQ(parse_train_config(chat, "cfg.yaml", {}, TrainMode::kSft).datasets[0].fields.system, "system");
  const std::string conv = "model: m\noutput_dir: o\ndatasets:\n  - path: d.jsonl\n    type: conversation\n";
  EXPECT_EQ(parse_train_config(conv, "cfg.yaml", {}, TrainMode::kSft).datasets[0].fields.system, "");
  auto error_of = [&](const std::string& extra) {
    try {
      parse_train_config(chat + extra, "cfg.yaml", {}, TrainMode::kSft);
      return std::string("no error");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(error_of("    chat_template: llama2\n"),
            "cfg.yaml:6: chat_template: \"llama2\": not a template soltrain has; use tokenizer_default (the model's "
            "own), jinja (with chat_template_jinja) or one of chatml, llama3, qwen3, qwen_25");
  EXPECT_EQ(parse_train_config(chat + "    chat_template: llama3\n", "cfg.yaml", {}, TrainMode::kSft)
                .datasets[0]
                .fields.chat_template,
            "llama3");
  EXPECT_EQ(parse_train_config(chat + "    chat_template: chatml\n", "cfg.yaml", {}, TrainMode::kSft)
                .datasets[0]
                .fields.chat_template,
            "chatml");
  EXPECT_EQ(parse_train_config(chat + "chat_template: chatml\n", "cfg.yaml", {}, TrainMode::kSft).chat_template,
            "chatml");
  EXPECT_EQ(error_of("chat_template: phi_3\n"),
            "cfg.yaml:6: chat_template: \"phi_3\": not a template soltrain has; use tokenizer_default (the model's "
            "own) or one of chatml, llama3, qwen3, qwen_25");
  EXPECT_EQ(error_of("    train_on_eos: sometimes\n"),
            "cfg.yaml:6: train_on_eos: \"sometimes\" is not valid: expected turn, all, none or last");
  EXPECT_EQ(error_of("    roles_to_train: [wizard]\n"),
            "cfg.yaml:6: roles_to_train: \"wizard\" is not a role: expected user, assistant, system or tool");
  EXPECT_EQ(error_of("    system_prompt_type: field\n"),
            "cfg.yaml:6: system_prompt_type: field needs system_prompt_field");
}

std::vector<std::string> runs(const std::string& name, const std::string& messages, std::vector<std::string> roles,
                              const std::string& eos) {
  test::ChatModel& m = test::chat_model(name);
  SampleEncoder enc(m.tok, &m.tmpl, m.tmpl.eos_token(), false);
  enc.set_turn_training(std::move(roles), eos);
  Sample s;
  s.vars["messages"] = ordered_json::parse(messages);
  const Document d = enc.encode(s);
  EXPECT_EQ(d.ids, m.tok.encode(m.tmpl.render(s.vars))) << "ids are those of the whole rendered text";
  return test::trained_runs(m, d);
}

const char* kChat = R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},)"
                    R"( {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"},)"
                    R"( {"role": "assistant", "content": "6"}])";

// Axolotl prompt_strategies/chat_template.py: a trained turn's content (find_turn: what differs from the
// turn with dummy content), and the eos token right after a turn: after trained turns (turn), after every
// turn (all), never (none), after the last turn only (last).
TEST(DatasetTypes, RolesToTrainAndTrainOnEosQwen3) {
  using V = std::vector<std::string>;
  EXPECT_EQ(runs("qwen3", kChat, {"assistant"}, "turn"), (V{"4<|im_end|>", "<think>\n\n</think>\n\n6<|im_end|>"}));
  EXPECT_EQ(runs("qwen3", kChat, {"assistant"}, "none"), (V{"4", "<think>\n\n</think>\n\n6"}));
  EXPECT_EQ(runs("qwen3", kChat, {"assistant"}, "last"), (V{"4", "<think>\n\n</think>\n\n6<|im_end|>"}));
  EXPECT_EQ(runs("qwen3", kChat, {"assistant"}, "all"),
            (V{"<|im_end|>", "<|im_end|>", "4<|im_end|>", "<|im_end|>", "<think>\n\n</think>\n\n6<|im_end|>"}));
  EXPECT_EQ(runs("qwen3", kChat, {"user", "assistant"}, "turn"),
            (V{"What is 2+2?<|im_end|>", "4<|im_end|>", "And 3+3?<|im_end|>", "<think>\n\n</think>\n\n6<|im_end|>"}));
  EXPECT_EQ(runs("qwen3", kChat, {"system"}, "none"), (V{"Be brief."}));
}

TEST(DatasetTypes, RolesToTrainLlama3) {
  using V = std::vector<std::string>;
  EXPECT_EQ(runs("llama3", kChat, {"user", "assistant"}, "turn"),
            (V{"What is 2+2?<|eot_id|>", "4<|eot_id|>", "And 3+3?<|eot_id|>", "6<|eot_id|>"}));
  EXPECT_EQ(runs("llama3", kChat, {"user"}, "none"), (V{"What is 2+2?", "And 3+3?"}));
}

// A user turn given as a list of content chunks (OpenAI's / mistral-common's form) cannot be found in the rendered
// text by its content: training it (roles_to_train: user) is refused for that record in one line, not with a JSON
// library's type error; the assistant's turns, found by the template's prompts, train as usual.
TEST(DatasetTypes, RolesToTrainOverChunkListContentIsOneLine) {
  const char* chunks = R"([{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},)"
                       R"( {"role": "assistant", "content": "4"}])";
  test::ChatModel& m = test::chat_model("qwen3");
  // ChatML whose turns may be chunk lists (as mistral-common's formats render them: the chunks' text joined)
  const ChatTemplate chunked(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for c in m.content %}{{ c.text }}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  SampleEncoder enc(m.tok, &chunked, "<|im_end|>", false);
  enc.set_turn_training({"user", "assistant"}, "turn");
  Sample s;
  s.vars["messages"] = ordered_json::parse(chunks);
  try {
    enc.encode(s);
    ADD_FAILURE() << "no error";
  } catch (const BadRecord& e) {
    EXPECT_STREQ(e.what(),
                 "message 0: a user turn whose content is a list of chunks cannot be trained by roles_to_train (only "
                 "the assistant's; give the turn's content as one string)");
  }
}

// Axolotl prompt_strategies/input_output.py: each segment tokenized alone (no special tokens, no eos
// appended), trained where its label is true.
TEST(DatasetTypes, InputOutputSegmentsTokenizedAloneWithTheirLabels) {
  test::ChatModel& m = test::chat_model("qwen3");
  const Sample s = sample(R"j({"segments": [{"label": false, "text": "Q: 2+2?\n"}, {"label": true, "text": "A: 4"},)j"
                          R"j( {"label": false, "text": " (end)"}]})j",
                          "input_output");
  SampleEncoder enc(m.tok, nullptr, m.tmpl.eos_token(), false);
  const Document d = enc.encode(s);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (const auto& [text, label] :
       std::vector<std::pair<std::string, bool>>{{"Q: 2+2?\n", false}, {"A: 4", true}, {" (end)", false}}) {
    const auto t = m.tok.encode(text);
    ids.insert(ids.end(), t.begin(), t.end());
    mask.insert(mask.end(), t.size(), label);
  }
  EXPECT_EQ(d.ids, ids);
  EXPECT_EQ(d.mask, mask);
  EXPECT_THROW(sample(R"({"segments": [{"text": "x"}]})", "input_output"), BadRecord);
  EXPECT_THROW(sample(R"({"segments": []})", "input_output"), BadRecord);
}

// chat_template: chatml renders ChatML (Axolotl's chatml: "<|im_start|>{role}\n{content}<|im_end|>\n" per turn)
// in place of the model's own template, through the tokenize job; the assistant turn and <|im_end|> are trained.
TEST(DatasetTypes, ChatmlTemplateByName) {
  test::TempDir t;
  test::write_text(
      t.path / "d.jsonl",
      R"({"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]})"
      "\n");
  TokenizeOptions o;
  o.tokenizer = test::tokenizer_folder("qwen3");
  o.sources = {{t.path / "d.jsonl", DatasetType::kConversation}};
  o.out = t.path / "out";
  o.progress = false;
  o.fields.chat_template = "chatml";
  std::ostringstream log;
  run_tokenize(o, log);
  const ShardSet s = load_shards(o.out);
  test::ChatModel& m = test::chat_model("qwen3");
  const std::string prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> head = m.tok.encode(prompt), answer = m.tok.encode("4<|im_end|>"),
                             tail = m.tok.encode("\n");
  std::vector<int32_t> ids = head;
  ids.insert(ids.end(), answer.begin(), answer.end());
  ids.insert(ids.end(), tail.begin(), tail.end());
  EXPECT_EQ(s.tokens, ids);
  std::vector<uint8_t> mask(head.size(), 0);
  mask.insert(mask.end(), answer.size(), 1);
  mask.insert(mask.end(), tail.size(), 0);
  EXPECT_EQ(s.mask, mask);
  EXPECT_FALSE(named_chat_template("llama2"));
}

// Axolotl's InstructionPromptTokenizingStrategy (src/axolotl/prompt_tokenizers.py): prompt and response are
// tokenized apart; the prompt is untrained, the response and the eos token are trained.
TEST(DatasetTypes, AlpacaChatPromptAndResponseTokenizedApart) {
  test::ChatModel& m = test::chat_model("qwen3");
  const Sample s = sample(R"({"instruction": "Translate", "input": "chat", "output": "cat"})", "alpaca_chat");
  SampleEncoder enc(m.tok, nullptr, m.tmpl.eos_token(), false);
  const Document d = enc.encode(s);
  const std::vector<int32_t> prompt = m.tok.encode(std::string_view(s.text).substr(0, s.prompt_chars));
  std::vector<int32_t> want = prompt, response = m.tok.encode("cat");
  response.push_back(*m.tok.token_to_id(m.tmpl.eos_token()));
  want.insert(want.end(), response.begin(), response.end());
  EXPECT_EQ(d.ids, want);
  std::vector<uint8_t> mask(prompt.size(), 0);
  mask.insert(mask.end(), response.size(), 1);
  EXPECT_EQ(d.mask, mask);
  // Whole, a text can tokenize differently at the edge: "ASSISTANT:" + "//x" would be one "://" token.
  const Sample url = sample(R"({"instruction": "Scheme?", "output": "//x"})", "alpaca_chat");
  const Document du = enc.encode(url);
  std::vector<int32_t> whole = m.tok.encode(url.text);
  whole.push_back(*m.tok.token_to_id(m.tmpl.eos_token()));
  EXPECT_NE(du.ids, whole);
  EXPECT_EQ(m.tok.decode(std::vector<int32_t>(du.ids.end() - 3, du.ids.end())), "//x<|im_end|>");
  // A response that already ends with the eos token gets no second one.
  const Sample e = sample(R"({"instruction": "x", "output": "y<|im_end|>"})", "alpaca_chat");
  const Document de = enc.encode(e);
  EXPECT_EQ(std::count(de.ids.begin(), de.ids.end(), *m.tok.token_to_id("<|im_end|>")), 1);
}

// Axolotl's user-defined prompt (prompt_strategies/user_defined.py, alpaca_w_system.py SystemDataPrompter): the
// system_format when a system text is given (the record's field, else system_prompt), then format, or no_input_format
// when the input is empty; the output follows as alpaca's response. Python's str.format: {{ }} are braces.
TEST(DatasetTypes, UserDefinedTypeIsAxolotlsFormatString) {
  const std::string base = "model: m\noutput_dir: o\ndatasets:\n  - path: d.jsonl\n    type:\n";
  const TrainConfig c = parse_train_config(
      base +
          "      field_instruction: q\n      field_output: a\n      system_prompt: Be brief.\n"
          "      system_format: \"<<{system}>>\\n\"\n      format: \"Q: {instruction} [{input}] {{x}}\\nA: \"\n"
          "      no_input_format: \"Q: {instruction}\\nA: \"\n",
      "cfg.yaml", {}, TrainMode::kSft);
  const DatasetFields& f = c.datasets[0].fields;
  ASSERT_EQ(c.datasets[0].type, DatasetType::kUserDefined);
  const Sample with =
      to_sample(ordered_json::parse(R"({"q": "Add", "input": "1 2", "a": "3"})"), DatasetType::kUserDefined, f);
  EXPECT_EQ(with.text, "<<Be brief.>>\nQ: Add [1 2] {x}\nA: 3");
  EXPECT_EQ(with.text.substr(0, with.prompt_chars), "<<Be brief.>>\nQ: Add [1 2] {x}\nA: ");
  const Sample own =
      to_sample(ordered_json::parse(R"({"q": "Add", "a": "3", "system": "Terse."})"), DatasetType::kUserDefined, f);
  EXPECT_EQ(own.text, "<<Terse.>>\nQ: Add\nA: 3");
  const Sample none =
      to_sample(ordered_json::parse(R"({"q": "Add", "a": "3", "system": ""})"), DatasetType::kUserDefined, f);
  EXPECT_EQ(none.text, "Q: Add\nA: 3");  // (an empty system text: no system_format)
  // Axolotl's defaults: "{instruction} {input} " / "{instruction} ", fields instruction, input, output, system
  const TrainConfig d = parse_train_config(base + "      system_prompt: \"\"\n", "cfg.yaml", {}, TrainMode::kSft);
  const Sample plain = to_sample(ordered_json::parse(R"({"instruction": "Add", "input": "1 2", "output": "3"})"),
                                 DatasetType::kUserDefined, d.datasets[0].fields);
  EXPECT_EQ(plain.text, "Add 1 2 3");
  const std::string bad = test::user_error_text([&] {
    parse_train_config(base + "      format: \"{instruction} {question}\"\n", "cfg.yaml", {}, TrainMode::kSft);
  });
  EXPECT_NE(bad.find("{question} in \"{instruction} {question}\" (this format takes {input}, {instruction})"),
            std::string::npos)
      << bad;
}

}  // namespace
}  // namespace soltrain
