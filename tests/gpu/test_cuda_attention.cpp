// Our flash attention against the CPU reference: causal, GQA/MQA, packed documents, head dims 16-128. On a
// Hopper GPU head dims 64 and 128 run the sm_90a kernels; the Portable suite runs the sm_80 ones there too,
// the Fused suites the Hopper backward's fused forms.
#include <cuda_runtime.h>

#include <cstdlib>

#include "gpu_test_util.h"
#include "kernels/cuda/attention_sm90.h"

namespace soltrain::test {
namespace {

struct Case {
  std::vector<int32_t> cu;
  int64_t H, Hkv, hd;
};

// Each token's position in its document, and the longest document, for packed documents `cu`.
std::pair<std::vector<int32_t>, int> positions(const std::vector<int32_t>& cu) {
  std::vector<int32_t> pos;
  int max_len = 0;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    max_len = std::max(max_len, cu[d + 1] - cu[d]);
    for (int32_t i = cu[d]; i < cu[d + 1]; ++i) pos.push_back(i - cu[d]);
  }
  return {pos, max_len};
}

class CudaAttention : public CudaTest, public ::testing::WithParamInterface<Case> {
 protected:
  void check(const Case& c);
  bool repeatable_ = true;  // the backward gives the same bits twice
};

// The same checks with SOLTRAIN_ATTENTION=portable, which the backend reads when it is made.
class CudaAttentionPortable : public CudaAttention {
 protected:
  void SetUp() override {
    setenv("SOLTRAIN_ATTENTION", "portable", 1);
    CudaAttention::SetUp();
    unsetenv("SOLTRAIN_ATTENTION");
  }
};

// The Hopper backward's fused forms (SOLTRAIN_ATTENTION_BACKWARD, read when the backend is made): dQ inside
// the dK/dV kernel, added in any order (atomic) or in a fixed one (ordered, bitwise repeatable). Head dim
// 128 runs them; the other cases check that the rest still run split.
class CudaAttentionFusedAtomic : public CudaAttention {
 protected:
  void SetUp() override {
    setenv("SOLTRAIN_ATTENTION_BACKWARD", "atomic", 1);
    CudaAttention::SetUp();
    unsetenv("SOLTRAIN_ATTENTION_BACKWARD");
    repeatable_ = false;
  }
};
class CudaAttentionFusedOrdered : public CudaAttention {
 protected:
  void SetUp() override {
    setenv("SOLTRAIN_ATTENTION_BACKWARD", "ordered", 1);
    CudaAttention::SetUp();
    unsetenv("SOLTRAIN_ATTENTION_BACKWARD");
  }
};

// The split backward launched longest first (SOLTRAIN_ATTENTION_ORDER=longest: the atomic form's order, a
// candidate for split's default), and the atomic form shortest first.
class CudaAttentionLongestFirst : public CudaAttention {
 protected:
  void SetUp() override {
    setenv("SOLTRAIN_ATTENTION_ORDER", "longest", 1);
    CudaAttention::SetUp();
    unsetenv("SOLTRAIN_ATTENTION_ORDER");
  }
};
class CudaAttentionFusedAtomicShortestFirst : public CudaAttention {
 protected:
  void SetUp() override {
    setenv("SOLTRAIN_ATTENTION_BACKWARD", "atomic", 1);
    setenv("SOLTRAIN_ATTENTION_ORDER", "shortest", 1);
    CudaAttention::SetUp();
    unsetenv("SOLTRAIN_ATTENTION_BACKWARD");
    unsetenv("SOLTRAIN_ATTENTION_ORDER");
    repeatable_ = false;
  }
};

// The setting (Ops::set_attention_backward: what `attention_backward:` in a config and bench's
// --attention-backward call) picks the form as the environment does, and the backend reports it; with
// SOLTRAIN_ATTENTION_BACKWARD set, the environment wins.
class CudaAttentionFusedBySetting : public CudaAttention {
 protected:
  void SetUp() override {
    CudaAttention::SetUp();
    if (IsSkipped()) return;
    gpu->set_attention_backward(AttentionBackward::Ordered);
  }
};
TEST_P(CudaAttentionFusedBySetting, ForwardAndBackwardMatchTheCpu) {
  ASSERT_EQ(gpu->attention_backward_form(), AttentionBackward::Ordered);
  check(GetParam());  // (ordered: repeatable, as check() asks by default)
}
TEST_F(CudaTest, AttentionFusedEnvironmentWinsOverTheSetting) {
  EXPECT_EQ(gpu->attention_backward_form(), AttentionBackward::Split);  // the default
  setenv("SOLTRAIN_ATTENTION_BACKWARD", "atomic", 1);
  const std::unique_ptr<Ops> other = make_cuda_ops();
  unsetenv("SOLTRAIN_ATTENTION_BACKWARD");
  other->set_attention_backward(AttentionBackward::Ordered);
  EXPECT_EQ(other->attention_backward_form(), AttentionBackward::Atomic);
  gpu->set_attention_backward(AttentionBackward::Atomic);
  EXPECT_EQ(gpu->attention_backward_form(), AttentionBackward::Atomic);
}

TEST_P(CudaAttention, ForwardAndBackwardMatchTheCpu) {
  check(GetParam());
}
TEST_P(CudaAttentionPortable, ForwardAndBackwardMatchTheCpu) {
  check(GetParam());
}
TEST_P(CudaAttentionFusedAtomic, ForwardAndBackwardMatchTheCpu) {
  check(GetParam());
}
TEST_P(CudaAttentionFusedOrdered, ForwardAndBackwardMatchTheCpu) {
  check(GetParam());
}
TEST_P(CudaAttentionLongestFirst, ForwardAndBackwardMatchTheCpu) {
  check(GetParam());
}
TEST_P(CudaAttentionFusedAtomicShortestFirst, ForwardAndBackwardMatchTheCpu) {
  check(GetParam());
}

void CudaAttention::check(const Case& c) {
  const int64_t N = c.cu.back(), H = c.H, Hkv = c.Hkv, hd = c.hd;
  std::vector<int32_t> cu = c.cu;
  auto [pos, max_len] = positions(cu);  // (host_i32 takes them mutable)
  auto q = randn(static_cast<size_t>(N * H * hd)), k = randn(static_cast<size_t>(N * Hkv * hd)),
       v = randn(static_cast<size_t>(N * Hkv * hd));
  auto dout = randn(static_cast<size_t>(N * H * hd));
  const float scale = 1.0f / std::sqrt(float(hd));
  // CPU reference on the same (bf16-representable) inputs
  std::vector<float> out(q.size()), lse(static_cast<size_t>(H * N)), dq(q.size()), dk(k.size()), dv(v.size());
  const SeqLayout cs{host_i32(cu), host_i32(pos), max_len};
  cpu->attention_forward(host(out, {N, H, hd}), host(lse, {H, N}), host(q, {N, H, hd}), host(k, {N, Hkv, hd}),
                         host(v, {N, Hkv, hd}), cs, scale);
  // The GPU's backward sees its own (bf16) output, as in training; the CPU's its own.
  cpu->attention_backward(host(dq, {N, H, hd}), host(dk, {N, Hkv, hd}), host(dv, {N, Hkv, hd}), host(dout, {N, H, hd}),
                          host(q, {N, H, hd}), host(k, {N, Hkv, hd}), host(v, {N, Hkv, hd}), host(out, {N, H, hd}),
                          host(lse, {H, N}), cs, scale);

  const SeqLayout gs{upload_i32(cu), upload_i32(pos), max_len};
  Tensor gq = upload(q, {N, H, hd}), gk = upload(k, {N, Hkv, hd}), gv = upload(v, {N, Hkv, hd});
  Tensor gout = poisoned({N, H, hd}), glse = poisoned({H, N}, DType::F32);
  gpu->attention_forward(gout, glse, gq, gk, gv, gs, scale);
  Tensor gdq = poisoned({N, H, hd}), gdk = poisoned({N, Hkv, hd}), gdv = poisoned({N, Hkv, hd});
  gpu->attention_backward(gdq, gdk, gdv, upload(dout, {N, H, hd}), gq, gk, gv, gout, glse, gs, scale);

  EXPECT_LE(rel(download(gout), out), 1e-2);
  EXPECT_LE(rel(download(glse), lse), 1e-4);
  EXPECT_LE(rel(download(gdq), dq), 2e-2);
  EXPECT_LE(rel(download(gdk), dk), 2e-2);
  EXPECT_LE(rel(download(gdv), dv), 2e-2);
  // Element by element as well (one wrong query row in 2600 hides under the L2 bounds above): bf16 rounding
  // stays within a few percent of each tensor's scale, a wrong row is off by its whole magnitude.
  EXPECT_TRUE(all_close(download(gout), out, 0.08 * rms(out), 0.02)) << "out";
  EXPECT_TRUE(all_close(download(glse), lse, 1e-3, 1e-4)) << "lse";
  EXPECT_TRUE(all_close(download(gdq), dq, 0.15 * rms(dq), 0.05)) << "dq";
  EXPECT_TRUE(all_close(download(gdk), dk, 0.15 * rms(dk), 0.05)) << "dk";
  EXPECT_TRUE(all_close(download(gdv), dv, 0.15 * rms(dv), 0.05)) << "dv";

  // bitwise repeatable (dK and dV always; dQ unless its adds may land in any order)
  const auto dq1 = download(gdq), dk1 = download(gdk), dv1 = download(gdv);
  gpu->attention_backward(gdq, gdk, gdv, upload(dout, {N, H, hd}), gq, gk, gv, gout, glse, gs, scale);
  if (repeatable_) {
    EXPECT_EQ(download(gdq), dq1);
  }
  EXPECT_EQ(download(gdk), dk1);
  EXPECT_EQ(download(gdv), dv1);
}

// The ordered form's turn counters after one backward, read from the kernel's own scratch: tile q0 of every
// (document, head) is added to by key blocks 0 .. q0 / 128, once each, so it must hold q0 / 128 + 1 (a wrong
// rank would hang and trap, or leave another count while the results still happen to match).
class CudaAttentionFusedOrderedTurns : public CudaTest {};
TEST_F(CudaAttentionFusedOrderedTurns, EveryKeyBlockTakesItsTurnOnce) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) GTEST_SKIP() << "the sm_90a kernels need compute capability 9.0";
  const std::vector<int32_t> cu{0, 700, 1100, 1101};  // ragged ends, and a one-token document
  const int64_t N = cu.back(), H = 4, Hkv = 2, hd = 128, docs = int64_t(cu.size()) - 1;
  const auto [pos, max_len] = positions(cu);
  const auto q = randn(size_t(N * H * hd)), k = randn(size_t(N * Hkv * hd)), v = randn(size_t(N * Hkv * hd)),
             dout = randn(size_t(N * H * hd));
  const SeqLayout gs{upload_i32(cu), upload_i32(pos), max_len};
  const Tensor gq = upload(q, {N, H, hd}), gk = upload(k, {N, Hkv, hd}), gv = upload(v, {N, Hkv, hd}),
               gdout = upload(dout, {N, H, hd});
  Tensor gout = poisoned({N, H, hd}), glse = poisoned({H, N}, DType::F32);
  const float scale = 1.0f / std::sqrt(float(hd));
  gpu->attention_forward(gout, glse, gq, gk, gv, gs, scale);
  const std::vector<float> out = download(gout);
  std::vector<float> delta(size_t(H * N), 0.f);  // Σ_d dO·O, as the backend computes it before the kernels
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < hd; ++d)
        delta[size_t(h * N + n)] += dout[size_t((n * H + h) * hd + d)] * out[size_t((n * H + h) * hd + d)];
  const Tensor gdelta = upload(delta, {H, N}, DType::F32);
  Tensor gdq = poisoned({N, H, hd}), gdk = poisoned({N, Hkv, hd}), gdv = poisoned({N, Hkv, hd});
  const size_t bytes = cuda::flash_backward_sm90_scratch(cuda::AttentionBackward::Ordered, gq, gs);
  // fp32 sums: one 64 x 128 tile per (document tile, head), tokens / 64 + documents + 1 of them; then the turns
  const size_t sums = size_t(N / 64 + docs + 1) * size_t(H) * 64 * 128 * sizeof(float),
               tiles = size_t((max_len + 63) / 64);
  ASSERT_EQ(bytes, sums + size_t(docs * H) * tiles * sizeof(int));
  buffers.push_back(gpu->alloc(bytes));
  unsigned char* const scratch = static_cast<unsigned char*>(buffers.back().data());
  gpu->synchronize();  // the uploads ran on the backend's streams; this launch goes on the default one
  cuda::flash_backward_sm90(gdq, gdk, gdv, gdout, gq, gk, gv, glse, gdelta.f32(), gs, scale,
                            cuda::AttentionBackward::Ordered, cuda::LaunchOrder::Default, scratch, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> turns(size_t(docs * H) * tiles);
  ASSERT_EQ(cudaMemcpy(turns.data(), scratch + sums, turns.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t doc = 0; doc < docs; ++doc)
    for (int64_t h = 0; h < H; ++h)
      for (size_t t = 0; t < tiles; ++t) {
        const int64_t q0 = int64_t(t) * 64, len = cu[size_t(doc) + 1] - cu[size_t(doc)];
        EXPECT_EQ(turns[size_t(doc * H + h) * tiles + t], q0 < len ? int(q0 / 128 + 1) : 0)
            << "document " << doc << ", head " << h << ", query tile " << t;
      }
}

const auto kCases = ::testing::Values(Case{{0, 200, 333}, 4, 2, 64},           // packed, GQA 2:1
                                      Case{{0, 256}, 8, 2, 128},               // GQA 4:1, hd 128
                                      Case{{0, 77, 100, 190}, 4, 1, 16},       // MQA, tiny head dim
                                      Case{{0, 130}, 6, 2, 24},                // hd not a multiple of 16
                                      Case{{0, 1, 65, 129}, 2, 2, 32},         // a one-token document
                                      Case{{0, 700, 1024}, 4, 4, 128},         // MHA, longer
                                      Case{{0, 1000, 1300, 2600}, 4, 2, 128},  // many tiles, ragged ends
                                      Case{{0, 520, 1500}, 6, 3, 64},          // hd 64, several tiles
                                      Case{{0, 1, 3, 140, 141}, 4, 2, 128},    // one-token documents
                                      Case{{0, 17, 300}, 2, 1, 64},            // MQA, hd 64
                                      Case{{0, 100, 300, 640}, 8, 4, 128});    // 12 (document, KV head) pairs
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, kCases);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionPortable, kCases);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionFusedAtomic, kCases);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionFusedOrdered, kCases);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionLongestFirst, kCases);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionFusedAtomicShortestFirst, kCases);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionFusedBySetting, kCases);

}  // namespace
}  // namespace soltrain::test
