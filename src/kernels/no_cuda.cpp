// Builds without the CUDA toolkit: asking for the CUDA backend is a clear error, not a link failure.
#include "core/error.h"
#include "kernels/ops.h"

namespace soltrain {

std::unique_ptr<Ops> make_cuda_ops() {
  user_error("--device cuda: this build of soltrain has no CUDA backend (rebuild with -DSOLTRAIN_CUDA=ON)");
}

std::unique_ptr<Ops> make_ops_beside(Device device) {
  return device == Device::CPU ? make_cpu_ops() : make_cuda_ops();
}

}  // namespace soltrain
