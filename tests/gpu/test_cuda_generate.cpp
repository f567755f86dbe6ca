// CUDA decoding against the CPU reference: the attention_decode kernel on random data (GQA, ragged cache
// lengths, head_dim not a multiple of 32, a 300-token prefill), and whole-model cached decoding and greedy
// generation on the fixture models within bf16 error.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>

#include "gpu_test_util.h"
#include "model/checkpoint.h"
#include "model/generation.h"
#include "model/peft_adapter.h"

namespace soltrain::test {
namespace {

class CudaDecode : public CudaTest {
 protected:
  // A paged cache's block table for B sequences of up to S positions in blocks of bs: every sequence's blocks
  // drawn from a shuffled pool with spare blocks, so neighbouring positions live far apart.
  std::vector<int32_t> shuffled_table(int64_t B, int64_t S, int64_t bs, int64_t& pool) {
    const int64_t nb = (S + bs - 1) / bs;
    pool = B * nb + 3;
    std::vector<int32_t> blocks(static_cast<size_t>(pool)), table(static_cast<size_t>(B * nb));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::copy(blocks.begin(), blocks.begin() + B * nb, table.begin());
    return table;
  }
  // out of the CUDA kernel vs the CPU op on the same bf16-rounded inputs.
  double kernel_err(int64_t B, int64_t Tq, int64_t S, int64_t H, int64_t Hkv, int64_t hd, std::vector<int32_t> lens,
                    int64_t bs = 16) {
    int64_t pool = 0;
    std::vector<int32_t> table = shuffled_table(B, S, bs, pool);
    const int64_t nb = int64_t(table.size()) / B;
    const auto q = randn(size_t(B * Tq * H * hd)), k = randn(size_t(pool * bs * Hkv * hd)),
               v = randn(size_t(pool * bs * Hkv * hd));
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> cq = q, ck = k, cv = v, cout(q.size(), NAN);
    std::vector<int32_t> ctable = table;
    cpu->attention_decode(host(cout, {B * Tq, H, hd}), host(cq, {B * Tq, H, hd}), host(ck, {pool, bs, Hkv, hd}),
                          host(cv, {pool, bs, Hkv, hd}), host_i32(lens), host_i32(ctable).view({B, nb}), scale);
    const Tensor out = poisoned({B * Tq, H, hd});
    gpu->attention_decode(out, upload(q, {B * Tq, H, hd}), upload(k, {pool, bs, Hkv, hd}),
                          upload(v, {pool, bs, Hkv, hd}), upload_i32(lens), upload_i32(table).view({B, nb}), scale);
    return rel(download(out), cout);
  }
};

TEST_F(CudaDecode, KernelMatchesCpu) {
  // The grouped form (head_dim 16-256, 1, 2, 4 or 8 query heads per KV head) and the per-head one (others).
  std::vector<int32_t> many(64);
  for (size_t b = 0; b < many.size(); ++b) many[b] = int32_t(1 + (b * 37) % 300);
  EXPECT_LE(kernel_err(64, 1, 300, 16, 8, 128, many), 1e-2) << "64 rows of Qwen3-0.6B's heads, ragged";
  EXPECT_LE(kernel_err(3, 1, 70, 32, 4, 128, {70, 1, 33}), 1e-2) << "GQA 8, head_dim 128";
  EXPECT_LE(kernel_err(2, 2, 50, 8, 8, 256, {2, 50}), 1e-2) << "head_dim 256, no grouping";
  EXPECT_LE(kernel_err(2, 1, 30, 4, 2, 32, {30, 9}), 1e-2) << "head_dim 32";
  EXPECT_LE(kernel_err(2, 1, 30, 12, 4, 64, {30, 9}), 1e-2) << "GQA 3: per head";
  EXPECT_LE(kernel_err(2, 1, 40, 8, 2, 64, {20, 37}), 1e-2) << "one new token, ragged lengths, GQA 4";
  EXPECT_LE(kernel_err(2, 3, 40, 4, 1, 128, {3, 40}), 1e-2) << "three new tokens, MQA, head_dim 128";
  EXPECT_LE(kernel_err(1, 5, 17, 6, 3, 80, {12}), 1e-2) << "head_dim 80";
  EXPECT_LE(kernel_err(1, 1, 9, 4, 4, 16, {1}), 1e-2) << "a single cached token, head_dim 16";
  EXPECT_LE(kernel_err(1, 300, 300, 16, 8, 128, {300}), 1e-2) << "a 300-token prefill";
  EXPECT_LE(kernel_err(2, 1, 33, 8, 2, 128, {33, 17}, 1), 1e-2) << "blocks of one position";
}

// The K/V append writes each sequence's new rows where its length says, and nothing else: the cache's other rows
// keep their values (bf16 copies are exact, so the download equals the CPU op's result on the rounded inputs).
TEST_F(CudaDecode, KvAppendMatchesCpu) {
  for (auto [B, Tq, S, Hkv, hd, bs] : {std::tuple{3L, 1L, 20L, 2L, 64L, 16L}, std::tuple{2L, 4L, 9L, 1L, 12L, 4L},
                                       std::tuple{1L, 7L, 7L, 3L, 5L, 16L}}) {
    const std::vector<int32_t> lens = B == 3   ? std::vector<int32_t>{1, 20, 7}
                                      : B == 2 ? std::vector<int32_t>{4, 9}
                                               : std::vector<int32_t>{7};
    auto bf = [](std::vector<float> x) {  // the bf16 values both sides hold
      for (float& f : x) f = bf16_to_f32(f32_to_bf16(f));
      return x;
    };
    int64_t pool = 0;
    std::vector<int32_t> table = shuffled_table(B, S, bs, pool);
    const int64_t nb = int64_t(table.size()) / B;
    std::vector<float> kc = bf(randn(size_t(pool * bs * Hkv * hd))), vc = bf(randn(kc.size()));
    std::vector<float> k = bf(randn(size_t(B * Tq * Hkv * hd))), v = bf(randn(k.size()));
    const Tensor gkc = upload(kc, {pool, bs, Hkv, hd}), gvc = upload(vc, {pool, bs, Hkv, hd});
    gpu->kv_append(gkc, gvc, upload(k, {B * Tq, Hkv, hd}), upload(v, {B * Tq, Hkv, hd}), upload_i32(lens),
                   upload_i32(table).view({B, nb}));
    std::vector<int32_t> l = lens;
    cpu->kv_append(host(kc, {pool, bs, Hkv, hd}), host(vc, {pool, bs, Hkv, hd}), host(k, {B * Tq, Hkv, hd}),
                   host(v, {B * Tq, Hkv, hd}), host_i32(l), host_i32(table).view({B, nb}));
    EXPECT_EQ(download(gkc), kc) << B << " x " << Tq;
    EXPECT_EQ(download(gvc), vc) << B << " x " << Tq;
  }
}

// decode_qkv (one GEMM's q/k/v output normed, rotated and appended in one launch) against the separate ops on the
// same GPU (qk_norm_rope_forward or rope, then kv_append: bitwise, the kernel follows their rounding) and against the
// CPU op (within bf16 rounding), over shuffled block tables, several new tokens a row, with and without q/k norm;
// rows of the pool the tokens do not reach keep their values.
TEST_F(CudaDecode, DecodeQkvEqualsTheSeparateOps) {
  for (auto [B, Tq, H, Hkv, hd, norm] :
       {std::tuple{3L, 1L, 16L, 8L, 128L, true}, std::tuple{2L, 3L, 4L, 2L, 64L, true},
        std::tuple{2L, 1L, 8L, 1L, 128L, false}, std::tuple{1L, 2L, 4L, 4L, 256L, true},
        std::tuple{2L, 2L, 4L, 2L, 12L, true}}) {
    const int64_t N = B * Tq, S = 40, half = hd / 2, bs = 16;
    std::vector<int32_t> lens, positions;
    for (int64_t b = 0; b < B; ++b) lens.push_back(int32_t(Tq + int64_t(rng() % uint32_t(S - Tq + 1))));
    for (int64_t n = 0; n < N; ++n) positions.push_back(int32_t(lens[size_t(n / Tq)] - Tq + n % Tq));
    int64_t pool = 0;
    std::vector<int32_t> table = shuffled_table(B, S, bs, pool);
    const int64_t nb = int64_t(table.size()) / B;
    std::vector<float> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = float(1.0 / std::pow(1e6, double(2 * i) / double(hd)));
    std::vector<float> qkv = randn(size_t(N * (H + 2 * Hkv) * hd), 2.0f), qw = randn(size_t(hd)),
                       kw = randn(size_t(hd)), kc = randn(size_t(pool * bs * Hkv * hd)), vc = randn(kc.size());
    const float eps = 1e-6f;
    const Tensor gtable = upload_i32(table).view({B, nb}), glens = upload_i32(lens), gpos = upload_i32(positions);
    const Tensor ginv = upload(inv, {half}, DType::F32);
    const Tensor gqw = norm ? upload(qw, {hd}) : Tensor{}, gkw = norm ? upload(kw, {hd}) : Tensor{};
    // fused
    const Tensor gq = poisoned({N, H, hd}), gkc = upload(kc, {pool, bs, Hkv, hd}),
                 gvc = upload(vc, {pool, bs, Hkv, hd});
    gpu->decode_qkv(gq, gkc, gvc, upload(qkv, {N, (H + 2 * Hkv) * hd}), gqw, gkw, gpos, ginv, eps, glens, gtable);
    // the separate ops on the parts
    std::vector<float> qp, kp, vp;
    for (int64_t n = 0; n < N; ++n) {
      const auto row = qkv.begin() + n * (H + 2 * Hkv) * hd;
      qp.insert(qp.end(), row, row + H * hd);
      kp.insert(kp.end(), row + H * hd, row + (H + Hkv) * hd);
      vp.insert(vp.end(), row + (H + Hkv) * hd, row + (H + 2 * Hkv) * hd);
    }
    const SeqLayout seq{Tensor{}, gpos, 0};
    Tensor q2 = upload(qp, {N, H, hd}), k2 = upload(kp, {N, Hkv, hd});
    const Tensor kc2 = upload(kc, {pool, bs, Hkv, hd}), vc2 = upload(vc, {pool, bs, Hkv, hd});
    if (norm) {
      const Tensor qn = poisoned({N, H, hd}), kn = poisoned({N, Hkv, hd});
      gpu->qk_norm_rope_forward(qn, poisoned({N * H}, DType::F32), q2, gqw, seq, ginv, eps);
      gpu->qk_norm_rope_forward(kn, poisoned({N * Hkv}, DType::F32), k2, gkw, seq, ginv, eps);
      q2 = qn;
      k2 = kn;
    } else {
      gpu->rope(q2, seq, ginv, false);
      gpu->rope(k2, seq, ginv, false);
    }
    gpu->kv_append(kc2, vc2, k2, upload(vp, {N, Hkv, hd}), glens, gtable);
    const std::string what = "B " + std::to_string(B) + " Tq " + std::to_string(Tq) + " hd " + std::to_string(hd);
    EXPECT_EQ(download(gq), download(q2)) << what;
    EXPECT_EQ(download(gkc), download(kc2)) << what;
    EXPECT_EQ(download(gvc), download(vc2)) << what;
    // the CPU op
    std::vector<float> cq(size_t(N * H * hd)), ckc = kc, cvc = vc, cqkv = qkv, cqw = qw, ckw = kw;
    cpu->decode_qkv(host(cq, {N, H, hd}), host(ckc, {pool, bs, Hkv, hd}), host(cvc, {pool, bs, Hkv, hd}),
                    host(cqkv, {N, (H + 2 * Hkv) * hd}), norm ? host(cqw, {hd}) : Tensor{},
                    norm ? host(ckw, {hd}) : Tensor{}, host_i32(positions), host(inv, {half}), eps, host_i32(lens),
                    host_i32(table).view({B, nb}));
    EXPECT_LE(rel(download(gq), cq), 1e-2) << what;
    EXPECT_LE(rel(download(gkc), ckc), 1e-2) << what;
    EXPECT_EQ(download(gvc), cvc) << what;
  }
}

// swiglu_packed_forward over [N, 2F] equals swiglu_forward over the halves (vectorised and scalar widths).
TEST_F(CudaDecode, SwigluPackedEqualsSwiglu) {
  for (auto [N, F] : {std::pair{64L, 160L}, std::pair{5L, 13L}}) {
    const std::vector<float> gu = randn(size_t(N * 2 * F), 2.0f);
    std::vector<float> g, u;
    for (int64_t n = 0; n < N; ++n) {
      g.insert(g.end(), gu.begin() + n * 2 * F, gu.begin() + n * 2 * F + F);
      u.insert(u.end(), gu.begin() + n * 2 * F + F, gu.begin() + (n + 1) * 2 * F);
    }
    const Tensor packed = poisoned({N, F}), split = poisoned({N, F});
    gpu->swiglu_packed_forward(packed, upload(gu, {N, 2 * F}));
    gpu->swiglu_forward(split, upload(g, {N, F}), upload(u, {N, F}));
    EXPECT_EQ(download(packed), download(split)) << N << " x " << F;
    std::vector<float> c(size_t(N * F)), cgu = gu;
    cpu->swiglu_packed_forward(host(c, {N, F}), host(cgu, {N, 2 * F}));
    EXPECT_LE(rel(download(packed), c), 1e-2) << N << " x " << F;
  }
}

// The fused projections (model/decode_fusion.h) engage on the GPU's bf16 weights (dense, and a frozen base under a
// PEFT adapter) and give the logits of one GEMM a projection within bf16 rounding.
TEST_F(CudaTest, FusedDecodeEqualsOneGemmAProjection) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  for (bool adapter : {false, true}) {
    auto m = adapter ? load_pretrained_with_adapter(dir, fixtures() / "peft" / "qwen3-tiny" / "adapter", *gpu)
                     : load_pretrained(dir, *gpu);
    const int V = m->config().vocab_size, T = 20, P = 12;
    std::mt19937 r(8);
    std::vector<int32_t> ids(static_cast<size_t>(2 * T));
    for (auto& id : ids) id = int32_t(r() % uint32_t(V));
    std::vector<std::vector<float>> out(2);
    for (int k = 0; k < 2; ++k) {
      if (k == 1) setenv("SOLTRAIN_DECODE_FUSED", "0", 1);
      KvDecoder d(*m, 2, T, 8);
      unsetenv("SOLTRAIN_DECODE_FUSED");
      EXPECT_EQ(d.fused_projections(), k == 0 ? 2 * m->config().num_layers : 0) << "adapter " << adapter;
      std::vector<float> last(2 * size_t(V));
      std::vector<int32_t> prompt(ids.begin(), ids.begin() + 2 * P);
      d.feed(prompt, P, last.data());
      out[size_t(k)] = last;
      for (int t = P; t < T; ++t) {
        d.feed(std::vector<int32_t>{ids[size_t(t)], ids[size_t(T + t)]}, 1, last.data());
        out[size_t(k)].insert(out[size_t(k)].end(), last.begin(), last.end());
      }
    }
    EXPECT_LE(rel(out[0], out[1]), 2e-2) << "adapter " << adapter;
  }
}

class CudaGenerate : public CudaTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaGenerate, DecodeLogitsAndGreedyTokensMatchCpu) {
  const auto dir = fixtures() / "models" / GetParam();
  auto gm = load_pretrained(dir, *gpu), cm = load_pretrained(dir, *cpu);
  const int T = 24, V = gm->config().vocab_size;
  std::mt19937 r(3);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (auto& id : ids) id = int32_t(r() % uint32_t(V));
  // Prefill 16 tokens (all logits), then 8 single steps, on both backends.
  KvDecoder gd(*gm, 1, T, 8), cd(*cm, 1, T, 8);
  const int P = 16;
  std::vector<float> ga(size_t(P) * V), ca(ga.size()), gl(static_cast<size_t>(V)), cl(gl.size());
  gd.feed(std::span(ids).first(P), P, gl.data(), ga.data());
  cd.feed(std::span(ids).first(P), P, cl.data(), ca.data());
  EXPECT_LE(rel(ga, ca), 2e-2) << "prefill logits";
  EXPECT_LE(rel(gl, cl), 2e-2) << "prefill last logits";
  for (int t = P; t < T; ++t) {
    gd.feed(std::span(ids).subspan(size_t(t), 1), 1, gl.data());
    cd.feed(std::span(ids).subspan(size_t(t), 1), 1, cl.data());
    EXPECT_LE(rel(gl, cl), 2e-2) << "position " << t;
  }
  // Greedy: bf16 rounding may flip a near-tie, after which free runs diverge. So the GPU follows the CPU's
  // greedy tokens (teacher forcing) and must pick the same token wherever the CPU's choice is clear (top-2
  // margin > 0.1), and most tokens overall.
  const int steps = 16;
  KvDecoder g2(*gm, 1, P + steps), c2(*cm, 1, P + steps);
  const auto ct = generate(c2, std::span(ids).first(P), GenerationOptions{steps, {}, {}});
  ASSERT_EQ(int(ct.size()), steps);
  g2.feed(std::span(ids).first(P), P, gl.data());
  c2.reset();
  c2.feed(std::span(ids).first(P), P, cl.data());
  int agree = 0;
  for (int i = 0; i < steps; ++i) {
    const int32_t want = ct[size_t(i)];
    ASSERT_EQ(argmax(cl), want) << "the CPU decoder is deterministic";
    float second = -INFINITY;
    for (int j = 0; j < V; ++j)
      if (j != want) second = std::max(second, cl[size_t(j)]);
    const int32_t got = argmax(gl);
    agree += got == want;
    if (cl[size_t(want)] - second > 0.1f) {
      EXPECT_EQ(got, want) << "step " << i << ", a clear choice";
    }
    if (i + 1 == steps) break;
    g2.feed(std::span(ct).subspan(size_t(i), 1), 1, gl.data());
    c2.feed(std::span(ct).subspan(size_t(i), 1), 1, cl.data());
  }
  EXPECT_GE(agree, steps * 3 / 4) << agree << " of " << steps << " greedy tokens agree";
  KvDecoder g3(*gm, 1, P + steps);
  EXPECT_EQ(int(generate(g3, std::span(ids).first(P), GenerationOptions{steps, {}, {}}).size()), steps);
}

// Continuous batching on the device (prompts streaming through fewer rows than completions, the decode step
// replayed from its recording while groups restart): it finishes, repeats itself, ends each completion at its
// EOS or the budget, and its greedy completions start as the CPU's (a broken restart would draw from another
// prompt's state; bf16 may flip a near-tie later, after which a completion diverges).
TEST_P(CudaGenerate, ContinuousBatchingStreamsPromptsOnTheDevice) {
  const auto dir = fixtures() / "models" / GetParam();
  auto gm = load_pretrained(dir, *gpu), cm = load_pretrained(dir, *cpu);
  const int V = gm->config().vocab_size, group = 2, max_new = 10;
  std::mt19937 r(12);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 6; ++p) {
    prompts.emplace_back(size_t(4 + 3 * p));
    for (auto& id : prompts.back()) id = int32_t(r() % uint32_t(V));
  }
  GenerationOptions o{max_new, {}, {}};
  o.eos_ids = {int32_t(r() % uint32_t(V)), int32_t(r() % uint32_t(V)), int32_t(r() % uint32_t(V))};
  auto run = [&](Transformer& m, const GenerationOptions& opts) {
    KvDecoder d(m, 2 * group, 4 + 3 * 5 + max_new, 8);
    return generate_groups(d, prompts, group, opts);
  };
  const auto g1 = run(*gm, o), g2 = run(*gm, o), c = run(*cm, o);
  int starts_alike = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_EQ(g1[i].tokens, g2[i].tokens) << "completion " << i << " repeats";
    ASSERT_FALSE(g1[i].tokens.empty());
    EXPECT_TRUE(g1[i].terminated || int(g1[i].tokens.size()) == max_new) << i;
    const size_t n = std::min<size_t>({3, g1[i].tokens.size(), c[i].tokens.size()});
    starts_alike += std::equal(g1[i].tokens.begin(), g1[i].tokens.begin() + long(n), c[i].tokens.begin());
  }
  EXPECT_GE(starts_alike, int(g1.size()) * 2 / 3)
      << starts_alike << " of " << g1.size() << " completions start with the CPU's 3 tokens";
  GenerationOptions sampled = o;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 3;
  const auto s1 = run(*gm, sampled), s2 = run(*gm, sampled);
  for (size_t i = 0; i < s1.size(); ++i) EXPECT_EQ(s1[i].tokens, s2[i].tokens) << "sampled completion " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGenerate,
                         ::testing::Values("qwen3-tiny", "qwen2-tiny-mqa-bias", "llama3-tiny-scaled"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!isalnum(c)) c = '_';
                           return n;
                         });

// The decode step recorded once as a CUDA graph and replayed (KvDecoder::feed_drawn) runs the same kernels on
// the same buffers as op by op (SOLTRAIN_DECODE_GRAPH=0): the drawn tokens and the last logits are bitwise equal
// step after step, for rows of different lengths with copied rows, sampling at temperature 1 with a repetition
// penalty, on a dense model, under a PEFT adapter and over an NF4 base.
TEST_F(CudaTest, RecordedDecodeStepEqualsOpByOp) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  LoraConfig nf4;
  nf4.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  nf4.base_format = WeightFormat::Nf4;
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Transformer>()>>> models{
      {"dense", [&] { return load_pretrained(dir, *gpu); }},
      {"peft adapter",
       [&] { return load_pretrained_with_adapter(dir, fixtures() / "peft" / "qwen3-tiny" / "adapter", *gpu); }},
      {"nf4 base", [&] { return load_pretrained(dir, *gpu, nf4, /*gradients=*/false); }}};
  for (const auto& [what, make] : models) {
    auto m = make();
    const int V = m->config().vocab_size, rows = 6, steps = 12;
    SamplingParams p;
    p.temperature = 1.0f;
    p.repetition_penalty = 1.3f;
    p.seed = 11;
    std::vector<std::unique_ptr<KvDecoder>> d;
    for (const char* graph : {"1", "0"}) {
      setenv("SOLTRAIN_DECODE_GRAPH", graph, 1);
      d.push_back(std::make_unique<KvDecoder>(*m, rows, 40, 16, true));
    }
    std::vector<std::vector<int32_t>> ids(2, std::vector<int32_t>(rows));
    std::vector<std::vector<float>> logits(2, std::vector<float>(size_t(rows) * size_t(V)));
    for (int k = 0; k < 2; ++k) {
      setenv("SOLTRAIN_DECODE_GRAPH", k == 0 ? "1" : "0", 1);
      KvDecoder& dec = *d[size_t(k)];
      std::mt19937 r(5);
      for (int row = 0; row < rows; row += 2) {  // prompts of 3, 7, 11 tokens, each copied to the next row
        std::vector<int32_t> prompt(size_t(3 + 2 * row));
        for (auto& id : prompt) id = int32_t(r() % uint32_t(V));
        dec.feed_row(row, prompt);
        dec.copy_row(row, row + 1);
      }
      std::vector<int32_t>& got = ids[size_t(k)];
      std::vector<int32_t> trace;
      for (int s = 0; s < steps; ++s) {
        if (s > 0) dec.feed_drawn();
        dec.sample(p, uint64_t(s), got.data());
        trace.insert(trace.end(), got.begin(), got.end());
      }
      dec.read_logits(logits[size_t(k)].data());
      got = trace;
    }
    unsetenv("SOLTRAIN_DECODE_GRAPH");
    EXPECT_TRUE(d[0]->recorded()) << what << ": " << d[0]->why_not_recorded();
    EXPECT_FALSE(d[1]->recorded()) << what;
    EXPECT_EQ(ids[0], ids[1]) << what << ": drawn tokens";
    EXPECT_EQ(logits[0], logits[1]) << what << ": last logits";
    for (float x : logits[0]) ASSERT_TRUE(std::isfinite(x) || x == -INFINITY) << what;
  }
}

TEST_F(CudaTest, DecodeWithLoraAdapterMatchesCpu) {
  const auto base = fixtures() / "models" / "qwen3-tiny", adapter = fixtures() / "peft" / "qwen3-tiny" / "adapter";
  auto gm = load_pretrained_with_adapter(base, adapter, *gpu), cm = load_pretrained_with_adapter(base, adapter, *cpu);
  const int T = 12, V = gm->config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int i = 0; i < T; ++i) ids[size_t(i)] = (i * 37 + 5) % V;
  KvDecoder gd(*gm, 1, T), cd(*cm, 1, T);
  std::vector<float> ga(size_t(T) * V), ca(ga.size()), last(static_cast<size_t>(V));
  gd.feed(ids, T, last.data(), ga.data());
  cd.feed(ids, T, last.data(), ca.data());
  EXPECT_LE(rel(ga, ca), 2e-2);
}

}  // namespace
}  // namespace soltrain::test
