// CPU: copies, fills, residual adds, reductions and scaling over flat tensors.
#include <cstdlib>
#include <cstring>

#include "core/device_memory.h"
#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

std::unique_ptr<Ops> make_cpu_ops() {
  return std::make_unique<CpuOps>();
}

Buffer CpuOps::alloc(size_t bytes) {
  Buffer b = Buffer::host(bytes, [](void* q) {
    device_freed(q);
    std::free(q);
  });
  device_allocated(b.data(), bytes);
  return b;
}

void CpuOps::copy(Tensor dst, const Tensor& src) {
  SOLTRAIN_CHECK(dst.bytes() == src.bytes() && dst.dtype == src.dtype, "copy ", shape_str(src.shape), " -> ",
                 shape_str(dst.shape));
  std::memcpy(dst.data, src.data, src.bytes());
}

void CpuOps::convert(Tensor dst, const Tensor& src) {
  if (dst.dtype == src.dtype) return copy(dst, src);
  SOLTRAIN_CHECK(dst.numel() == src.numel(), "convert ", shape_str(src.shape), " -> ", shape_str(dst.shape));
  const int64_t n = src.numel();
  if (dst.dtype == DType::F32 && src.dtype == DType::BF16) {
    const uint16_t* s = src.as<uint16_t>();
    float* d = dst.f32();
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  SOLTRAIN_CHECK(dst.dtype == DType::BF16 && src.dtype == DType::F32, "convert ", dtype_name(src.dtype), " -> ",
                 dtype_name(dst.dtype));
  const float* s = src.f32();
  uint16_t* d = dst.as<uint16_t>();
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}

void CpuOps::zero(Tensor t) {
  std::memset(t.data, 0, t.bytes());
}

void CpuOps::add_inplace(Tensor x, const Tensor& y) {
  SOLTRAIN_CHECK(x.numel() == y.numel());
  float* a = x.f32();
  const float* b = y.f32();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) a[i] += b[i];
}

double CpuOps::sum(const Tensor& x) {
  const float* a = x.f32();
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += a[i];
  return s;
}

double CpuOps::sum_squares(const Tensor& x) {
  const float* a = x.f32();
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += double(a[i]) * a[i];
  return s;
}

void CpuOps::reduce_sum(Tensor out, const Tensor& x, bool squares, bool accumulate) {
  SOLTRAIN_CHECK(out.dtype == DType::F64 && out.numel() == 1, "reduce_sum into ", dtype_name(out.dtype));
  const double s = squares ? sum_squares(x) : sum(x);
  double* o = out.as<double>();
  *o = accumulate ? *o + s : s;
}

void CpuOps::segment_sum(Tensor out, const Tensor& x, const Tensor& cu_seqlens) {
  const int32_t* cu = cu_seqlens.i32();
  const float* a = x.f32();
  SOLTRAIN_CHECK(out.numel() == cu_seqlens.numel() - 1, "segment_sum: ", out.numel(), " outputs for ",
                 cu_seqlens.numel() - 1, " documents");
  for (int64_t d = 0; d < out.numel(); ++d) {
    double s = 0;
    for (int32_t i = cu[d]; i < cu[d + 1]; ++i) s += a[i];
    out.f32()[d] = float(s);
  }
}

void CpuOps::fill(Tensor x, float value) {
  float* a = x.f32();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) a[i] = value;
}

void CpuOps::scale(Tensor x, float factor) {
  float* a = x.f32();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) a[i] *= factor;
}

}  // namespace soltrain
