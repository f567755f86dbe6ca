// Generation on the CPU: the KV-cache decoder reproduces the training forward's logits (token by token, in
// prefill chunks, batched, with a LoRA adapter), greedy decoding equals re-running the full forward, EOS, and
// the `soltrain generate` command's errors (sampling itself: test_sampling.cpp).
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <set>

#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "model/checkpoint.h"
#include "model/generation.h"
#include "model/lora.h"
#include "model/peft_adapter.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

std::filesystem::path model_dir(const std::string& name) {
  return fixtures() / "models" / name;
}

std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(vocab));
  return ids;
}

// Logits [rows*T, V] of the training forward on `ids` (rows × T, one document per row).
std::vector<float> full_logits(Transformer& m, const std::vector<int32_t>& ids, int rows) {
  const int T = int(ids.size()) / rows;
  HostBatch b{rows, T, ids, std::vector<int32_t>(ids.size(), -100), {}, {}, {}, {}, {}, {}, {}};
  m.plan(rows, T);
  std::vector<float> logits(ids.size() * size_t(m.config().vocab_size));
  m.step(b, false, logits.data());
  return logits;
}

double row_err(const std::vector<float>& got, const std::vector<float>& want, int64_t row, int64_t V) {
  return rel_err(got.data(), want.data() + row * V, size_t(V));
}

// Token by token, and as prefill chunks (max_chunk 4 splits a 7-token prefill) followed by single steps.
void expect_decoder_matches_forward(Transformer& m) {
  const int T = 13, V = m.config().vocab_size;
  const auto ids = random_ids(T, V, 7);
  const auto ref = full_logits(m, ids, 1);
  std::vector<float> last(static_cast<size_t>(V));
  KvDecoder one(m, 1, T, 4);
  for (int t = 0; t < T; ++t) {
    one.feed(std::span(ids).subspan(size_t(t), 1), 1, last.data());
    EXPECT_LE(row_err(last, ref, t, V), 1e-5) << "token by token, position " << t;
  }
  EXPECT_EQ(one.length(), T);
  KvDecoder pre(m, 1, T, 4);
  const int P = 7;
  std::vector<float> all(size_t(P) * size_t(V));
  pre.feed(std::span(ids).first(P), P, last.data(), all.data());
  for (int t = 0; t < P; ++t)
    EXPECT_LE(rel_err(all.data() + t * V, ref.data() + t * V, size_t(V)), 1e-5) << "prefill position " << t;
  EXPECT_LE(row_err(last, ref, P - 1, V), 1e-5) << "prefill last";
  for (int t = P; t < T; ++t) {
    pre.feed(std::span(ids).subspan(size_t(t), 1), 1, last.data());
    EXPECT_LE(row_err(last, ref, t, V), 1e-5) << "after prefill, position " << t;
  }
  EXPECT_THROW(pre.feed(std::span(ids).first(1), 1, last.data()), UserError) << "cache overflow";
}

class DecoderVsForward : public ::testing::TestWithParam<const char*> {};

TEST_P(DecoderVsForward, LogitsEqualTrainingForward) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  expect_decoder_matches_forward(*m);
}

TEST_P(DecoderVsForward, BatchedSequencesEqualTrainingForward) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  const int T = 9, V = m->config().vocab_size;
  const auto ids = random_ids(2 * T, V, 11);
  const auto ref = full_logits(*m, ids, 2);
  KvDecoder d(*m, 2, T, 8);
  std::vector<float> last(2 * size_t(V));
  const int P = 5;
  std::vector<int32_t> chunk;
  for (int b = 0; b < 2; ++b) chunk.insert(chunk.end(), ids.begin() + b * T, ids.begin() + b * T + P);
  d.feed(chunk, P, last.data());
  for (int t = P; t < T; ++t) {
    for (int b = 0; b < 2; ++b)
      EXPECT_LE(rel_err(last.data() + b * V, ref.data() + (b * T + t - 1) * V, size_t(V)), 1e-5)
          << "row " << b << " position " << t - 1;
    const std::vector<int32_t> step{ids[size_t(t)], ids[size_t(T + t)]};
    d.feed(step, 1, last.data());
  }
  for (int b = 0; b < 2; ++b)
    EXPECT_LE(rel_err(last.data() + b * V, ref.data() + (b * T + T - 1) * V, size_t(V)), 1e-5) << "row " << b;
}

TEST_P(DecoderVsForward, GreedyEqualsArgmaxOfFullForward) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  const int V = m->config().vocab_size, steps = 8;
  std::vector<int32_t> seq = random_ids(5, V, 3);
  KvDecoder d(*m, 1, int(seq.size()) + steps, 16);
  const auto got = generate(d, seq, GenerationOptions{steps, {}, {}});
  ASSERT_EQ(int(got.size()), steps);
  for (int i = 0; i < steps; ++i) {
    const auto logits = full_logits(*m, seq, 1);
    const int32_t want = argmax(std::span(logits).subspan((seq.size() - 1) * size_t(V), size_t(V)));
    EXPECT_EQ(got[size_t(i)], want) << "step " << i;
    seq.push_back(want);
  }
}

// Rows at different lengths (prompts of 3, 8 and 5 tokens fed row by row, one copied to another row): every
// row's logits equal the training forward of its own sequence at each step, and group rollouts equal batch-1
// generation of each prompt (greedy), the group's rows alike.
TEST_P(DecoderVsForward, RowsOfDifferentLengthsEqualTrainingForward) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  const int V = m->config().vocab_size, steps = 4;
  const std::vector<int> lens{3, 8, 5};
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < lens.size(); ++i) seqs.push_back(random_ids(lens[i] + steps, V, 20 + uint32_t(i)));
  KvDecoder d(*m, 4, 8 + steps, 2);  // max_chunk 2: the 8-token prompt is split (a row takes 2 x 4 per chunk)
  std::vector<float> last(4 * size_t(V));
  for (int r = 0; r < 3; ++r) d.feed_row(r, std::span(seqs[size_t(r)]).first(size_t(lens[size_t(r)])), last.data());
  d.copy_row(1, 3);  // row 3: the second sequence again
  seqs.push_back(seqs[1]);
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> next;
    for (int r = 0; r < 4; ++r) next.push_back(seqs[size_t(r)][size_t(d.length(r))]);
    d.feed(next, 1, last.data());
    for (int r = 0; r < 4; ++r) {
      const int n = d.length(r);
      const auto ref = full_logits(*m, std::vector<int32_t>(seqs[size_t(r)].begin(), seqs[size_t(r)].begin() + n), 1);
      EXPECT_LE(rel_err(last.data() + r * V, ref.data() + size_t(n - 1) * size_t(V), size_t(V)), 1e-5)
          << "row " << r << " at length " << n;
    }
  }
  EXPECT_EQ(d.length(0), 3 + steps);
  EXPECT_EQ(d.length(3), 8 + steps);

  const std::vector<std::vector<int32_t>> prompts{random_ids(6, V, 31), random_ids(2, V, 32)};
  const GenerationOptions greedy{5, {}, {}};
  KvDecoder g(*m, 6, 6 + 5, 4);
  const std::vector<Rollout> got = generate_groups(g, prompts, 3, greedy);
  ASSERT_EQ(got.size(), 6u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    KvDecoder one(*m, 1, 6 + 5, 4);
    const auto want = generate(one, prompts[p], greedy);
    for (size_t r = p * 3; r < p * 3 + 3; ++r) {
      EXPECT_EQ(got[r].tokens, want) << "prompt " << p << " row " << r;
      EXPECT_FALSE(got[r].terminated);
    }
  }
}

// The paged cache (model/decoder.h): prompts longer than a block (37 and 21 tokens: full blocks shared by the
// rows copied from them, the partly filled last one copied) in a pool sized for groups sharing their prompt, which
// could not hold the rows unshared. Every row's logits equal the training forward of its own sequence at each
// step, the rows of a group draw the same greedy tokens as batch-1 generation, and a pool one block too small
// says so in one line.
TEST_P(DecoderVsForward, PagedCacheSharesPromptBlocksAndEqualsTrainingForward) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  const int V = m->config().vocab_size, steps = 20, group = 3;
  const std::vector<int> lens{37, 21};
  const int64_t pool = KvDecoder::cache_tokens_for_groups(2, group, 37, steps);
  ASSERT_LT(pool, 2 * group * (37 + steps)) << "the shared pool is smaller than rows x length";
  KvDecoder d(*m, 2 * group, 37 + steps, 8, false, pool);
  std::vector<std::vector<int32_t>> seqs;
  for (int p = 0; p < 2; ++p) {
    const auto s = random_ids(lens[size_t(p)] + steps, V, 50 + uint32_t(p));
    d.feed_row(p * group, std::span(s).first(size_t(lens[size_t(p)])));
    for (int r = 0; r < group; ++r) {
      if (r > 0) d.copy_row(p * group, p * group + r);
      seqs.push_back(s);
    }
  }
  std::vector<float> last(size_t(2 * group) * size_t(V));
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> next;
    for (int r = 0; r < 2 * group; ++r) {  // rows of a group diverge: each takes another token of its sequence
      auto& seq = seqs[size_t(r)];
      if (s == 0 && r % group) seq[size_t(d.length(r))] = int32_t((seq[size_t(d.length(r))] + r * 7) % V);
      next.push_back(seq[size_t(d.length(r))]);
    }
    d.feed(next, 1, last.data());
    if (s % 6 != 5 && s + 1 != steps) continue;
    for (int r = 0; r < 2 * group; ++r) {
      const int n = d.length(r);
      const auto ref = full_logits(*m, std::vector<int32_t>(seqs[size_t(r)].begin(), seqs[size_t(r)].begin() + n), 1);
      EXPECT_LE(rel_err(last.data() + r * V, ref.data() + size_t(n - 1) * size_t(V), size_t(V)), 1e-5)
          << "row " << r << " at length " << n;
    }
  }
  const std::vector<std::vector<int32_t>> prompts{random_ids(37, V, 61), random_ids(21, V, 62)};
  const GenerationOptions greedy{steps, {}, {}};
  KvDecoder g(*m, 2 * group, 37 + steps, 8, false, pool);
  const std::vector<Rollout> got = generate_groups(g, prompts, group, greedy);
  for (size_t p = 0; p < prompts.size(); ++p) {
    KvDecoder one(*m, 1, 37 + steps, 8);
    const auto want = generate(one, prompts[p], greedy);
    for (size_t r = p * group; r < p * group + group; ++r) EXPECT_EQ(got[r].tokens, want) << "prompt " << p;
  }
  // These prompts' groups hold 8 + 7 blocks (a 37-token prompt shares 2 full blocks, a 21-token one 1).
  KvDecoder exact(*m, 2 * group, 37 + steps, 8, false, 15 * KvDecoder::kBlock);
  EXPECT_EQ(generate_groups(exact, prompts, group, greedy)[0].tokens, got[0].tokens);
  KvDecoder small(*m, 2 * group, 37 + steps, 8, false, 14 * KvDecoder::kBlock);
  try {
    generate_groups(small, prompts, group, greedy);
    ADD_FAILURE() << "a pool one block short generated";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache is full"), std::string::npos) << e.what();
  }
}

// The decode step fed from the device (feed_drawn: the drawn ids advanced by Ops::advance_decode, nothing
// uploaded) equals feeding the same ids from the host, rows of different lengths included, and a copy_row between
// steps (lengths changed on the host) is seen by the next step.
TEST_P(DecoderVsForward, FeedDrawnEqualsFeedingTheDrawnIds) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  const int V = m->config().vocab_size, rows = 3, steps = 5;
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  sampled.seed = 5;
  KvDecoder a(*m, rows, 8 + steps + 1, 4), b(*m, rows, 8 + steps + 1, 4);
  const std::vector<int> lens{3, 8, 5};
  for (int r = 0; r < rows; ++r) {
    const auto prompt = random_ids(lens[size_t(r)], V, 40 + uint32_t(r));
    a.feed_row(r, prompt);
    b.feed_row(r, prompt);
  }
  std::vector<int32_t> ia(rows), ib(rows);
  std::vector<float> la(size_t(rows) * size_t(V)), lb(la.size());
  for (int s = 0; s < steps; ++s) {
    a.sample(sampled, uint64_t(s), ia.data());
    b.sample(sampled, uint64_t(s), ib.data());
    ASSERT_EQ(ia, ib) << "step " << s;
    if (s == 2) {  // row 2 becomes a copy of row 1 (its length too) on both
      a.copy_row(1, 2);
      b.copy_row(1, 2);
      a.sample(sampled, uint64_t(s), ia.data());
      b.sample(sampled, uint64_t(s), ib.data());
    }
    a.feed_drawn();
    b.feed(ib, 1);
    a.read_logits(la.data());
    b.read_logits(lb.data());
    EXPECT_EQ(la, lb) << "step " << s;
    for (int r = 0; r < rows; ++r) EXPECT_EQ(a.length(r), b.length(r)) << "row " << r;
  }
  EXPECT_EQ(a.length(0), 3 + steps);
  EXPECT_EQ(a.length(2), 8 + steps) << "row 1 copied: its length too";
  EXPECT_FALSE(a.recorded()) << "the CPU runs ops as they are called";
  EXPECT_FALSE(a.why_not_recorded().empty());
  KvDecoder full(*m, 1, 2, 4);
  full.feed(random_ids(2, V, 9), 2);
  full.sample(sampled, 0, ia.data());
  EXPECT_THROW(full.feed_drawn(), UserError) << "cache overflow";
}

// Continuous batching (generate_groups with fewer rows than completions): prompts of different lengths stream
// through one or two groups of rows, a group taking the next prompt when its rows have ended (EOS ids picked so
// completions end at different steps; the repetition penalty's flags must be cleared on restart). Greedy decoding
// gives the rollouts of all rows at once, token for token; in a pool sized for the rows alone, with rows left
// without a prompt parked within the planned context. Sampled, it repeats under a seed.
TEST_P(DecoderVsForward, ContinuousBatchingEqualsAllRowsAtOnce) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  const int V = m->config().vocab_size, group = 2, max_new = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 5; ++p) prompts.push_back(random_ids(3 + 4 * ((p * 3) % 5), V, 90 + uint32_t(p)));
  const int longest = 19, n = int(prompts.size()) * group;
  GenerationOptions o{max_new, {}, {}};
  o.sampling.repetition_penalty = 1.3f;
  auto all_at_once = [&](const GenerationOptions& opts) {
    KvDecoder d(*m, n, longest + max_new, 8, true);
    return generate_groups(d, prompts, group, opts);
  };
  // EOS ids that end some completions early: tokens the free run produces at steps 2 and 5 of two prompts
  const std::vector<Rollout> free = all_at_once(o);
  o.eos_ids = {free[2].tokens[2], free[6].tokens[5]};
  const std::vector<Rollout> want = all_at_once(o);
  std::set<size_t> lengths;
  for (const Rollout& r : want) lengths.insert(r.tokens.size());
  ASSERT_GE(lengths.size(), 2u) << "completions end at different steps";
  for (int slots : {group, 2 * group}) {
    const int64_t pool = KvDecoder::cache_tokens_for_groups(slots / group, group, longest, max_new);
    KvDecoder d(*m, slots, longest + max_new, 8, true, pool);
    const std::vector<Rollout> got = generate_groups(d, prompts, group, o);
    ASSERT_EQ(got.size(), want.size());
    for (size_t c = 0; c < want.size(); ++c) {
      EXPECT_EQ(got[c].tokens, want[c].tokens) << slots << " rows, completion " << c;
      EXPECT_EQ(got[c].terminated, want[c].terminated) << slots << " rows, completion " << c;
    }
  }
  GenerationOptions sampled = o;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 21;
  std::vector<std::vector<Rollout>> runs;
  for (int k = 0; k < 2; ++k) {
    KvDecoder d(*m, 2 * group, longest + max_new, 8, true);
    runs.push_back(generate_groups(d, prompts, group, sampled));
  }
  for (size_t c = 0; c < runs[0].size(); ++c) {
    EXPECT_EQ(runs[0][c].tokens, runs[1][c].tokens) << "completion " << c;
    const auto& t = runs[0][c].tokens;
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(runs[0][c].terminated, std::count(o.eos_ids.begin(), o.eos_ids.end(), t.back()) > 0);
    EXPECT_TRUE(runs[0][c].terminated || int(t.size()) == max_new);
  }
}

// The decoder's fused projections (model/decode_fusion.h: q/k/v and gate/up as one GEMM each over the weights
// side by side, then decode_qkv and swiglu_packed_forward) give the logits of one GEMM a projection
// (SOLTRAIN_DECODE_FUSED=0), prefill chunks and decode steps, rows of different lengths; the tests above hold them
// to the training forward.
void expect_fused_equals_unfused(Transformer& m, int want_fused) {
  const int V = m.config().vocab_size, rows = 2, steps = 6;
  const std::vector<int> lens{9, 5};
  auto run = [&](bool fused, int* count) {
    if (!fused) setenv("SOLTRAIN_DECODE_FUSED", "0", 1);
    KvDecoder d(m, rows, 9 + steps, 4);
    unsetenv("SOLTRAIN_DECODE_FUSED");
    *count = d.fused_projections();
    std::vector<float> all, last(size_t(rows) * size_t(V));
    for (int r = 0; r < rows; ++r) {
      d.feed_row(r, random_ids(lens[size_t(r)], V, 70 + uint32_t(r)), last.data());
      all.insert(all.end(), last.begin(), last.begin() + V);
    }
    for (int s = 0; s < steps; ++s) {
      d.feed(random_ids(rows, V, 80 + uint32_t(s)), 1, last.data());
      all.insert(all.end(), last.begin(), last.end());
    }
    return all;
  };
  int fused = -1, plain = -1;
  const auto a = run(true, &fused), b = run(false, &plain);
  EXPECT_EQ(fused, want_fused);
  EXPECT_EQ(plain, 0);
  EXPECT_LE(rel_err(a.data(), b.data(), a.size()), 1e-6);
}

TEST_P(DecoderVsForward, FusedProjectionsEqualOneGemmEach) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir(GetParam()), *ops);
  expect_fused_equals_unfused(*m, 2 * m->config().num_layers);
}

TEST(Decoder, FusedProjectionsWithAdapters) {
  auto ops = make_cpu_ops();
  const auto peft = fixtures() / "peft" / "qwen3-tiny";
  auto all = load_pretrained_with_adapter(model_dir("qwen3-tiny"), peft / "adapter", *ops);
  expect_fused_equals_unfused(*all, 2 * all->config().num_layers);
  // Adapters on some parts only (the block-diagonal B's other blocks empty), B drawn at random (PEFT starts it at 0).
  LoraConfig lora;
  lora.r = 3;
  lora.alpha = 5;
  lora.target_modules = {"q_proj", "v_proj", "up_proj", "down_proj"};
  auto some = load_pretrained(model_dir("llama3-tiny-scaled"), *ops, lora);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (int l = 0; l < some->config().num_layers; ++l)
    for (LoraTarget t : {LoraTarget::q, LoraTarget::v, LoraTarget::up, LoraTarget::down}) {
      Parameter& b = some->params().at(lora_b_name(l, t));
      for (int64_t i = 0; i < b.master.numel(); ++i) b.master.f32()[i] = normal(rng);
    }
  expect_fused_equals_unfused(*some, 2 * some->config().num_layers);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderVsForward,
                         ::testing::Values("qwen3-tiny", "llama3-tiny-scaled", "qwen2-tiny-mqa-bias"));

TEST(Decoder, LoraAdapterEqualsTrainingForwardAndMergedModel) {
  auto ops = make_cpu_ops();
  const auto peft = fixtures() / "peft" / "qwen3-tiny";
  auto m = load_pretrained_with_adapter(model_dir("qwen3-tiny"), peft / "adapter", *ops);
  expect_decoder_matches_forward(*m);
  // PEFT's merged model is the same function: the cached decode of both agrees to fp32 rounding.
  auto merged = load_pretrained(peft / "merged", *ops);
  const int T = 10, V = m->config().vocab_size;
  const auto ids = random_ids(T, V, 5);
  std::vector<float> a(size_t(T) * size_t(V)), b(a.size()), last(static_cast<size_t>(V));
  KvDecoder da(*m, 1, T), db(*merged, 1, T);
  da.feed(ids, T, last.data(), a.data());
  db.feed(ids, T, last.data(), b.data());
  EXPECT_LE(rel_err(a.data(), b.data(), a.size()), 1e-5);
  // and the adapter changes the logits (the comparison above is not between two base models)
  auto base = load_pretrained(model_dir("qwen3-tiny"), *ops);
  KvDecoder dc(*base, 1, T);
  dc.feed(ids, T, last.data(), b.data());
  EXPECT_GT(rel_err(a.data(), b.data(), a.size()), 1e-3);
}

TEST(Generate, StopsAtEosAndAtTheTokenBudget) {
  auto ops = make_cpu_ops();
  auto m = load_pretrained(model_dir("qwen3-tiny"), *ops);
  const auto prompt = random_ids(4, m->config().vocab_size, 9);
  KvDecoder d(*m, 1, 32);
  const auto free_run = generate(d, prompt, GenerationOptions{10, {}, {}});
  ASSERT_EQ(free_run.size(), 10u);
  // EOS = the third token: generation includes it and stops there (earlier occurrences stop earlier).
  const int32_t eos = free_run[2];
  const auto stopped = generate(d, prompt, GenerationOptions{10, {}, {12345, eos}});
  const size_t first = size_t(std::find(free_run.begin(), free_run.end(), eos) - free_run.begin());
  ASSERT_EQ(stopped.size(), first + 1);
  EXPECT_TRUE(std::equal(stopped.begin(), stopped.end(), free_run.begin()));
  std::vector<int32_t> seen;
  generate(d, prompt, GenerationOptions{3, {}, {}}, [&](int32_t id) { seen.push_back(id); });
  EXPECT_EQ(seen, std::vector<int32_t>(free_run.begin(), free_run.begin() + 3));
}

TEST(Generate, ReadsEosFromGenerationConfig) {
  EXPECT_EQ(read_generation_eos(model_dir("llama3-tiny-scaled")), std::vector<int32_t>{2});
  EXPECT_TRUE(read_generation_eos(model_dir("qwen3-tiny")).empty());  // no generation_config.json
  TempDir t;
  std::ofstream(t.path / "generation_config.json") << R"({"eos_token_id": [151645, 151643]})";
  EXPECT_EQ(read_generation_eos(t.path), (std::vector<int32_t>{151645, 151643}));
  std::ofstream(t.path / "generation_config.json") << R"({"eos_token_id": "x"})";
  EXPECT_THROW(read_generation_eos(t.path), UserError);
}

TEST(GenerateCli, GeneratesAndFailsWithOneLine) {
  TempDir t;
  write_random_model(t.path / "m", DemoModelShape{}, 1);
  const std::string m = "generate --model " + (t.path / "m").string();
  const CliRun greedy = run(m + " --prompt 'hello' --max-new-tokens 6", t);
  EXPECT_EQ(greedy.code, 0) << greedy.err;
  EXPECT_NE(greedy.err.find("new in"), std::string::npos) << greedy.err;
  const std::string sampled = m +
                              " --chat 'reverse: abc' --enable-thinking false --max-new-tokens 6 --temperature 0.9 "
                              "--top-p 0.9 --top-k 50 --seed 3";
  const CliRun s1 = run(sampled, t), s2 = run(sampled, t);
  EXPECT_EQ(s1.code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out) << "same seed, same text";

  auto expect_user_error = [&](const std::string& args, const std::string& needle) {
    const CliRun r = run(args, t);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  };
  expect_user_error(m, "--prompt");
  expect_user_error(m + " --prompt a --chat b", "exactly one");
  expect_user_error(m + " --prompt a --top-p 0", "--top-p");
  expect_user_error(m + " --prompt a --temperature -1", "--temperature");
  expect_user_error(m + " --prompt a --max-new-tokens 0", "--max-new-tokens");
  expect_user_error(m + " --prompt a --device tpu", "tpu");
  expect_user_error("generate --model /nonexistent --prompt a", "/nonexistent");
  expect_user_error("generate --model " + model_dir("qwen3-tiny").string() + " --prompt a", "tokenizer.json");
  expect_user_error(m + " --prompt a --adapter /nonexistent-adapter", "nonexistent-adapter");
}

}  // namespace
}  // namespace soltrain::test
