// CUDA token sampling (kernels/cuda/sample.cu) against the CPU backend's (the double-precision reference): the
// same tokens for the same seeds on a Qwen3-sized vocabulary under every setting (the two differ only where a
// draw lands within float rounding of a boundary), exact ties at the top-k and top-p thresholds taken in token
// order, chi-square against transformers' definition on a small vocabulary, repeatability, and the repetition
// penalty's rewritten logits and flags.
#include "gpu_test_util.h"
#include "sampling_test_util.h"

namespace soltrain::test {
namespace {

class CudaSampling : public CudaTest {
 protected:
  // Draws on both backends from the same logits [B, V] (and seen flags); returns {gpu ids, cpu ids} and leaves
  // the rewritten logits in `cpu_logits` / `gpu_logits`.
  std::pair<std::vector<int32_t>, std::vector<int32_t>> both(const std::vector<float>& logits, int64_t B, int64_t V,
                                                             const SamplingParams& p, uint64_t step,
                                                             std::vector<uint8_t>* seen = nullptr) {
    cpu_logits = logits;
    const Tensor gl = upload(logits, {B, V}, DType::F32);
    Buffer gs_buf = gpu->alloc(seen ? seen->size() : 1), gid_buf = gpu->alloc(size_t(B) * 4),
           glp_buf = gpu->alloc(size_t(B) * 4);
    Tensor gs, cs;
    std::vector<uint8_t> cpu_seen;
    if (seen) {
      gs = Tensor{gs_buf.data(), DType::U8, {B, V}, Device::CUDA};
      gpu->copy(gs, Tensor{seen->data(), DType::U8, {B, V}});
      cpu_seen = *seen;
      cs = Tensor{cpu_seen.data(), DType::U8, {B, V}};
    }
    const Tensor gid{gid_buf.data(), DType::I32, {B}, Device::CUDA}, glp{glp_buf.data(), DType::F32, {B}, Device::CUDA};
    gpu->sample_tokens(gid, gl, gs, p, step, glp);
    std::vector<int32_t> g(static_cast<size_t>(B)), c(static_cast<size_t>(B));
    gpu->copy(Tensor{g.data(), DType::I32, {B}}, gid);
    gpu_logits = download(gl);
    gpu_logp = download(glp);
    cpu_logp.assign(size_t(B), NAN);
    cpu->sample_tokens(Tensor{c.data(), DType::I32, {B}}, Tensor{cpu_logits.data(), DType::F32, {B, V}}, cs, p, step,
                       Tensor{cpu_logp.data(), DType::F32, {B}});
    for (int64_t b = 0; b < B; ++b)  // the drawn token's log-prob (where both drew the same token)
      if (g[size_t(b)] == c[size_t(b)])
        EXPECT_NEAR(gpu_logp[size_t(b)], cpu_logp[size_t(b)], 2e-5) << "row " << b << " log-prob";
    if (seen) {
      std::vector<uint8_t> back(seen->size());
      gpu->copy(Tensor{back.data(), DType::U8, {B, V}}, gs);
      EXPECT_EQ(back, cpu_seen) << "flags after the draw";
    }
    return {g, c};
  }
  std::vector<float> cpu_logits, gpu_logits, cpu_logp, gpu_logp;
};

TEST_F(CudaSampling, SameTokensAsTheCpuOnAQwen3Vocabulary) {
  const int64_t B = 48, V = 151936;
  const std::vector<float> logits = randn(size_t(B * V), 3.0f);
  std::vector<uint8_t> seen(size_t(B * V), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int k = 0; k < 40; ++k) seen[size_t(b * V + int64_t(rng() % 2000))] = 1;  // the likeliest are in there too
  int total = 0, same = 0;
  for (const SamplingParams& p : {SamplingParams{}, SamplingParams{1.0f, 0, 1.0f, 7}, SamplingParams{0.7f, 50, 1.0f, 8},
                                  SamplingParams{1.0f, 0, 0.9f, 9}, SamplingParams{0.9f, 20, 0.8f, 10, 0.05f},
                                  SamplingParams{1.2f, 0, 1.0f, 11, 0.1f}, SamplingParams{1.0f, 0, 0.95f, 12, 0, 1.3f},
                                  SamplingParams{0.6f, 1000, 0.99f, 13, 0.01f, 0.9f}}) {
    SCOPED_TRACE(testing::Message() << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
                                    << " min_p " << p.min_p << " repetition_penalty " << p.repetition_penalty);
    for (uint64_t step : {0, 5}) {
      std::vector<uint8_t> flags = seen;
      const auto [g, c] = both(logits, B, V, p, step, p.repetition_penalty != 1 ? &flags : nullptr);
      for (int64_t b = 0; b < B; ++b) same += g[size_t(b)] == c[size_t(b)];
      total += int(B);
      if (p.greedy()) {
        EXPECT_EQ(g, c) << "greedy is exact";
      }
      if (p.repetition_penalty != 1) {
        EXPECT_EQ(gpu_logits, cpu_logits) << "penalised logits";
      }
    }
  }
  EXPECT_GE(same, total - 2) << same << " of " << total << " draws agree";
}

// Without top_k / top_p a row is split over blocks (sample.cu's split form): the same tokens, penalised logits and
// flags as the one-block form (SOLTRAIN_SAMPLE_SPLIT=0), bit for bit, whatever the chunk count (a vocabulary under
// one chunk, Qwen3's 152k in 19 uneven ones) and on coarse logits full of exact ties.
TEST_F(CudaSampling, SplitRowsDrawWhatOneBlockDraws) {
  struct Shape {
    int64_t B, V;
    bool coarse;
  };
  for (const Shape& sh : {Shape{64, 151936, false}, Shape{7, 5000, true}, Shape{300, 20000, true}}) {
    const int64_t B = sh.B, V = sh.V;
    std::vector<float> logits = randn(size_t(B * V), 3.0f);
    if (sh.coarse)
      for (float& x : logits) x = std::round(x * 2) / 2;
    std::vector<uint8_t> seen(size_t(B * V), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int k = 0; k < 40; ++k) seen[size_t(b * V + int64_t(rng() % uint64_t(V)))] = 1;
    for (const SamplingParams& p :
         {SamplingParams{}, SamplingParams{1.0f, 0, 1.0f, 7}, SamplingParams{0.7f, 0, 1.0f, 8},
          SamplingParams{1.2f, 0, 1.0f, 11, 0.1f}, SamplingParams{1.0f, 0, 1.0f, 12, 0, 1.3f},
          SamplingParams{0.6f, 0, 1.0f, 13, 0.01f, 0.9f}, SamplingParams{0, 0, 1.0f, 0, 0, 1.5f}}) {
      SCOPED_TRACE(testing::Message() << "B " << B << " V " << V << " T " << p.temperature << " min_p " << p.min_p
                                      << " repetition_penalty " << p.repetition_penalty);
      for (uint64_t step : {0, 3}) {
        std::vector<uint8_t> split_flags = seen, block_flags = seen;
        const bool penalty = p.repetition_penalty != 1;
        const std::vector<int32_t> split = both(logits, B, V, p, step, penalty ? &split_flags : nullptr).first;
        const std::vector<float> split_logits = gpu_logits, split_logp = gpu_logp;
        setenv("SOLTRAIN_SAMPLE_SPLIT", "0", 1);
        const std::vector<int32_t> block = both(logits, B, V, p, step, penalty ? &block_flags : nullptr).first;
        unsetenv("SOLTRAIN_SAMPLE_SPLIT");
        EXPECT_EQ(split, block);
        EXPECT_EQ(split_logits, gpu_logits) << "penalised logits";
        EXPECT_EQ(split_logp, gpu_logp) << "drawn log-probs";
      }
    }
  }
}

TEST_F(CudaSampling, TiesAtTheThresholdsAreTakenInTokenOrder) {
  // Logits on a coarse grid: many exact ties at the k-th value and at the top-p boundary.
  const int64_t B = 64, V = 5000;
  std::vector<float> logits = randn(size_t(B * V), 2.0f);
  for (float& x : logits) x = std::round(x * 2) / 2;
  int total = 0, same = 0;
  for (const SamplingParams& p : {SamplingParams{1.0f, 37, 1.0f, 3}, SamplingParams{1.0f, 0, 0.5f, 4},
                                  SamplingParams{0.8f, 300, 0.7f, 5}, SamplingParams{1.0f, 1, 1.0f, 6}}) {
    SCOPED_TRACE(testing::Message() << "top_k " << p.top_k << " top_p " << p.top_p);
    const auto [g, c] = both(logits, B, V, p, 1);
    for (int64_t b = 0; b < B; ++b) same += g[size_t(b)] == c[size_t(b)];
    total += int(B);
  }
  EXPECT_GE(same, total - 1) << same << " of " << total;
}

TEST_F(CudaSampling, DrawsFollowTheirDistributionAndRepeat) {
  const std::vector<float> row{1.3f, -0.4f, 2.1f, 0.2f, 0.9f, -1.5f, 1.8f};
  const int64_t B = 40000, V = int64_t(row.size());
  std::vector<float> logits;
  for (int64_t b = 0; b < B; ++b) logits.insert(logits.end(), row.begin(), row.end());
  for (const SamplingParams& p : {SamplingParams{1.0f, 0, 1.0f, 3}, SamplingParams{1.2f, 5, 0.9f, 7},
                                  SamplingParams{1.0f, 0, 1.0f, 8, 0.25f}, SamplingParams{0.8f, 5, 0.9f, 11, 0.05f}}) {
    SCOPED_TRACE(testing::Message() << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
                                    << " min_p " << p.min_p);
    const auto [g, c] = both(logits, B, V, p, 2);
    expect_draws_follow(g, expected_distribution(row, p));
    EXPECT_EQ(g, both(logits, B, V, p, 2).first) << "the same seed and step draw the same tokens";
  }
}

}  // namespace
}  // namespace soltrain::test
