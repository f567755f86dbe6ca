// CPU: token embedding lookup and its scatter-add backward.
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::embedding_forward(Tensor out, const Tensor& ids, const Tensor& table) {
  const int64_t D = table.dim(1), V = table.dim(0);
  const int32_t* id = ids.i32();
  for (int64_t n = 0; n < ids.numel(); ++n) {
    SOLTRAIN_CHECK(id[n] >= 0 && id[n] < V, "token id ", id[n], " outside the vocabulary");
    std::memcpy(out.f32() + n * D, table.f32() + id[n] * D, size_t(D) * 4);
  }
}

void CpuOps::embedding_backward(Tensor dtable, const Tensor& ids, const Tensor& dout, int32_t padding_idx) {
  const int64_t D = dtable.dim(1);
  const int32_t* id = ids.i32();
  for (int64_t n = 0; n < ids.numel(); ++n) {
    if (id[n] == padding_idx) continue;
    float* row = dtable.f32() + id[n] * D;
    const float* g = dout.f32() + n * D;
    for (int64_t d = 0; d < D; ++d) row[d] += g[d];
  }
}

}  // namespace soltrain
