// Helpers for CUDA tests: a fixture that skips (saying why) without a GPU, uploads of bf16-rounded random
// data, downloads widened to fp32, and NaN poisoning so unwritten outputs can never pass.
#pragma once
#include <limits>

#include "core/error.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace soltrain::test {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      gpu = make_cuda_ops();
    } catch (const UserError& e) {
      GTEST_SKIP() << "skipped, no GPU here: " << e.what();
    }
    cpu = make_cpu_ops();
    const uint32_t seed = test_seed(12345u);
    rng.seed(seed);
    seed_trace_ = std::make_unique<::testing::ScopedTrace>(__FILE__, __LINE__, seed_message(seed));
  }

  // Fresh normal(0, scale) values rounded to bf16, so CPU and GPU see identical inputs.
  std::vector<float> randn(size_t n, float scale = 1.0f) {
    auto v = random_vec(n, rng, scale);
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }
  Tensor upload(const std::vector<float>& h, Shape s, DType dt = DType::BF16) {
    SOLTRAIN_CHECK(size_t(shape_numel(s)) == h.size(), "upload size");
    buffers.push_back(gpu->alloc(h.size() * dtype_size(dt)));
    Tensor t{buffers.back().data(), dt, std::move(s), Device::CUDA};
    if (dt == DType::F32) {
      gpu->copy(t, Tensor{const_cast<float*>(h.data()), DType::F32, t.shape});
    } else {
      std::vector<uint16_t> b(h.size());
      for (size_t i = 0; i < h.size(); ++i) b[i] = f32_to_bf16(h[i]);
      gpu->copy(t, Tensor{b.data(), DType::BF16, t.shape});
    }
    return t;
  }
  Tensor upload_i32(const std::vector<int32_t>& h) {
    buffers.push_back(gpu->alloc(h.size() * 4));
    Tensor t{buffers.back().data(), DType::I32, {int64_t(h.size())}, Device::CUDA};
    gpu->copy(t, Tensor{const_cast<int32_t*>(h.data()), DType::I32, t.shape});
    return t;
  }
  // An output tensor filled with NaN.
  Tensor poisoned(Shape s, DType dt = DType::BF16) {
    const std::vector<float> nan(size_t(shape_numel(s)), std::numeric_limits<float>::quiet_NaN());
    return upload(nan, s, dt);
  }
  std::vector<float> download(const Tensor& t) {
    std::vector<float> out(size_t(t.numel()));
    if (t.dtype == DType::F32) {
      gpu->copy(Tensor{out.data(), DType::F32, t.shape}, t);
    } else {
      std::vector<uint16_t> b(out.size());
      gpu->copy(Tensor{b.data(), DType::BF16, t.shape}, t);
      for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_f32(b[i]);
    }
    return out;
  }
  static Tensor host(std::vector<float>& v, Shape s) { return Tensor{v.data(), DType::F32, std::move(s)}; }
  static Tensor host_i32(std::vector<int32_t>& v) { return Tensor{v.data(), DType::I32, {int64_t(v.size())}}; }

  std::unique_ptr<Ops> gpu, cpu;
  std::vector<Buffer> buffers;
  std::mt19937 rng;
  std::unique_ptr<::testing::ScopedTrace> seed_trace_;  // prints the seed with every failure of the test
};

inline double rel(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return rel_err(got.data(), want.data(), std::min(got.size(), want.size()));
}

}  // namespace soltrain::test
