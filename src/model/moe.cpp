#include "model/moe.h"

#include <optional>

#include "core/error.h"
#include "core/format.h"

namespace soltrain {

namespace {
const char* kProjections[] = {"gate_proj", "up_proj", "down_proj"};

// Row block `part` of an expert adapter's B (value or gradient) as stored (StoredOrder): [E, out, R].
Tensor expert_b(const Tensor& stored, int part, int64_t E, int64_t out, int64_t R) {
  return Tensor{static_cast<char*>(stored.data) + size_t(part * E * out * R) * dtype_size(stored.dtype),
                stored.dtype,
                {E, out, R},
                stored.device};
}
}  // namespace

std::string expert_weight_name(int l, int e, const char* proj) {
  return cat("model.layers.", l, ".mlp.experts.", e, ".", proj, ".weight");
}
std::string shared_expert_weight_name(int l, const char* proj) {
  return cat("model.layers.", l, ".mlp.shared_expert.", proj, ".weight");
}

float expert_lora_scale(const LoraConfig& lora, bool gate_up) {
  LoraConfig as_peft = lora;
  as_peft.r = expert_lora_rank(lora.r, gate_up);
  as_peft.alpha = gate_up ? 2 * lora.alpha : lora.alpha;
  return as_peft.scale();
}

Tensor MoeSwiGLU::stacked(const std::vector<Parameter*>& ps, Tensor Parameter::*field) {
  const Tensor& first = ps.front()->*field;
  const size_t bytes = size_t(first.numel()) * dtype_size(first.dtype);
  for (size_t e = 1; e < ps.size(); ++e)
    SOLTRAIN_CHECK(static_cast<const char*>((ps[e]->*field).data) == static_cast<const char*>(first.data) + e * bytes,
                   "the experts of ", ps.front()->name, " are not contiguous in the parameter store");
  return Tensor{first.data, first.dtype, {int64_t(ps.size()), first.dim(0), first.dim(1)}, first.device};
}

MoeSwiGLU::ExpertRows MoeSwiGLU::expert_rows(const MoeTensors& t, const MoeGrads* g, int64_t layer) const {
  ExpertRows x;
  if (!ep) {
    SOLTRAIN_CHECK(held_first == 0 && gate.size() == size_t(router->shape[0]), "a share of the experts without ",
                   "expert parallelism");
    x = {0, int64_t(gate.size()), t.xs, t.gate, t.up, t.act, t.ys, t.u_gate_up, t.u_down};
    if (g) {
      x.dys = g->dys;
      x.dxs = g->dxs;
      x.dact = g->dact;
      x.dgate = g->dgate;
      x.dup = g->dup;
    }
    x.offsets = t.offsets;
    return x;
  }
  const int64_t n = ep->received(layer);
  auto cut = [n](const Tensor& a) { return a.data ? a.rows(0, n) : a; };
  x = {ep->run_first(), ep->run_count(), cut(t.xl),        cut(t.gate),  cut(t.up),
       cut(t.act),         cut(t.yl),           cut(t.u_gate_up), cut(t.u_down)};
  if (g) {
    x.dys = cut(g->dyl);
    x.dxs = cut(g->dxl);
    x.dact = cut(g->dact);
    x.dgate = cut(g->dgate);
    x.dup = cut(g->dup);
  }
  x.offsets = ep->local_offsets(layer);
  return x;
}

Tensor MoeSwiGLU::expert_weights(Ops& o, const std::vector<Parameter*>& ps, const ExpertRows& x,
                                 const Tensor& scratch) const {
  const Parameter& first = *ps.at(size_t(x.first - held_first));
  if (first.format == WeightFormat::Dense)
    return stacked(ps, &Parameter::value).rows(x.first - held_first, x.first - held_first + x.count);
  const int64_t out = first.shape[0], in = first.shape[1];
  SOLTRAIN_CHECK(scratch.numel() >= x.count * out * in, "the experts' dequantisation scratch is too small");
  const Tensor w = scratch.view({scratch.numel()}).rows(0, x.count * out * in).view({x.count, out, in});
  for (int64_t e = 0; e < x.count; ++e) {
    const Parameter& p = *ps.at(size_t(x.first - held_first + e));
    o.dequantize(w.rows(e, e + 1).view({out, in}), Weight(p.value, p.format, p.scale, p.shape));
  }
  return w;
}

MoeSwiGLU::LoraFactors MoeSwiGLU::lora_factors(const ExpertLora& l, int parts, const ExpertRows& x) {
  const int64_t R = l.rank, E = l.a->shape[0] / R, in = l.a->shape[1], out = l.b->shape[0] / parts;
  LoraFactors f;
  f.a = Tensor{l.a->value.data, l.a->value.dtype, {E, R, in}, l.a->value.device}.rows(x.first, x.first + x.count);
  for (int i = 0; i < parts; ++i) f.b[size_t(i)] = expert_b(l.b->value, i, E, out, R).rows(x.first, x.first + x.count);
  return f;
}

Ops::GroupedTerm MoeSwiGLU::lora_backward(Ops& o, const ExpertLora& l, std::initializer_list<Tensor> dys,
                                          const Tensor& x, const Tensor& u, const ExpertRows& rows,
                                          const MoeGrads& g) const {
  const int parts = int(dys.size());
  const Tensor& offsets = rows.offsets;
  const LoraFactors f = lora_factors(l, parts, rows);
  const int64_t E = l.a->shape[0] / l.rank, R = l.rank, out = f.b[0].dim(1);
  const Tensor du{g.lora_g.data, g.lora_g.dtype, {u.dim(0), R}, g.lora_g.device};  // (sized for the widest R)
  // d loss / du = scale·Σ dy·B_e; dB_e += dyᵀ·u (u carries the scale), straight into B's stored gradient (the
  // experts this rank does not run get nothing)
  int i = 0;
  for (const Tensor& dy : dys) {
    Tensor du_i = du, db = expert_b(l.b->grad, i, E, out, R).rows(rows.first, rows.first + rows.count);
    o.grouped_linear_backward(&du_i, i > 0, nullptr, dy, u, f.b[size_t(i)], offsets, l.scale);
    o.grouped_linear_backward(nullptr, false, &db, dy, u, f.b[size_t(i)], offsets);
    ++i;
  }
  // dA_e += duᵀ·x; the caller's dx gets du·A_e
  Tensor da = Tensor{l.a->grad.data, l.a->grad.dtype, {E, R, x.dim(1)}, l.a->grad.device}.rows(rows.first,
                                                                                               rows.first + rows.count);
  o.grouped_linear_backward(nullptr, false, &da, du, x, f.a, offsets);
  return {du, f.a};
}

namespace {
// A projection's grouped terms: its input against the experts' weights, and with an adapter (scale·u)·B too.
std::vector<Ops::GroupedTerm> with_adapter(const Tensor& in, const Tensor& w, bool adapter, const Tensor& u,
                                           const Tensor& b) {
  std::vector<Ops::GroupedTerm> terms{{in, w}};
  if (adapter) terms.push_back({u, b});
  return terms;
}
}  // namespace

void MoeSwiGLU::forward(Ops& o, Tensor* out, const Tensor& h, const MoeTensors& t, const MoeStats* stats, bool route,
                        const LoraPass& lora, int64_t layer) const {
  if (route) {
    SOLTRAIN_CHECK(stats, "routing without statistics");
    router_linear.forward(o, t.logits, h, t.u_router, {}, lora.scratch);
    o.moe_route(t.probs, t.expert, t.weight, stats->prob_sum, t.logits, norm_topk);
    o.moe_permute(t.rows, t.slot, t.offsets, stats->counts, t.expert);
    if (ep) ep->plan(layer, t.offsets);
  }
  o.gather_rows(t.xs, h, t.rows);
  const ExpertRows x = expert_rows(t, nullptr, layer);
  if (ep) ep->dispatch(o, layer, x.xs, t.xs);
  auto weights = [&](const std::vector<Parameter*>& ps) { return expert_weights(o, ps, x, t.dequant); };
  constexpr auto fwd = Ops::GroupedOrient::Forward;
  // Each adapted projection is one product x·W_eᵀ + u·B_eᵀ with u = scale·x·A_eᵀ (kept for backward);
  // gate_up's B holds the gate rows, then the up rows.
  const bool gu = gate_up_lora.on(), dn = down_lora.on();
  LoraFactors f;
  if (gu) {
    f = lora_factors(gate_up_lora, 2, x);
    o.grouped_linear_forward(x.u_gate_up, x.xs, f.a, x.offsets, gate_up_lora.scale);
  }
  o.grouped_linear_sum(x.gate, with_adapter(x.xs, weights(gate), gu, x.u_gate_up, f.b[0]), fwd, x.offsets);
  o.grouped_linear_sum(x.up, with_adapter(x.xs, weights(up), gu, x.u_gate_up, f.b[1]), fwd, x.offsets);
  o.swiglu_forward(x.act, x.gate, x.up);
  if (dn) {
    f = lora_factors(down_lora, 1, x);
    o.grouped_linear_forward(x.u_down, x.act, f.a, x.offsets, down_lora.scale);
  }
  o.grouped_linear_sum(x.ys, with_adapter(x.act, weights(down), dn, x.u_down, f.b[0]), fwd, x.offsets);
  if (ep) ep->send_back(o, layer, t.ys, x.ys);
  if (out) o.moe_combine(*out, t.ys, t.slot, t.weight);
  if (!shared_gate) return;
  // backward reads the shared expert's output (for its gate's gradient): it runs whole in a recompute too
  Tensor shared_out = t.shared_out;
  shared.forward(o, &shared_out, h, t.shared, lora, layer, shared_out);
  if (route) shared_gate_linear.forward(o, t.shared_logit, h, t.u_shared_gate, {}, lora.scratch);
  if (out) o.sigmoid_gate_add(*out, t.shared_out, t.shared_logit);
}

void MoeSwiGLU::backward(Ops& o, Tensor dh, const Tensor& dout, const Tensor& h, const MoeTensors& t, const MoeGrads& g,
                         const LoraPass& lora, int64_t layer) const {
  const bool trains = router->trainable;
  // The shared expert first: its backward writes dh (=), everything after adds to it.
  if (shared_gate) {
    o.sigmoid_gate_backward(g.dshared_out, g.dshared_logit, dout, t.shared_out, t.shared_logit);
    shared.backward(o, dh, g.dshared_out, h, t.shared, g.shared, lora, layer);
    shared_gate_linear.backward(o, &dh, true, g.dshared_logit, h, t.u_shared_gate, {}, lora.scratch);
  }
  const ExpertRows x = expert_rows(t, &g, layer);
  auto grads = [&](const std::vector<Parameter*>& ps) {
    return stacked(ps, &Parameter::grad).rows(x.first - held_first, x.first - held_first + x.count);
  };
  Tensor dgate_w = trains ? grads(gate) : Tensor{}, dup_w = trains ? grads(up) : Tensor{};
  Tensor ddown_w = trains ? grads(down) : Tensor{};
  // out = Σ_j weight_j · ys_j: to each pair's output, and to the router's weights
  o.moe_combine_backward(g.dys, g.dweight, dout, t.ys, t.slot, t.weight);
  if (ep) ep->dispatch(o, layer, x.dys, g.dys);
  // Each input gradient is one product over its terms (dy·W_e, and an adapter's du·A_e): the adapters' backward
  // first, for du.
  constexpr auto dxo = Ops::GroupedOrient::Dx;
  Tensor dact = x.dact;
  const Tensor wd = expert_weights(o, down, x, t.dequant);
  std::vector<Ops::GroupedTerm> terms{{x.dys, wd}};
  if (down_lora.on()) terms.push_back(lora_backward(o, down_lora, {x.dys}, x.act, x.u_down, x, g));
  o.grouped_linear_sum(dact, terms, dxo, x.offsets);
  if (trains) o.grouped_linear_backward(nullptr, false, &ddown_w, x.dys, x.act, wd, x.offsets);
  o.swiglu_backward(x.dgate, x.dup, x.dact, x.gate, x.up);
  Tensor dxs = x.dxs;
  std::optional<Ops::GroupedTerm> adapter;  // (lora_g holds gate_up's du from here: down's has been read)
  if (gate_up_lora.on()) adapter = lora_backward(o, gate_up_lora, {x.dgate, x.dup}, x.xs, x.u_gate_up, x, g);
  // A quantised base dequantises each projection's experts into the one scratch: gate's and up's in turn.
  const bool one_scratch = gate.front()->format != WeightFormat::Dense;
  const Tensor wg = expert_weights(o, gate, x, t.dequant);
  terms = {{x.dgate, wg}};
  if (!one_scratch) terms.push_back({x.dup, expert_weights(o, up, x, t.dequant)});
  if (adapter) terms.push_back(*adapter);
  o.grouped_linear_sum(dxs, terms, dxo, x.offsets);
  if (trains) o.grouped_linear_backward(nullptr, false, &dgate_w, x.dgate, x.xs, wg, x.offsets);
  const Tensor wu = one_scratch ? expert_weights(o, up, x, t.dequant) : terms[1].w;
  if (one_scratch) o.grouped_linear_sum(dxs, {{x.dup, wu}}, dxo, x.offsets, true);
  if (trains) o.grouped_linear_backward(nullptr, false, &dup_w, x.dup, x.xs, wu, x.offsets);
  if (ep) ep->send_back(o, layer, g.dxs, x.dxs);
  o.moe_unpermute_sum(dh, shared_gate != nullptr, g.dxs, t.slot);
  // the router: weights (and the load-balancing loss's probabilities) → logits → h and the router's weight
  o.moe_router_backward(g.dlogits, g.dweight, t.probs, t.expert, t.weight, norm_topk, g.aux_grad);
  router_linear.backward(o, &dh, true, g.dlogits, h, t.u_router, {}, lora.scratch);
}

void add_moe_parameters(ParameterStore& ps, const ModelConfig& c, int l, bool trains, WeightFormat base) {
  const int E = c.moe.num_experts, F = c.moe.intermediate_size, D = c.hidden_size;
  SOLTRAIN_CHECK(!c.moe.held_count || !trains, "a share of the experts held with the experts trained");
  ps.add(cat("model.layers.", l, ".mlp.gate.weight"), {E, D}, trains, l);
  for (const char* proj : kProjections) {
    const bool down = std::string(proj) == "down_proj";
    for (int e = c.moe.held_first; e < c.moe.held_end(); ++e)
      ps.add(expert_weight_name(l, e, proj), down ? Shape{D, F} : Shape{F, D}, trains, l, base);
  }
  if (const int Fs = c.moe.shared_intermediate_size) {
    for (const char* proj : kProjections) {
      const bool down = std::string(proj) == "down_proj";
      ps.add(shared_expert_weight_name(l, proj), down ? Shape{D, Fs} : Shape{Fs, D}, trains, l, base);
    }
    ps.add(cat("model.layers.", l, ".mlp.shared_expert_gate.weight"), {1, D}, trains, l);
  }
}

std::string shared_lora_name(int layer, const char* proj, bool b) {
  return cat("base_model.model.model.layers.", layer, ".mlp.shared_expert.", proj, b ? ".lora_B" : ".lora_A",
             ".weight");
}

void add_shared_lora_parameters(ParameterStore& ps, const ModelConfig& c, int l, const LoraConfig& lora) {
  const int64_t Fs = c.moe.shared_intermediate_size, D = c.hidden_size;
  for (LoraTarget t : {LoraTarget::gate, LoraTarget::up, LoraTarget::down}) {
    if (!lora.targets(t)) continue;
    const bool down = t == LoraTarget::down;
    const char* proj = kLoraModuleNames[size_t(t)];
    ps.add(shared_lora_name(l, proj, false), {lora.r, down ? Fs : D}, true, l);
    ps.add(shared_lora_name(l, proj, true), {down ? D : Fs, lora.r}, true, l);
  }
  if (lora.shared_expert_gate) {  // a plain adapter over the [1, D] gate
    ps.add(shared_gate_lora_name(l, false), {lora.r, D}, true, l);
    ps.add(shared_gate_lora_name(l, true), {1, lora.r}, true, l);
  }
}

std::string shared_gate_lora_name(int layer, bool b) {
  return cat("base_model.model.model.layers.", layer, ".mlp.shared_expert_gate.", b ? "lora_B" : "lora_A", ".weight");
}

std::string router_lora_name(int layer, bool b) {
  return cat("base_model.model.model.layers.", layer, ".mlp.gate.", b ? "lora_B" : "lora_A", ".weight");
}

std::string expert_lora_name(int layer, bool gate_up, bool both, bool b) {
  return cat("base_model.model.model.layers.", layer, ".mlp.experts.", gate_up && both ? "base_layer." : "",
             b ? "lora_B" : "lora_A", ".weight");
}

void add_expert_lora_parameters(ParameterStore& ps, const ModelConfig& c, int l, int r, bool gate_up, bool down,
                                bool router) {
  const int64_t E = c.moe.num_experts, F = c.moe.intermediate_size, D = c.hidden_size;
  if (router) {  // a plain adapter over the [E, D] router (PEFT's ParamWrapper of one "expert")
    ps.add(router_lora_name(l, false), {r, D}, true, l);
    ps.add(router_lora_name(l, true), {E, r}, true, l);
  }
  if (gate_up) {
    const int64_t R = expert_lora_rank(r, true);
    ps.add(expert_lora_name(l, true, down, false), {E * R, D}, true, l);
    ps.add(expert_lora_name(l, true, down, true), {2 * F, R * E}, true, l, WeightFormat::Dense, StoredOrder{int(E), 2});
  }
  if (down) {
    const int64_t R = expert_lora_rank(r, false);
    ps.add(expert_lora_name(l, false, gate_up, false), {E * R, F}, true, l);
    ps.add(expert_lora_name(l, false, gate_up, true), {D, R * E}, true, l, WeightFormat::Dense, StoredOrder{int(E), 1});
  }
}

MoeSwiGLU bind_moe(ParameterStore& ps, const ModelConfig& c, int l, const std::optional<LoraConfig>& lora) {
  MoeSwiGLU m;
  const bool gate_up = lora && lora->targets(LoraTarget::gate), down = lora && lora->targets(LoraTarget::down);
  // PEFT's scale alpha / R (rsLoRA alpha / √R), with gate_up's doubled alpha and rank
  auto adapter = [&](bool is_gate_up) {
    ExpertLora a;
    if (!c.moe.lora_on_experts || !(is_gate_up ? gate_up : down)) return a;
    a.a = &ps.at(expert_lora_name(l, is_gate_up, gate_up && down, false));
    a.b = &ps.at(expert_lora_name(l, is_gate_up, gate_up && down, true));
    a.rank = expert_lora_rank(lora->r, is_gate_up);
    a.scale = expert_lora_scale(*lora, is_gate_up);
    return a;
  };
  m.gate_up_lora = adapter(true);
  m.down_lora = adapter(false);
  m.router = &ps.at(cat("model.layers.", l, ".mlp.gate.weight"));
  m.router_linear = Linear(m.router, nullptr, ps.find(router_lora_name(l, false)), ps.find(router_lora_name(l, true)),
                           lora ? lora->scale() : 0.0f);
  m.top_k = c.moe.top_k;
  m.norm_topk = c.moe.norm_topk;
  m.held_first = c.moe.held_first;
  for (int e = c.moe.held_first; e < c.moe.held_end(); ++e) {
    m.gate.push_back(&ps.at(expert_weight_name(l, e, "gate_proj")));
    m.up.push_back(&ps.at(expert_weight_name(l, e, "up_proj")));
    m.down.push_back(&ps.at(expert_weight_name(l, e, "down_proj")));
  }
  if (c.moe.shared_intermediate_size) {
    auto linear = [&](LoraTarget t) {
      const char* proj = kLoraModuleNames[size_t(t)];
      return Linear(&ps.at(shared_expert_weight_name(l, proj)), nullptr, ps.find(shared_lora_name(l, proj, false)),
                    ps.find(shared_lora_name(l, proj, true)), lora ? lora->scale() : 0.0f);
    };
    m.shared.gate = linear(LoraTarget::gate);
    m.shared.up = linear(LoraTarget::up);
    m.shared.down = linear(LoraTarget::down);
    m.shared_gate = &ps.at(cat("model.layers.", l, ".mlp.shared_expert_gate.weight"));
    m.shared_gate_linear = Linear(m.shared_gate, nullptr, ps.find(shared_gate_lora_name(l, false)),
                                  ps.find(shared_gate_lora_name(l, true)), lora ? lora->scale() : 0.0f);
  }
  return m;
}

}  // namespace soltrain
