#include "model/moe.h"

#include "core/error.h"
#include "core/format.h"

namespace soltrain {

namespace {
const char* kProjections[] = {"gate_proj", "up_proj", "down_proj"};

std::string expert_name(int l, int e, const char* proj) {
  return cat("model.layers.", l, ".mlp.experts.", e, ".", proj, ".weight");
}
std::string shared_name(int l, const char* proj) {
  return cat("model.layers.", l, ".mlp.shared_expert.", proj, ".weight");
}
}  // namespace

Tensor MoeSwiGLU::stacked(const std::vector<Parameter*>& ps, Tensor Parameter::*field) {
  const Tensor& first = ps.front()->*field;
  const size_t bytes = size_t(first.numel()) * dtype_size(first.dtype);
  for (size_t e = 1; e < ps.size(); ++e)
    SOLTRAIN_CHECK(static_cast<const char*>((ps[e]->*field).data) ==
                       static_cast<const char*>(first.data) + e * bytes,
                   "the experts of ", ps.front()->name, " are not contiguous in the parameter store");
  return Tensor{first.data, first.dtype, {int64_t(ps.size()), first.dim(0), first.dim(1)}, first.device};
}

void MoeSwiGLU::forward(Ops& o, Tensor* out, const Tensor& h, const MoeTensors& t, const MoeStats* stats,
                        bool route) const {
  if (route) {
    SOLTRAIN_CHECK(stats, "routing without statistics");
    o.linear_forward(t.logits, h, router->value, nullptr);
    o.moe_route(t.probs, t.expert, t.weight, stats->prob_sum, t.logits, norm_topk);
    o.moe_permute(t.rows, t.slot, t.offsets, stats->counts, t.expert);
  }
  o.gather_rows(t.xs, h, t.rows);
  o.grouped_linear_forward(t.gate, t.xs, stacked(gate, &Parameter::value), t.offsets);
  o.grouped_linear_forward(t.up, t.xs, stacked(up, &Parameter::value), t.offsets);
  o.swiglu_forward(t.act, t.gate, t.up);
  o.grouped_linear_forward(t.ys, t.act, stacked(down, &Parameter::value), t.offsets);
  if (out) o.moe_combine(*out, t.ys, t.slot, t.weight);
  if (!shared_gate) return;
  // backward reads the shared expert's output (for its gate's gradient): it runs whole in a recompute too
  Tensor shared_out = t.shared_out;
  shared.forward(o, &shared_out, h, t.shared, LoraPass{}, 0, shared_out);
  if (route) o.linear_forward(t.shared_logit, h, shared_gate->value, nullptr);
  if (out) o.sigmoid_gate_add(*out, t.shared_out, t.shared_logit);
}

void MoeSwiGLU::backward(Ops& o, Tensor dh, const Tensor& dout, const Tensor& h, const MoeTensors& t,
                         const MoeGrads& g) const {
  const bool trains = router->trainable;
  // The shared expert first: its backward writes dh (=), everything after adds to it.
  if (shared_gate) {
    o.sigmoid_gate_backward(g.dshared_out, g.dshared_logit, dout, t.shared_out, t.shared_logit);
    shared.backward(o, dh, g.dshared_out, h, t.shared, g.shared, LoraPass{}, 0);
    Tensor ggrad = shared_gate->grad;
    o.linear_backward(&dh, true, trains ? &ggrad : nullptr, nullptr, g.dshared_logit, h, shared_gate->value);
  }
  auto grads = [&](const std::vector<Parameter*>& ps) { return stacked(ps, &Parameter::grad); };
  Tensor dgate_w = trains ? grads(gate) : Tensor{}, dup_w = trains ? grads(up) : Tensor{};
  Tensor ddown_w = trains ? grads(down) : Tensor{};
  // out = Σ_j weight_j · ys_j: to each pair's output, and to the router's weights
  o.moe_combine_backward(g.dys, g.dweight, dout, t.ys, t.slot, t.weight);
  Tensor dact = g.dact;
  o.grouped_linear_backward(&dact, trains ? &ddown_w : nullptr, g.dys, t.act, stacked(down, &Parameter::value),
                            t.offsets);
  o.swiglu_backward(g.dgate, g.dup, g.dact, t.gate, t.up);
  Tensor dxs = g.dxs;
  o.grouped_linear_backward(&dxs, trains ? &dgate_w : nullptr, g.dgate, t.xs, stacked(gate, &Parameter::value),
                            t.offsets);
  o.moe_unpermute_sum(dh, shared_gate != nullptr, dxs, t.slot);
  o.grouped_linear_backward(&dxs, trains ? &dup_w : nullptr, g.dup, t.xs, stacked(up, &Parameter::value), t.offsets);
  o.moe_unpermute_sum(dh, true, dxs, t.slot);
  // the router: weights (and the load-balancing loss's probabilities) → logits → h and the router's weight
  o.moe_router_backward(g.dlogits, g.dweight, t.probs, t.expert, t.weight, norm_topk, g.aux_grad);
  Tensor grad = router->grad;
  o.linear_backward(&dh, true, trains ? &grad : nullptr, nullptr, g.dlogits, h, router->value);
}

void add_moe_parameters(ParameterStore& ps, const ModelConfig& c, int l, bool trains) {
  const int E = c.moe.num_experts, F = c.moe.intermediate_size, D = c.hidden_size;
  ps.add(cat("model.layers.", l, ".mlp.gate.weight"), {E, D}, trains, l);
  for (const char* proj : kProjections) {
    const bool down = std::string(proj) == "down_proj";
    for (int e = 0; e < E; ++e) ps.add(expert_name(l, e, proj), down ? Shape{D, F} : Shape{F, D}, trains, l);
  }
  if (const int Fs = c.moe.shared_intermediate_size) {
    for (const char* proj : kProjections) {
      const bool down = std::string(proj) == "down_proj";
      ps.add(shared_name(l, proj), down ? Shape{D, Fs} : Shape{Fs, D}, trains, l);
    }
    ps.add(cat("model.layers.", l, ".mlp.shared_expert_gate.weight"), {1, D}, trains, l);
  }
}

MoeSwiGLU bind_moe(ParameterStore& ps, const ModelConfig& c, int l) {
  MoeSwiGLU m;
  m.router = &ps.at(cat("model.layers.", l, ".mlp.gate.weight"));
  m.top_k = c.moe.top_k;
  m.norm_topk = c.moe.norm_topk;
  for (int e = 0; e < c.moe.num_experts; ++e) {
    m.gate.push_back(&ps.at(expert_name(l, e, "gate_proj")));
    m.up.push_back(&ps.at(expert_name(l, e, "up_proj")));
    m.down.push_back(&ps.at(expert_name(l, e, "down_proj")));
  }
  if (c.moe.shared_intermediate_size) {
    auto linear = [&](const char* proj) { return Linear(&ps.at(shared_name(l, proj)), nullptr, nullptr, nullptr, 0); };
    m.shared.gate = linear("gate_proj");
    m.shared.up = linear("up_proj");
    m.shared.down = linear("down_proj");
    m.shared_gate = &ps.at(cat("model.layers.", l, ".mlp.shared_expert_gate.weight"));
  }
  return m;
}

}  // namespace soltrain
