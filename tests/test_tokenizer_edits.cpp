// tokenizer/tokenizer_edits.h: the ids HF tokenizers' AddedVocabulary gives added tokens (its add_tokens rule: a
// vocabulary token keeps its id, a new one takes the next id past the model's
// vocabulary and the added tokens; one already added is ignored), Axolotl's overrides and the one-line refusals.
// Checked against transformers live in python/tests/test_added_tokens.py.
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_edits.h"

namespace soltrain {
namespace {

using nlohmann::json;

// A byte-free BPE with `n` single-letter tokens (a, b, c, ...) and the given added tokens.
json tokenizer_json(int n, json added) {
  json vocab = json::object();
  for (int i = 0; i < n; ++i) vocab[std::string(1, char('a' + i))] = i;
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

json added_token(int id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

std::string error_of(const std::function<void()>& f) {
  return test::user_error_text(f);
}

TEST(TokenizerEdits, NewTokensTakeTheIdsHfTokenizersGives) {
  TokenizerEdits e;
  e.special = {{"eos_token", "<eot>"}, {"pad_token", "<s>"}};
  e.tokens = {"<tool>", "b", "<s>"};
  const json tj = tokenizer_json(5, json::array({added_token(5, "<s>", true), added_token(6, "</s>", true)}));
  const EditedTokenizer out = edit_tokenizer(tj, json{{"eos_token", "</s>"}}, e, "t");
  // <eot> past the added tokens (7), <tool> next (8); b keeps its vocabulary id; <s> is already added (5)
  ASSERT_EQ(out.added.size(), 2u);
  EXPECT_EQ(out.added[0], (std::pair<std::string, int32_t>("<eot>", 7)));
  EXPECT_EQ(out.added[1], (std::pair<std::string, int32_t>("<tool>", 8)));
  const json& added = out.tokenizer["added_tokens"];
  std::vector<int> ids;
  for (const json& a : added) ids.push_back(a["id"].get<int>());
  EXPECT_EQ(ids, (std::vector<int>{1, 5, 6, 7, 8}));  // sorted by id, as tokenizers serialises them
  EXPECT_EQ(added[0]["content"], "b");
  EXPECT_EQ(added[0]["special"], false);
  EXPECT_EQ(added[1]["special"], true);  // <s> re-added by `tokens`: unchanged (tokenizers ignores it)
  EXPECT_EQ(out.config["eos_token"], "<eot>");
  EXPECT_EQ(out.config["pad_token"], "<s>");
  EXPECT_EQ(out.config["added_tokens_decoder"]["7"]["content"], "<eot>");
  EXPECT_EQ(out.config["added_tokens_decoder"]["7"]["special"], true);
  EXPECT_EQ(out.length, 9);  // a..e, <s>, </s>, <eot>, <tool>
  // the edited file is one the tokenizer reads, matching the new tokens whole
  Tokenizer tok = Tokenizer::from_json(out.tokenizer);
  EXPECT_EQ(tok.encode("a<tool>c<eot>"), (std::vector<int32_t>{0, 8, 2, 7}));
}

TEST(TokenizerEdits, AddedTokensBelowTheVocabularyStartNewOnesPastIt) {
  TokenizerEdits e;
  e.tokens = {"<x>"};
  // an added token numbered inside the vocabulary's range (2 < 5): the next new id is the vocabulary's size
  const json tj = tokenizer_json(5, json::array({added_token(2, "c", true)}));
  EXPECT_EQ(edit_tokenizer(tj, json::object(), e, "t").added.at(0).second, 5);
  EXPECT_EQ(edit_tokenizer(tokenizer_json(5, json::array()), json::object(), e, "t").added.at(0).second, 5);
}

TEST(TokenizerEdits, OverridesRenameAddedTokensAndRefuseOthers) {
  TokenizerEdits e;
  e.overrides = {{6, "<think>"}};
  const json tj = tokenizer_json(5, json::array({added_token(5, "<s>", true), added_token(6, "<r1>", true)}));
  const json cfg = {{"added_tokens_decoder", {{"6", {{"content", "<r1>"}, {"special", true}}}}}};
  const EditedTokenizer out = edit_tokenizer(tj, cfg, e, "t");
  EXPECT_EQ(out.tokenizer["added_tokens"][1]["content"], "<think>");
  EXPECT_EQ(out.config["added_tokens_decoder"]["6"]["content"], "<think>");
  e.overrides = {{3, "<think>"}};
  EXPECT_EQ(error_of([&] { edit_tokenizer(tj, json::object(), e, "t"); }),
            "t: added_tokens_overrides: 3 is not an added token of tokenizer.json");
}

TEST(TokenizerEdits, RefusalsAreOneLine) {
  TokenizerEdits e;
  e.special = {{"eot_token", "<eot>"}};
  const json tj = tokenizer_json(5, json::array({added_token(5, "<s>", true)}));
  EXPECT_EQ(error_of([&] { edit_tokenizer(tj, json::object(), e, "t"); }),
            "special_tokens: eot_token: not a special-token role (bos_token, eos_token, unk_token, pad_token, "
            "sep_token, cls_token, mask_token, additional_special_tokens)");
  // a BOS the post_processor puts before every text: the role changes, the post_processor not (as transformers 5)
  json llama = tj;
  llama["post_processor"] = {{"type", "TemplateProcessing"},
                             {"single", json::array()},
                             {"pair", json::array()},
                             {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {5}}, {"tokens", {"<s>"}}}}}}};
  e.special = {{"bos_token", "<bos>"}};
  const EditedTokenizer moved = edit_tokenizer(llama, json{{"bos_token", "<s>"}}, e, "t");
  EXPECT_EQ(moved.config["bos_token"], "<bos>");
  EXPECT_EQ(moved.tokenizer["post_processor"], llama["post_processor"]);
  EXPECT_EQ(moved.notes,
            std::vector<std::string>{"special_tokens: bos_token \"<bos>\": tokenizer.json's post_processor "
                                     "still puts \"<s>\" before every text, as transformers 5 (and so "
                                     "Axolotl) leaves it"});
  e.special = {{"bos_token", "<s>"}};  // the same BOS: nothing changes
  EXPECT_EQ(error_of([&] { edit_tokenizer(llama, json{{"bos_token", "<s>"}}, e, "t"); }), "no error");
}

}  // namespace
}  // namespace soltrain
