// QAT's fake quantisation (kernels/cuda/fake_quant.cu) against its CPU twin (kernels/cpu/fake_quant.cpp) on fresh
// random tensors: fp32 inputs give the CPU's values bit for bit, forward and backward, for every scheme and both
// kernel shapes (groups of up to 64 a thread, longer ones a block); Int4Weight's backward to 1e-6 (its terms at a
// group's extremes are sums, the CPU's in double, the device's in fp32 in another order). bf16 inputs (what a run feeds it) give the CPU's
// values on the same inputs rounded once to bf16 (Int8Token's qparams computed in bf16 as torchao does: its CPU twin is
// the fp32 arithmetic, so that scheme is checked in fp32 only). And the NVFP4 base's dequantise kernel equals the CPU's.
#include "gpu_test_util.h"
#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"

namespace soltrain::test {
namespace {

class CudaFakeQuant : public CudaTest {};

const FakeQuant kSchemes[] = {{FakeQuantKind::Int4Weight, 32},
                              {FakeQuantKind::Int4Weight, 256},
                              {FakeQuantKind::Int8Token, 0},
                              {FakeQuantKind::Mxfp4, 32},
                              {FakeQuantKind::Nvfp4, 16}};

TEST_F(CudaFakeQuant, Fp32ForwardAndBackwardEqualTheCpuTwinBitForBit) {
  const int64_t R = 24, C = 512;
  for (const FakeQuant& q : kSchemes) {
    SCOPED_TRACE(int(q.kind) * 1000 + q.group);
    std::vector<float> x = randn(size_t(R * C), 0.7f), g = randn(size_t(R * C)), acc = randn(size_t(R * C));
    x[5] = x[6];  // a tie at a group's extreme: amin/amax share its gradient
    std::vector<float> want(x.size()), dx(acc), amax(1);
    cpu->fake_quantize(host(want, {R, C}), host(x, {R, C}), q, host(amax, {1}));
    const Tensor xd = upload(x, {R, C}, DType::F32), out = poisoned({R, C}, DType::F32);
    const Tensor am = poisoned({1}, DType::F32);
    gpu->fake_quantize(out, xd, q, am);
    EXPECT_EQ(download(out), want);
    cpu->fake_quantize_backward(host(dx, {R, C}), true, host(g, {R, C}), host(x, {R, C}), q);
    const Tensor dxd = upload(acc, {R, C}, DType::F32);
    gpu->fake_quantize_backward(dxd, true, upload(g, {R, C}, DType::F32), xd, q);
    if (q.kind == FakeQuantKind::Int4Weight)  // its extremes' terms are sums over a group: summed in another order
      EXPECT_LE(rel(download(dxd), dx), 1e-6);
    else
      EXPECT_EQ(download(dxd), dx);
  }
}

TEST_F(CudaFakeQuant, Bf16InputsGiveTheCpuValuesRoundedToBf16) {
  const int64_t R = 16, C = 256;
  for (const FakeQuant& q : kSchemes) {
    if (q.kind == FakeQuantKind::Int8Token) continue;  // (its bf16 qparams differ from the fp32 twin by design)
    SCOPED_TRACE(int(q.kind) * 1000 + q.group);
    const std::vector<float> x = randn(size_t(R * C), 0.3f);  // (bf16 values already)
    std::vector<float> want(x.size()), xs(x), amax(1);
    cpu->fake_quantize(host(want, {R, C}), host(xs, {R, C}), q, host(amax, {1}));
    if (q.kind != FakeQuantKind::Nvfp4)  // (Nvfp4 rounds code · scale's scale to bf16 first: within one bf16 step)
      for (float& v : want) v = bf16_to_f32(f32_to_bf16(v));
    const Tensor out = poisoned({R, C});
    gpu->fake_quantize(out, upload(x, {R, C}), q, poisoned({1}, DType::F32));
    const std::vector<float> got = download(out);
    if (q.kind == FakeQuantKind::Nvfp4)
      EXPECT_LE(rel(got, want), 4e-3);
    else
      EXPECT_EQ(got, want);
  }
}

TEST_F(CudaFakeQuant, Nvfp4BaseDequantisesAsTheCpu) {
  const int64_t out = 48, in = 160;
  const std::vector<float> w = randn(size_t(out * in), 0.05f);
  std::vector<uint8_t> codes(size_t(out * in / 2)), scale(size_t(quant::nvfp4_scale_bytes(out, in)));
  nvfp4_quantize(w.data(), out, in, codes.data(), scale.data());
  std::vector<float> want(w.size());
  nvfp4_dequantize(codes.data(), scale.data(), out, in, want.data());
  for (float& v : want) v = bf16_to_f32(f32_to_bf16(v));
  buffers.push_back(gpu->alloc(codes.size()));
  const Tensor c{buffers.back().data(), DType::U8, {int64_t(codes.size())}, Device::CUDA};
  gpu->copy(c, Tensor{codes.data(), DType::U8, c.shape});
  buffers.push_back(gpu->alloc(scale.size()));
  const Tensor s{buffers.back().data(), DType::U8, {int64_t(scale.size())}, Device::CUDA};
  gpu->copy(s, Tensor{scale.data(), DType::U8, s.shape});
  const Tensor got = poisoned({out, in});
  gpu->dequantize(got, Weight(c, WeightFormat::Nvfp4, s, {out, in}));
  EXPECT_EQ(download(got), want);
}

}  // namespace
}  // namespace soltrain::test
