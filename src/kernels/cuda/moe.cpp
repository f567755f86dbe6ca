// CUDA: Mixture-of-Experts operations are not written yet (issue 31's kernels: permutation on the device, the
// grouped GEMMs). The model asks moe_unsupported() before it builds a MoE layer and refuses in one line, so
// none of these is reached; they throw if a caller skipped that check.
#include <stdexcept>

#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

namespace {
[[noreturn]] void unreachable(const CudaOps& ops) {
  throw std::logic_error(ops.moe_unsupported());
}
}  // namespace

std::string CudaOps::moe_unsupported() const {
  return "Mixture-of-Experts layers have no CUDA kernels yet (token permutation, grouped GEMMs): train them with "
         "device: cpu for now";
}

void CudaOps::moe_route(Tensor, Tensor, Tensor, Tensor, const Tensor&, bool) {
  unreachable(*this);
}
void CudaOps::moe_permute(Tensor, Tensor, Tensor, Tensor, const Tensor&) {
  unreachable(*this);
}
void CudaOps::gather_rows(Tensor, const Tensor&, const Tensor&) {
  unreachable(*this);
}
void CudaOps::moe_combine(Tensor, const Tensor&, const Tensor&, const Tensor&) {
  unreachable(*this);
}
void CudaOps::moe_combine_backward(Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unreachable(*this);
}
void CudaOps::moe_unpermute_sum(Tensor, bool, const Tensor&, const Tensor&) {
  unreachable(*this);
}
void CudaOps::grouped_linear_forward(Tensor, const Tensor&, const Tensor&, const Tensor&, float, bool) {
  unreachable(*this);
}
void CudaOps::grouped_linear_backward(Tensor*, bool, Tensor*, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, float) {
  unreachable(*this);
}
void CudaOps::expert_lora_b_layout(Tensor, const Tensor&, bool) {
  unreachable(*this);
}
void CudaOps::moe_router_backward(Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                                  const Tensor&) {
  unreachable(*this);
}
void CudaOps::sigmoid_gate_add(Tensor, const Tensor&, const Tensor&) {
  unreachable(*this);
}
void CudaOps::sigmoid_gate_backward(Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&) {
  unreachable(*this);
}
void CudaOps::moe_aux_loss(Tensor, Tensor, const Tensor&, const Tensor&, float, double) {
  unreachable(*this);
}

}  // namespace soltrain
