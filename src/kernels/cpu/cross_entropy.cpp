// CPU: softmax cross-entropy per row with ignore index -100; the logits become their gradient in place
// (weighted per row) when a gradient is asked for.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::cross_entropy(const Tensor& logits, Tensor dlogits, Tensor row_loss, const Tensor& targets,
                           const Tensor& row_weight, Tensor row_entropy) {
  const int64_t n = logits.dim(0), V = logits.dim(1);
  const int32_t* t = targets.i32();
  const bool grad = row_weight.defined();
  if (grad && dlogits.data != logits.data) copy(dlogits, logits);  // then compute in place
  for (int64_t r = 0; r < n; ++r) {
    float* l = (grad ? dlogits.f32() : logits.f32()) + r * V;
    if (t[r] == -100) {
      row_loss.f32()[r] = 0;
      if (row_entropy.defined()) row_entropy.f32()[r] = 0;
      if (grad)
        for (int64_t j = 0; j < V; ++j) l[j] = 0;
      continue;
    }
    SOLTRAIN_CHECK(t[r] >= 0 && t[r] < V, "target ", t[r], " outside the vocabulary");
    float mx = l[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, l[j]);
    double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(double(l[j] - mx));
    const double lse = double(mx) + std::log(z);
    row_loss.f32()[r] = float(lse - double(l[t[r]]));
    if (row_entropy.defined()) {  // (before the logits become their gradient)
      double mean = 0;            // Σ softmax · logits
      for (int64_t j = 0; j < V; ++j) mean += std::exp(double(l[j]) - lse) * double(l[j]);
      row_entropy.f32()[r] = float(lse - mean);
    }
    if (!grad) continue;
    const float grad_scale = row_weight.f32()[r];
    for (int64_t j = 0; j < V; ++j) l[j] = float(std::exp(double(l[j]) - lse)) * grad_scale;
    l[t[r]] -= grad_scale;
  }
}

}  // namespace soltrain
