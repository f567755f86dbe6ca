// The fp8-hybrid recipe's CUDA ops against their CPU twin: codes bitwise (both layouts, both formats,
// delayed and current scaling, ragged tiles), amax and scale updates bitwise, the FP8 GEMMs within their
// accumulation's rounding; then a model trained with the recipe on the GPU next to the CPU twin and bf16.
#include "data/batch_file.h"
#include "gpu_test_util.h"
#include "kernels/quant.h"
#include "model/checkpoint.h"
#include "train/trainer.h"

namespace soltrain::test {
namespace {

using CudaFp8 = CudaTest;

std::vector<uint8_t> download8(Ops& gpu, const Tensor& t) {
  std::vector<uint8_t> v(size_t(t.numel()));
  gpu.copy(Tensor{v.data(), t.dtype, t.shape}, t);
  return v;
}

TEST_F(CudaFp8, QuantiseEqualsTheCpuTwinBitForBit) {
  if (!gpu->fp8_unsupported().empty()) GTEST_SKIP() << gpu->fp8_unsupported();
  for (auto [R, C] : {std::pair{128, 192}, {80, 48}, {4096, 1024}, {16, 4104}, {72, 136}}) {
    for (const bool e5 : {false, true})
      for (const bool current : {true, false}) {
        SCOPED_TRACE(cat(R, "x", C, e5 ? " e5m2" : " e4m3", current ? " current" : " delayed"));
        const DType t = e5 ? DType::F8E5M2 : DType::F8E4M3;
        auto x = randn(size_t(R * C), e5 ? 1e-5f : 2.0f);
        // An outlier (bf16-representable, as every input here): saturates under the delayed scale below.
        x[size_t(R * C / 2)] = e5 ? 0.0029296875f : 900.0f;
        std::vector<float> scale{e5 ? 2.5e-7f : 1.0f / 0.75f, e5 ? 4e6f : 0.75f, 0, 0}, amax{0.5f * (e5 ? 1e-5f : 1.0f)};
        Tensor gs = upload(scale, {4}, DType::F32), ga = upload(amax, {1}, DType::F32), gx = upload(x, {R, C});
        buffers.push_back(gpu->alloc(size_t(R * C)));
        const Tensor gq{buffers.back().data(), t, {R, C}, Device::CUDA};
        buffers.push_back(gpu->alloc(size_t(R * C)));
        const Tensor gqt{buffers.back().data(), t, {C, R}, Device::CUDA};
        gpu->fp8_quantize(gq, gqt, gx, Ops::Fp8Scaling{gs, ga, current});
        std::vector<uint8_t> q(size_t(R * C)), qt(size_t(R * C));
        cpu->fp8_quantize(Tensor{q.data(), t, {R, C}}, Tensor{qt.data(), t, {C, R}}, host(x, {R, C}),
                          Ops::Fp8Scaling{host(scale, {4}), host(amax, {1}), current});
        EXPECT_EQ(download8(*gpu, gq), q);
        EXPECT_EQ(download8(*gpu, gqt), qt);
        EXPECT_EQ(download(gs), scale);
        EXPECT_EQ(download(ga), amax);
        // The row-only form writes the same codes.
        gpu->fp8_quantize(gqt.view({R, C}), {}, gx, Ops::Fp8Scaling{gs, {}, false});
        EXPECT_EQ(download8(*gpu, gqt), q);
      }
  }
}

TEST_F(CudaFp8, UpdateScalesEqualsTheCpuTwin) {
  const int64_t Q = 37, H = 1024;
  std::vector<float> hist = randn(size_t(Q * H)), scales = randn(size_t(4 * Q));
  for (float& h : hist) h = std::fabs(h);
  for (int64_t i = 0; i < H; ++i) hist[size_t(5 * H + i)] = 0;
  Tensor gh = upload(hist, {Q, H}, DType::F32), gs = upload(scales, {Q, 4}, DType::F32);
  gpu->fp8_update_scales(gh, gs, quant::kE5m2Max, 2);
  cpu->fp8_update_scales(host(hist, {Q, H}), host(scales, {Q, 4}), quant::kE5m2Max, 2);
  EXPECT_EQ(download(gh), hist);
  EXPECT_EQ(download(gs), scales);
}

TEST_F(CudaFp8, MatmulMatchesTheCpuTwin) {
  if (!gpu->fp8_unsupported().empty()) GTEST_SKIP() << gpu->fp8_unsupported();
  for (auto [M, N, K] : {std::tuple{64, 96, 128}, {2048, 1024, 4096}, {48, 32, 160}}) {
    for (const bool weight_grad : {false, true}) {
      SCOPED_TRACE(cat(M, "x", N, "x", K, weight_grad ? " wgrad (fp32 out, +=)" : " bf16 out"));
      // Quantise random operands on both sides (bitwise equal, checked above), then multiply.
      auto a = randn(size_t(M * K)), b = randn(size_t(N * K), 0.05f), y0 = randn(size_t(M * N));
      std::vector<float> sa{1, 1, 0, 0}, sb{1, 1, 0, 0}, bias = randn(size_t(N));
      const DType ta = weight_grad ? DType::F8E5M2 : DType::F8E4M3;
      Tensor gsa = upload(sa, {4}, DType::F32), gsb = upload(sb, {4}, DType::F32);
      buffers.push_back(gpu->alloc(size_t(M * K)));
      const Tensor ga{buffers.back().data(), ta, {M, K}, Device::CUDA};
      buffers.push_back(gpu->alloc(size_t(N * K)));
      const Tensor gb{buffers.back().data(), DType::F8E4M3, {N, K}, Device::CUDA};
      gpu->fp8_quantize(ga, {}, upload(a, {M, K}), Ops::Fp8Scaling{gsa, {}, true});
      gpu->fp8_quantize(gb, {}, upload(b, {N, K}), Ops::Fp8Scaling{gsb, {}, true});
      std::vector<uint8_t> qa(size_t(M * K)), qb(size_t(N * K));
      cpu->fp8_quantize(Tensor{qa.data(), ta, {M, K}}, {}, host(a, {M, K}), Ops::Fp8Scaling{host(sa, {4}), {}, true});
      cpu->fp8_quantize(Tensor{qb.data(), DType::F8E4M3, {N, K}}, {}, host(b, {N, K}),
                        Ops::Fp8Scaling{host(sb, {4}), {}, true});
      std::vector<float> y = y0;
      Tensor gy = weight_grad ? upload(y0, {M, N}, DType::F32) : poisoned({M, N});
      Tensor gbias = upload(bias, {N}), cbias = host(bias, {N});
      gpu->fp8_matmul(gy, ga, gsa, gb, gsb, weight_grad ? nullptr : &gbias, 0.5f, weight_grad, weight_grad);
      cpu->fp8_matmul(host(y, {M, N}), Tensor{qa.data(), ta, {M, K}}, host(sa, {4}),
                      Tensor{qb.data(), DType::F8E4M3, {N, K}}, host(sb, {4}), weight_grad ? nullptr : &cbias, 0.5f,
                      weight_grad, weight_grad);
      if (weight_grad) {
        // fp32 out, precise accumulation: Hopper's FP8 MMA keeps fewer bits than fp32 between its promotions to
        // fp32 registers, so a K of 4096 sums differ from sgemm's by up to ~1e-4 (measured 2.9e-5 to 8.8e-5).
        EXPECT_LE(rel(download(gy), y), 3e-4);
      } else {
        EXPECT_LE(rel(download(gy), y), 1e-2);  // bf16 output, Hopper's fast accumulation
      }
    }
  }
}

// A Qwen3 fixture trained 5 steps with fp8-hybrid on the GPU: near the CPU twin's FP8 run (same codes, GEMMs
// differ in accumulation order and bf16 activations) and near bf16 training, but not equal to it.
TEST_F(CudaFp8, TrainingWithTheRecipeTracksTheCpuTwinAndBf16) {
  if (!gpu->fp8_unsupported().empty()) GTEST_SKIP() << gpu->fp8_unsupported();
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  const OptimizerConfig opt{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  auto run = [&](Ops& ops, bool fp8) {
    auto model = load_pretrained(dir, ops);
    if (fp8) {
      Fp8Settings s;
      s.amax_history = 4;
      model->enable_fp8(s);
    }
    return train_on_batch(*model, batch, opt, 5).losses;
  };
  const auto gpu_fp8 = run(*gpu, true), cpu_fp8 = run(*cpu, true), gpu_bf16 = run(*gpu, false);
  ASSERT_EQ(gpu_fp8.size(), cpu_fp8.size());
  for (size_t i = 0; i < gpu_fp8.size(); ++i) {
    EXPECT_NEAR(gpu_fp8[i], cpu_fp8[i], 2e-2 * cpu_fp8[i]) << "step " << i;
    EXPECT_NEAR(gpu_fp8[i], gpu_bf16[i], 3e-2 * gpu_bf16[i]) << "step " << i;
  }
  EXPECT_NE(gpu_fp8, gpu_bf16);
  EXPECT_LT(gpu_fp8.back(), gpu_fp8.front());
}

}  // namespace
}  // namespace soltrain::test
