// Stop strings (tokenizer/stop_strings.h) on the real Qwen3 tokenizer, whose tokens hold several characters:
// a row ends exactly at the first token after which the decoded text holds a stop string, whether the string
// lies inside one token, spans several, or ends inside a token with text after it (transformers'
// StopStringCriteria's cases); never at a later token; and far into a long row (the window). Generation ends
// there too: greedy rows of a random model equal the unstopped ones cut at that token (python/tests has the
// comparison with transformers' generate(stop_strings=...)).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "cli/demo_kit.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "test_util.h"
#include "tokenizer/stop_strings.h"

namespace soltrain {
namespace {

const Tokenizer& qwen3() {
  static const Tokenizer tok = [] {
    const char* env = std::getenv("SOLTRAIN_TOKENIZERS");
    return Tokenizer::load(std::filesystem::path(env ? env : SOLTRAIN_TOKENIZERS) / "qwen3");
  }();
  return tok;
}

// The first prefix length after which decode(ids[0, n)) holds `s` (0: never): what a stop must give.
size_t first_completion(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& s) {
  for (size_t n = 1; n <= ids.size(); ++n)
    if (tok.decode(std::span(ids).first(n)).find(s) != std::string::npos) return n;
  return 0;
}

// Occurrences of `s` in `t`, overlapping ones too.
size_t occurrences(const std::string& t, const std::string& s) {
  size_t n = 0;
  for (size_t at = t.find(s); at != std::string::npos; at = t.find(s, at + 1)) ++n;
  return n;
}

// completed_by_last after each prefix of the text's tokens: true exactly where the decoded text gains an
// occurrence, the first of which is where a row ends.
void expect_stops_exactly_at_first_completion(const std::string& text, const std::string& stop) {
  SCOPED_TRACE("\"" + stop + "\" in \"" + text.substr(0, 60) + "\"");
  const Tokenizer& tok = qwen3();
  const std::vector<int32_t> ids = const_cast<Tokenizer&>(tok).encode(text);
  const size_t want = first_completion(tok, ids, stop);
  ASSERT_GT(want, 0u) << "the stop string is not in the text: the case tests nothing";
  const StopStrings s(tok, {"never-there", stop});
  for (size_t n = 1; n <= ids.size(); ++n) {
    const bool gained = occurrences(tok.decode(std::span(ids).first(n)), stop) >
                        occurrences(tok.decode(std::span(ids).first(n - 1)), stop);
    EXPECT_EQ(s.completed_by_last(std::span(ids).first(n)), gained) << "after token " << n;
    if (n < want) EXPECT_FALSE(gained);
  }
  EXPECT_TRUE(s.completed_by_last(std::span(ids).first(want)));
}

TEST(StopStrings, EndAtTheTokenCompletingTheString) {
  // inside one token, across a word boundary (overhang both ends), ending inside a longer token
  expect_stops_exactly_at_first_completion("The answer is 42, and then some more words follow.", "answer");
  expect_stops_exactly_at_first_completion("The answer is 42, and then some more words follow.", "r is 4");
  expect_stops_exactly_at_first_completion("Let me think about unstoppable forces here.", "stop");
  expect_stops_exactly_at_first_completion("</think>\n\nThe result: \\boxed{7}. Done.", "}.");
  // several occurrences: the first one ends a row; each later one is again completed by its last token
  expect_stops_exactly_at_first_completion("a stop b stop c stop", " stop");
  // far into a long row: only the last tokens are decoded per check
  std::string lng;
  for (int i = 0; i < 120; ++i) lng += "lorem ipsum dolor " + std::to_string(i) + " ";
  expect_stops_exactly_at_first_completion(lng + "END OF TEXT", "OF TEXT");
  // multi-byte characters (a token may end inside one)
  expect_stops_exactly_at_first_completion("温度是二十五度，结束。然后继续", "结束");
}

TEST(StopStrings, EmptyStringIsRefused) {
  try {
    StopStrings s(qwen3(), {"ok", ""}, "stop_strings");
    ADD_FAILURE() << "an empty stop string was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("stop_strings: an empty stop string"), std::string::npos) << e.what();
  }
}

// Generation: greedy rows with a stop string equal the rows without it, cut at the token completing it (kept);
// the cut rows count as terminated, the others as before.
TEST(StopStrings, GenerationEndsThere) {
  test::TempDir t;
  DemoModelShape shape;
  shape.hidden = 64, shape.layers = 2, shape.heads = 2, shape.kv_heads = 1, shape.head_dim = 32,
  shape.intermediate = 128;
  write_random_model(t.path / "model", shape, 5);
  const Tokenizer tok = Tokenizer::load(t.path / "model");  // the demo's byte tokenizer: one byte a token
  auto ops = make_cpu_ops();
  auto model = load_pretrained(t.path / "model", *ops);
  const std::vector<std::vector<int32_t>> prompts = {{104, 101, 108}, {119, 111}};
  GenerationOptions o;
  o.max_new_tokens = 24;
  KvDecoder d1(*model, 2, 64, 64, false);
  const std::vector<Rollout> free = generate_groups(d1, prompts, 1, o);
  // A stop string from row 0's own text, two tokens starting at its 6th: row 0 must end by its 7th token.
  const std::string text0 = tok.decode(free[0].tokens);
  ASSERT_GE(text0.size(), 8u);
  const std::string stop = text0.substr(5, 2);
  const StopStrings s(tok, {stop});
  o.stop_after = [&s](std::span<const int32_t> row) { return s.completed_by_last(row); };
  KvDecoder d2(*model, 2, 64, 64, false);
  const std::vector<Rollout> cut = generate_groups(d2, prompts, 1, o);
  int ended = 0;
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const size_t n = first_completion(tok, free[r].tokens, stop);
    if (n == 0) {
      EXPECT_EQ(cut[r].tokens, free[r].tokens);
      EXPECT_FALSE(cut[r].stop_string);
      continue;
    }
    ++ended;
    EXPECT_EQ(cut[r].tokens, std::vector<int32_t>(free[r].tokens.begin(), free[r].tokens.begin() + long(n)));
    EXPECT_TRUE(cut[r].terminated && cut[r].stop_string);
  }
  EXPECT_GE(ended, 1);
  EXPECT_LE(cut[0].tokens.size(), 7u);
}

}  // namespace
}  // namespace soltrain
