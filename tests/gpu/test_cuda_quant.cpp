// The CUDA dequantise kernels (kernels/cuda/dequantize.cu) against their CPU twin on fresh random weights:
// bit for bit after the one rounding to bf16 (odd shapes take the scalar paths), and the CUDA linear ops on a
// quantised weight equal the bf16 ops on the dequantised weight (QLoRA's forward and dx).
#include "gpu_test_util.h"
#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"

namespace soltrain::test {
namespace {

struct Quantised {
  std::vector<uint8_t> codes, scale;
  Weight host, device;
  std::vector<float> dequantised;  // the CPU twin, fp32
};

class CudaQuant : public CudaTest {
 protected:
  // w quantised on the host (the CPU twin), as a host Weight and a copy on the device.
  Quantised quantise(WeightFormat f, const std::vector<float>& w, int64_t out, int64_t in);
};

Quantised CudaQuant::quantise(WeightFormat f, const std::vector<float>& w, int64_t out, int64_t in) {
  Ops& gpu = *this->gpu;
  Quantised q{{}, {}, Weight(Tensor{}), Weight(Tensor{}), std::vector<float>(w.size())};
  DType code_type = DType::U8, scale_type = DType::U8;
  Shape code_shape, scale_shape;
  if (f == WeightFormat::Nf4) {
    const quant::Nf4Layout l(out * in);
    q.codes.resize(size_t(l.data_bytes()));
    q.scale.resize(size_t(l.scale_bytes()));
    nf4_quantize(w.data(), out * in, q.codes.data(), q.scale.data());
    code_shape = {l.data_bytes()};
    scale_shape = {l.scale_bytes()};
  } else if (f == WeightFormat::Int8Row) {
    q.codes.resize(size_t(out * in));
    q.scale.resize(size_t(4 * out));
    int8_row_quantize(w.data(), out, in, q.codes.data(), reinterpret_cast<float*>(q.scale.data()));
    scale_type = DType::F32;
    code_shape = {out, in};
    scale_shape = {out};
  } else {
    const int64_t tiles = ((out + 127) / 128) * ((in + 127) / 128);
    q.codes.resize(size_t(out * in));
    q.scale.resize(size_t(4 * tiles));
    fp8_block_quantize(w.data(), out, in, q.codes.data(), reinterpret_cast<float*>(q.scale.data()));
    code_type = DType::F8E4M3, scale_type = DType::F32;
    code_shape = {out, in};
    scale_shape = {(out + 127) / 128, (in + 127) / 128};
  }
  q.host = Weight(Tensor{q.codes.data(), code_type, code_shape}, f, Tensor{q.scale.data(), scale_type, scale_shape},
                  {out, in});
  buffers.push_back(gpu.alloc(q.codes.size()));
  Tensor dc{buffers.back().data(), code_type, code_shape, Device::CUDA};
  buffers.push_back(gpu.alloc(q.scale.size()));
  Tensor ds{buffers.back().data(), scale_type, scale_shape, Device::CUDA};
  gpu.copy(dc, q.host.data);
  gpu.copy(ds, q.host.scale);
  q.device = Weight(dc, f, ds, {out, in});
  return q;
}

TEST_F(CudaQuant, DequantiseEqualsTheCpuTwinBitForBit) {
  // Even widths take the 8-wide paths; 37 x 523 the scalar ones (ragged NF4 tail, FP8 and int8 rows not a
  // multiple of 8).
  for (auto [out, in] : {std::pair<int64_t, int64_t>{384, 1024}, {300, 200}, {37, 523}})
    for (WeightFormat f : {WeightFormat::Nf4, WeightFormat::Fp8Block, WeightFormat::Int8Row}) {
      SCOPED_TRACE(cat(weight_format_name(f), " ", out, "x", in));
      auto w = randn(size_t(out * in), 0.03f);
      w[7] = 0.9f;  // an outlier block
      Quantised q = quantise(f, w, out, in);
      cpu->dequantize(host(q.dequantised, {out, in}), q.host);
      Tensor g = poisoned({out, in});
      gpu->dequantize(g, q.device);
      const std::vector<float> got = download(g);
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != bf16_to_f32(f32_to_bf16(q.dequantised[i])) && bad++ < 5)
          ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << q.dequantised[i];
      EXPECT_EQ(bad, 0u);
    }
}

TEST_F(CudaQuant, LinearOnAQuantisedWeightIsTheBf16OpOnItsDequantisedValues) {
  const int64_t N = 64, out = 256, in = 384;
  for (WeightFormat f : {WeightFormat::Nf4, WeightFormat::Fp8Block, WeightFormat::Int8Row}) {
    SCOPED_TRACE(std::string(weight_format_name(f)));
    Quantised q = quantise(f, randn(size_t(out * in), 0.03f), out, in);
    cpu->dequantize(host(q.dequantised, {out, in}), q.host);
    const Tensor dense = upload(q.dequantised, {out, in});  // rounded to bf16, as the kernel rounds
    const Tensor x = upload(randn(size_t(N * in)), {N, in}), dy = upload(randn(size_t(N * out)), {N, out});
    Tensor yq = poisoned({N, out}), yd = poisoned({N, out});
    gpu->linear_forward(yq, x, q.device, nullptr, 0.5f);
    gpu->linear_forward(yd, x, dense, nullptr, 0.5f);
    EXPECT_EQ(download(yq), download(yd));
    Tensor dxq = poisoned({N, in}), dxd = poisoned({N, in});
    gpu->linear_backward(&dxq, false, nullptr, nullptr, dy, x, q.device);
    gpu->linear_backward(&dxd, false, nullptr, nullptr, dy, x, dense);
    EXPECT_EQ(download(dxq), download(dxd));
  }
}

}  // namespace
}  // namespace soltrain::test
