#include "model/dense_mlp.h"

namespace soltrain {

void DenseSwiGLU::forward(Ops& o, Tensor* out, const Tensor& h, const MlpTensors& t, const LoraPass& lora, int64_t l,
                          const Tensor& scratch_out, int64_t row0) const {
  const int64_t D = h.dim(1), F = t.act.dim(1);
  gate.forward(o, t.gate, h, t.u_gate, lora.at(l, LoraTarget::gate, row0, D), lora.scratch);
  up.forward(o, t.up, h, t.u_up, lora.at(l, LoraTarget::up, row0, D), lora.scratch);
  o.swiglu_forward(t.act, t.gate, t.up);
  // The down projection's output is needed only for the residual; with LoRA its adapter input u is needed
  // by backward, so a recompute still runs it (into scratch) when down has an adapter.
  if (!out && !down.adapted()) return;
  down.forward(o, out ? *out : scratch_out, t.act, t.u_down, lora.at(l, LoraTarget::down, row0, F), lora.scratch);
}

void DenseSwiGLU::backward(Ops& o, Tensor dh, const Tensor& dout, const Tensor& h, const MlpTensors& t,
                           const MlpGrads& g, const LoraPass& lora, int64_t l, int64_t row0) const {
  const int64_t D = h.dim(1), F = t.act.dim(1);
  Tensor dact = g.dact;
  down.backward(o, &dact, false, dout, t.act, t.u_down, lora.at(l, LoraTarget::down, row0, F), lora.scratch);
  o.swiglu_backward(g.dgate, g.dup, g.dact, t.gate, t.up);
  gate.backward(o, &dh, false, g.dgate, h, t.u_gate, lora.at(l, LoraTarget::gate, row0, D), lora.scratch);
  up.backward(o, &dh, true, g.dup, h, t.u_up, lora.at(l, LoraTarget::up, row0, D), lora.scratch);
}

}  // namespace soltrain
