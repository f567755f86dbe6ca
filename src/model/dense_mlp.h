// The dense SwiGLU MLP (Llama / Qwen's gate, up, down), one of the MLP blocks a decoder layer holds
// (model/layer.h; Mixture-of-Experts, model/moe.h, is the other, and reuses it for Qwen2-MoE's shared expert).
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "model/linear.h"

namespace soltrain {

struct MlpTensors {
  Tensor gate, up, act;         // [N, F]
  Tensor u_gate, u_up, u_down;  // adapters' u
};
struct MlpGrads {
  Tensor dact, dgate, dup;
};

class DenseSwiGLU {
 public:
  Linear gate, up, down;

  // out = down(silu(gate(h)) · up(h)). Without `out` the down projection is skipped (a recompute for
  // backward needs only its saved inputs), except that an adapted down still runs to refill its u.
  // Every tensor may be a tile of the tokens (rows row0 .. of the pass): the MLP is token-wise, so a
  // caller runs long sequences tile by tile; row0 places the tile in the LoRA dropout masks.
  void forward(Ops& ops, Tensor* out, const Tensor& h, const MlpTensors& t, const LoraPass& lora, int64_t layer,
               const Tensor& scratch_out, int64_t row0 = 0) const;
  // dh (=) d loss / dh from dout; weight gradients are added (+=), so tiles accumulate into them.
  void backward(Ops& ops, Tensor dh, const Tensor& dout, const Tensor& h, const MlpTensors& t, const MlpGrads& g,
                const LoraPass& lora, int64_t layer, int64_t row0 = 0) const;
};

}  // namespace soltrain
