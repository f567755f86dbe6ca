#include "train/optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/deferred_writes.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "kernels/blockwise4.h"
#include "kernels/blockwise8.h"
#include "kernels/stochastic_round.h"

namespace soltrain {

bool quantised_moments(Moments m, int64_t n) {
  if (m == Moments::Torchao4) return n >= kBlockwise8MinNumel && n % kBlockwise4Block == 0;
  return low_bit(m) && n >= kBlockwise8MinNumel && (m == Moments::Blockwise8 || n % kBlockwise8Block == 0);
}

int64_t moment_block(Moments m) {
  return m == Moments::Torchao4 ? kBlockwise4Block : kBlockwise8Block;
}

namespace {
// A quantised moment's layout: code bytes of n elements, map entries.
int64_t code_bytes(Moments m, int64_t n) {
  return m == Moments::Torchao4 ? n / 2 : n;
}
int64_t map_entries(Moments m) {
  return m == Moments::Torchao4 ? 16 : 256;
}
int64_t total(const std::vector<ParamRange>& rs) {
  int64_t n = 0;
  for (const ParamRange& r : rs) n += r.numel;
  return n;
}
// The low-bit state's pieces: every trainable parameter whole, or a sharded optimizer's part of each inside its
// ranges (one interval: a rank owns one span of each group).
struct MomentPiece {
  const Parameter* param;
  int64_t at, numel;
};
std::vector<MomentPiece> moment_pieces(const ParameterStore& ps, const std::vector<ParamRange>* shard) {
  std::vector<MomentPiece> out;
  for (const Parameter& p : ps.all()) {
    if (!p.trainable) continue;
    const int64_t n = shape_numel(p.shape);
    if (!shard) {
      out.push_back({&p, 0, n});
      continue;
    }
    for (const ParamRange& r : *shard) {
      const int64_t lo = std::max(r.offset, p.offset), hi = std::min(r.offset + r.numel, p.offset + n);
      if (r.group == p.group && hi > lo) out.push_back({&p, lo - p.offset, hi - lo});
    }
  }
  return out;
}
}  // namespace

// NorMuon's variance EMA of a matrix: one value per row of a tall (or square) one, per column of a wide one.
static int64_t normuon_variance_size(const Shape& s) {
  return std::max(s[0], s[1]);
}

AdamW::Plan AdamW::plan(const ParameterStore& ps, Moments moments, Offload offload, std::optional<DType> muon,
                        bool normuon, const std::vector<ParamRange>* shard) {
  SOLTRAIN_CHECK(!shard || (!muon && !offload.grads), "a sharded optimizer: AdamW, the gradients on the device");
  if (muon) {  // momentum for every trained parameter, second moments for AdamW's, the scratch of the widest matrix
    int64_t total = 0, adamw = 0, widest = 1, ns = 1;
    for (const Parameter& q : ps.all()) {
      if (!q.trainable) continue;
      const int64_t n = shape_numel(q.shape);
      total += n;
      if (!updated_by_muon(q)) {
        adamw += n;
        continue;
      }
      if (normuon) adamw += normuon_variance_size(q.shape);
      const int64_t r = std::min(q.shape[0], q.shape[1]);
      widest = std::max(widest, n);
      ns = std::max(ns, 2 * r * r + n);  // (newton_schulz: A = X Xᵀ and B, r x r each, and the next X)
    }
    Plan p;
    p.m = size_t(std::max<int64_t>(total, 1)) * 4;
    p.v = size_t(std::max<int64_t>(adamw, 1)) * 4;
    p.muon_u = widest;
    p.muon_ns = ns;
    p.muon_scratch = size_t(widest + ns) * dtype_size(*muon) + sizeof(double);
    return p;
  }
  const int64_t b = moment_block(moments);
  // (group, decayed) -> elements: the store's flat ranges, or the shard's, which fp32 pieces cut
  std::map<std::pair<int, bool>, int64_t> ranges;
  int64_t total = 0, small = 0, codes = 0, blocks = 0, widest_param = 0;
  if (shard)
    for (const ParamRange& r : *shard) ranges[{r.group, r.decay}] = std::max(ranges[{r.group, r.decay}], r.numel);
  else
    for (const Parameter& q : ps.all())
      if (q.trainable) ranges[{q.group, q.decay}] += shape_numel(q.shape);
  for (const MomentPiece& pc : moment_pieces(ps, shard)) {
    const int64_t n = pc.numel;
    total += n;
    widest_param = std::max(widest_param, n);
    if (quantised_moments(moments, shape_numel(pc.param->shape)))
      codes += code_bytes(moments, n), blocks += (n + b - 1) / b;
    else
      small += n;
  }
  const size_t master = offload.master, opt = offload.optimizer, grads = offload.grads;
  Plan p;
  if (moments == Moments::F32) {
    p.m = p.v = size_t(std::max<int64_t>(total, 1)) * 4;
    if (offload.any()) {
      int64_t widest = 1;
      for (const auto& [k, n] : ranges) widest = std::max(widest, n);
      p.chunk = std::clamp<int64_t>(offload.chunk, 1, widest);
      p.slot = size_t(p.chunk) * 4 * (master + 2 * opt + grads);  // [master | m | v | gradient]
    }
    return p;
  }
  p.m = p.v = size_t(std::max<int64_t>(small, 1)) * 4;
  p.mq = p.vq = size_t(std::max<int64_t>(codes, 1));
  p.mabs = p.vabs = size_t(std::max<int64_t>(blocks, 1)) * 4;
  p.maps = size_t(2 * map_entries(moments)) * 4;
  if (offload.any()) {
    // Pieces of whole 256-element blocks (the chunk rounded down to blocks, at least one), so each updates
    // exactly the blocks the resident update does, with their absmax.
    p.chunk = std::clamp<int64_t>(offload.chunk / b * b, b, (std::max(widest_param, b) + b - 1) / b * b);
    // [master | m | v | absmaxes | gradient]
    p.slot = 4 * (size_t(p.chunk) * (master + 2 * opt + grads) + size_t(p.chunk / b) * 2 * opt);
  }
  return p;
}

AdamW::AdamW(ParameterStore& params, Ops& ops, Moments moments, Offload offload, bool muon, bool normuon)
    : params_(params), ops_(ops), moments_(moments), offload_(offload), muon_(muon), normuon_(muon && normuon) {
  SOLTRAIN_CHECK(!muon || (moments == Moments::F32 && !offload.any()), "Muon's state: fp32 and resident");
  SOLTRAIN_CHECK(params.master_dtype() == DType::F32 || (!muon && moments != Moments::Torchao4 && !offload.master),
                 "bf16 masters: AdamW with fp32 or 8-bit moments, the masters on the device");
  const Plan pl = plan(params, moments, offload, muon ? std::optional(ops.activation_dtype()) : std::nullopt, normuon_);
  if (muon) {  // which parameters Muon updates, where AdamW's second moments sit, the scratch (never in the step)
    const DType act = ops.activation_dtype();
    int64_t v_at = 0;
    for (const Parameter& p : params.all()) {
      muon_param_.push_back(updated_by_muon(p));
      muon_v_at_.push_back(-1);
      if (!p.trainable) continue;
      if (!muon_param_.back()) {
        muon_v_at_.back() = v_at;
        v_at += shape_numel(p.shape);
        continue;
      }
      if (normuon_) {
        muon_v_at_.back() = v_at;
        v_at += normuon_variance_size(p.shape);
      }
      SOLTRAIN_CHECK(p.order.named(), "Muon on a parameter stored in another order: ", p.name);
    }
    muon_u_ = ops.alloc(size_t(pl.muon_u) * dtype_size(act));
    muon_ns_ = ops.alloc(size_t(pl.muon_ns) * dtype_size(act));
    muon_sumsq_ = ops.alloc(sizeof(double));
  }
  make_state(pl);
}

void AdamW::make_state(const Plan& pl) {
  chunk_ = pl.chunk;
  if (low_bit(moments_)) return make_low_bit_state(pl);
  // (offload_optimizer: the moments in host memory, pinned on CUDA; alloc_host zeroes too)
  m_ = offload_.optimizer ? ops_.alloc_host(pl.m) : ops_.alloc(pl.m);
  v_ = offload_.optimizer ? ops_.alloc_host(pl.v) : ops_.alloc(pl.v);
  if (offload_.master) params_.move_masters_to_host(ops_);
  if (!offload_.any()) return;
  int64_t local = 0;  // a shard's moments: its ranges one after another
  for (const ParamRange& r : shard_ ? *shard_ : params_.ranges()) {
    for (int64_t o = 0; o < r.numel; o += chunk_)
      pieces_.push_back(
          {{r.group, r.decay, r.offset + o, std::min(chunk_, r.numel - o)}, (shard_ ? local : r.offset) + o});
    local += r.numel;
  }
  for (Buffer& b : stage_) b = ops_.alloc(pl.slot);
  // The slots are zeroed on the main stream and first filled on the upload stream, which waits for nothing.
  ops_.synchronize();
}

void AdamW::make_low_bit_state(const Plan& pl) {
  // (offload_optimizer: the moments in host memory, pinned on CUDA; alloc_host zeroes too)
  auto alloc = [&](size_t b) { return offload_.optimizer ? ops_.alloc_host(b) : ops_.alloc(b); };
  m_ = alloc(pl.m);
  v_ = alloc(pl.v);
  // Zeroed codes are zero moments: code 0 is -1 (signed map) or 0 (unsigned), times an absmax of 0.
  int64_t small = 0, bytes = 0, blocks = 0;
  const int64_t b = moment_block(moments_);
  for (const MomentPiece& pc : moment_pieces(params_, shard_ ? &*shard_ : nullptr)) {
    if (quantised_moments(moments_, shape_numel(pc.param->shape))) {
      SOLTRAIN_CHECK(pc.at % b == 0, pc.param->name, ": a piece of its low-bit moments from element ", pc.at,
                     ", inside a block");
      slots_.push_back({pc.param, true, bytes, blocks, pc.at, pc.numel});
      bytes += code_bytes(moments_, pc.numel);
      blocks += (pc.numel + b - 1) / b;
    } else {
      slots_.push_back({pc.param, false, small, 0, pc.at, pc.numel});
      small += pc.numel;
    }
  }
  mq_ = alloc(pl.mq);
  vq_ = alloc(pl.vq);
  mabs_ = alloc(pl.mabs);
  vabs_ = alloc(pl.vabs);
  if (offload_.master) params_.move_masters_to_host(ops_);
  if (offload_.any()) {
    for (size_t i = 0; i < slots_.size(); ++i)
      for (int64_t o = 0; o < slots_[i].numel; o += chunk_)
        pieces8_.push_back({i, o, std::min(chunk_, slots_[i].numel - o)});
    for (Buffer& buf : stage_) buf = ops_.alloc(pl.slot);
    ops_.synchronize();  // (zeroed on the main stream, first filled on the upload stream)
  }
  std::vector<float> maps;
  if (moments_ == Moments::Torchao4) {
    maps.assign(std::begin(kTorchao4SignedMap), std::end(kTorchao4SignedMap));
    maps.insert(maps.end(), std::begin(kTorchao4UnsignedMap), std::end(kTorchao4UnsignedMap));
  } else {
    const auto signed_map = dynamic_quant_map(true), unsigned_map = dynamic_quant_map(false);
    maps.assign(signed_map.begin(), signed_map.end());
    maps.insert(maps.end(), unsigned_map.begin(), unsigned_map.end());
  }
  maps_ = ops_.alloc(pl.maps);
  const Shape ms{int64_t(maps.size())};
  ops_.copy(Tensor{maps_.data(), DType::F32, ms, ops_.device()}, Tensor{maps.data(), DType::F32, ms, Device::CPU});
}

size_t AdamW::state_bytes() const {
  return (offload_.optimizer ? 0
                             : m_.bytes() + v_.bytes() + mq_.bytes() + vq_.bytes() + mabs_.bytes() + vabs_.bytes()) +
         stage_[0].bytes() + stage_[1].bytes() + maps_.bytes();
}

ParamRange AdamW::range(const Slot& s, int64_t at, int64_t numel) const {
  return {s.param->group, s.param->decay, s.param->offset + s.at + at, numel};
}

Blockwise8 AdamW::quantised(const Slot& s, bool second) const {
  const int64_t n = s.numel, b = moment_block(moments_), blocks = (n + b - 1) / b;
  const int64_t entries = map_entries(moments_);
  const Buffer& codes = second ? vq_ : mq_;
  const Buffer& absmax = second ? vabs_ : mabs_;
  return {Tensor{static_cast<uint8_t*>(codes.data()) + s.offset, DType::U8, {code_bytes(moments_, n)}, codes.device()},
          Tensor{static_cast<float*>(absmax.data()) + s.block, DType::F32, {blocks}, absmax.device()},
          Tensor{static_cast<float*>(maps_.data()) + (second ? entries : 0), DType::F32, {entries}, maps_.device()}};
}

Tensor AdamW::fp32_moment(const Slot& s, bool second) const {
  const Buffer& b = second ? v_ : m_;
  return Tensor{static_cast<float*>(b.data()) + s.offset, DType::F32, {s.numel}, b.device()};
}

// One launch per slot (low-bit blocks start at each parameter's first element, as bitsandbytes' do, and a sharded
// slot starts on one). The flat ranges read the store wherever it keeps them (ZeRO-3: the rank's slices).
void AdamW::step_8bit(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  for (const Slot& s : slots_) {
    const Parameter& p = *s.param;
    if (!updates(p.group)) continue;
    const ParamRange r = range(s, 0, s.numel);
    AdamWParams a{lr, cfg.beta1, cfg.beta2, cfg.eps, p.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    a.grad_sumsq = grad_sumsq;
    a.max_grad_norm = cfg.max_grad_norm;
    a.sr_seed = sr_seed(r.offset);
    Tensor copy = params_.values(r);
    Tensor* copy_out = params_.values_alias_masters() ? nullptr : &copy;
    const Tensor master = params_.masters(r), grad = params_.grads(r);
    if (s.quantised && moments_ == Moments::Torchao4)
      ops_.adamw_4bit(master, grad, quantised(s, false), quantised(s, true), a, copy_out);
    else if (s.quantised)
      ops_.adamw_8bit(master, grad, quantised(s, false), quantised(s, true), a, copy_out);
    else
      ops_.adamw(master, grad, fp32_moment(s, false), fp32_moment(s, true), a, copy_out);
  }
}

AdamW::AdamW(ParameterStore& params, Ops& ops, std::vector<ParamRange> shard, Moments moments, Offload offload)
    : params_(params), ops_(ops), moments_(moments), shard_(std::move(shard)), offload_(offload) {
  make_state(plan(params, moments, offload, std::nullopt, false, &*shard_));
}

bool updated_by_muon(const Parameter& p) {
  // (Axolotl's factory: embed_tokens and lm_head go to AdamW; a classifier's score head too, a 1 x hidden matrix
  // Muon would orthogonalise into a unit vector)
  return p.trainable && p.shape.size() == 2 && p.name.find("embed_tokens") == std::string::npos &&
         p.name.find("lm_head") == std::string::npos && !p.name.starts_with("score.");
}

void AdamW::step_muon(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  SOLTRAIN_CHECK(moments_ == Moments::F32 && !offload_.any() && !shard_, "Muon with fp32 moments, resident, whole");
  const DType act = ops_.activation_dtype();
  const Tensor sumsq{muon_sumsq_.data(), DType::F64, {1}, ops_.device()};
  MuonParams mp;
  mp.momentum = cfg.muon->momentum;
  mp.ns_steps = cfg.muon->ns_steps;
  mp.grad_scale = grad_scale;
  mp.grad_sumsq = grad_sumsq;
  mp.max_grad_norm = cfg.max_grad_norm;
  if (normuon_) {  // NorMuon: Polar Express on the plain momentum (its own five coefficient triples)
    mp.nesterov = false;
    mp.coefficients = kPolarExpress;
    mp.ns_steps = 5;
    mp.norm_scale = 1.02f;
    mp.eps = 1e-6f;
  }
  for (size_t i = 0; i < params_.all().size(); ++i) {
    const Parameter& p = params_.all()[i];
    if (!p.trainable || !updates(p.group)) continue;
    const Shape flat{shape_numel(p.shape)};
    Tensor copy = p.value.view(flat);
    Tensor* copy_out = params_.values_alias_masters() ? nullptr : &copy;
    Tensor m{static_cast<float*>(m_.data()) + p.offset, DType::F32, flat, ops_.device()};
    if (!muon_param_[i]) {
      Tensor v{static_cast<float*>(v_.data()) + muon_v_at_[i], DType::F32, flat, ops_.device()};
      AdamWParams a{lr, cfg.beta1, cfg.beta2, cfg.eps, p.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
      a.grad_sumsq = grad_sumsq;
      a.max_grad_norm = cfg.max_grad_norm;
      ops_.adamw(p.master.view(flat), p.grad.view(flat), m, v, a, copy_out);
      continue;
    }
    const Tensor u{muon_u_.data(), act, flat, ops_.device()};
    ops_.muon_momentum(u, m, p.grad.view(flat), sumsq, mp);
    ops_.newton_schulz(u.view(p.shape), sumsq,
                       Tensor{muon_ns_.data(), act, {int64_t(muon_ns_.bytes() / dtype_size(act))}, ops_.device()}, mp);
    // the "original" step size: lr · √max(1, rows / cols) (Keller Jordan's; torch's adjust_lr_fn default; NorMuon's
    // normuon_lr_multiplier)
    const float scale = std::sqrt(std::max(1.0f, float(p.shape[0]) / float(p.shape[1])));
    if (normuon_) {
      ops_.normuon_variance(u.view(p.shape),
                            Tensor{static_cast<float*>(v_.data()) + muon_v_at_[i],
                                   DType::F32,
                                   {normuon_variance_size(p.shape)},
                                   ops_.device()},
                            cfg.muon->beta2);
      const float step = lr * scale;
      ops_.normuon_update(p.master.view(flat), u, cfg.muon->cautious_wd ? step * cfg.weight_decay : 0.0f, step,
                          copy_out);
      continue;
    }
    ops_.muon_update(p.master.view(flat), u, float(1.0 - double(lr) * double(cfg.weight_decay)), lr * scale, copy_out);
  }
}

void AdamW::step(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  ++step_;
  update(cfg, lr, grad_scale, grad_sumsq);
}

uint64_t AdamW::sr_seed(int64_t offset) const {
  return stochastic_seed_at(stochastic_step_seed(step_), uint64_t(offset));
}

void AdamW::step_part(const OptimizerConfig& cfg, float lr, int group) {
  SOLTRAIN_CHECK(!shard_ && group >= 0 && group < params_.groups(), "step_part: a whole store's group");
  only_group_ = group;
  update(cfg, lr, 1.0f, nullptr);
  only_group_ = -1;
}

void AdamW::update(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  SOLTRAIN_CHECK(cfg.muon.has_value() == muon_ && (!muon_ || cfg.muon->normuon == normuon_),
                 "an update with another optimizer than the state was made for");
  if (muon_) return step_muon(cfg, lr, grad_scale, grad_sumsq);
  if (low_bit(moments_))
    return offload_.any() ? step_streamed_8bit(cfg, lr, grad_scale, grad_sumsq)
                          : step_8bit(cfg, lr, grad_scale, grad_sumsq);
  if (offload_.any()) return step_streamed(cfg, lr, grad_scale, grad_sumsq);
  int64_t local = 0;
  for (const ParamRange& r : shard_ ? *shard_ : params_.ranges()) {
    if (!updates(r.group)) continue;
    Tensor master = params_.masters(r);
    const int64_t at = shard_ ? local : r.offset;
    local += r.numel;
    Tensor mt{static_cast<float*>(m_.data()) + at, DType::F32, master.shape, ops_.device()};
    Tensor vt{static_cast<float*>(v_.data()) + at, DType::F32, master.shape, ops_.device()};
    AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, r.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    p.grad_sumsq = grad_sumsq;
    p.max_grad_norm = cfg.max_grad_norm;
    p.sr_seed = sr_seed(r.offset);
    Tensor copy = params_.values(r);
    ops_.adamw(master, params_.grads(r), mt, vt, p, params_.values_alias_masters() ? nullptr : &copy);
  }
}

namespace {
constexpr const char* kFormat = "soltrain-adamw-2";        // moments per parameter name
constexpr const char* kFormat8 = "soltrain-adamw-8bit-1";  // the same, 8-bit codes and absmax where quantised

StreamedTensor fetched(std::string name, const Tensor& src, Ops& ops) {
  return {std::move(name), src.dtype, src.shape, [src, &ops](void* dst) {
            ops.copy_to_host(Tensor{dst, src.dtype, src.shape, Device::CPU}, src, DeferredWrites::queueing());
          }};
}
constexpr const char* kShardFormat = "soltrain-adamw-shard-1";  // one rank's ranges of the flat moments
// one rank's pieces of the low-bit moments: kFormat8's tensors, each a part of its parameter's
constexpr const char* kShardFormat8 = "soltrain-adamw-8bit-shard-1";
}  // namespace

// The flat layout a shard's offsets refer to: every trainable parameter's name, offset and size.
std::string layout_fingerprint(const ParameterStore& ps) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const Parameter& p : ps.all())
    if (p.trainable)
      for (char ch : cat(p.name, ":", p.offset, ":", shape_numel(p.shape), ";"))
        h = (h ^ uint8_t(ch)) * 1099511628211ull;
  return std::to_string(h);
}

void AdamW::save(const std::filesystem::path& file) const {
  if (low_bit(moments_)) {
    std::vector<StreamedTensor> tensors;
    nlohmann::json pieces = nlohmann::json::object();  // a shard's: name -> [first element, length]
    for (const Slot& s : slots_) {
      if (shard_) pieces[s.param->name] = {s.at, s.numel};
      // (a whole parameter's moments in its shape; 4-bit codes, two a byte, and a shard's pieces flat)
      auto shaped = [&](const Tensor& t, bool codes) {
        return shard_ || (codes && moments_ == Moments::Torchao4) ? t : t.view(s.param->shape);
      };
      for (bool second : {false, true}) {
        const std::string prefix = second ? "exp_avg_sq." : "exp_avg.";
        if (s.quantised) {
          const Blockwise8 q = quantised(s, second);
          tensors.push_back(fetched(prefix + s.param->name, shaped(q.code, true), ops_));
          tensors.push_back(fetched(prefix + "absmax." + s.param->name, q.absmax, ops_));
        } else {
          tensors.push_back(fetched(prefix + s.param->name, shaped(fp32_moment(s, second), false), ops_));
        }
      }
    }
    std::map<std::string, std::string> meta{{"step", std::to_string(step_)},
                                            {"format", shard_ ? kShardFormat8 : kFormat8},
                                            {"optimizer", optimizer_name()}};
    if (shard_) meta["pieces"] = pieces.dump();
    write_safetensors_streamed(file, tensors, meta);
    return;
  }
  if (shard_) {
    nlohmann::json ranges = nlohmann::json::array();
    for (const ParamRange& r : *shard_) ranges.push_back({r.offset, r.numel});
    const Shape shape{std::max<int64_t>(1, total(*shard_))};
    std::vector<StreamedTensor> tensors;
    for (auto [name, buf] : {std::pair{"exp_avg", &m_}, std::pair{"exp_avg_sq", &v_}})
      tensors.push_back({name, DType::F32, shape, [this, shape, buf](void* dst) {
                           ops_.copy_to_host(Tensor{dst, DType::F32, shape, Device::CPU},
                                             Tensor{buf->data(), DType::F32, shape, ops_.device()},
                                             DeferredWrites::queueing());
                         }});
    write_safetensors_streamed(file, tensors,
                               {{"step", std::to_string(step_)},
                                {"format", kShardFormat},
                                {"ranges", ranges.dump()},
                                {"numel", std::to_string(params_.numel())},
                                {"layout", layout_fingerprint(params_)}});
    return;
  }
  // Named per parameter, so the file does not depend on how the flat buffers are laid out; each tensor is
  // fetched from the device as the file is written (the moments are never all in host memory).
  std::vector<StreamedTensor> tensors;
  for (size_t i = 0; i < params_.all().size(); ++i) {
    const Parameter& p = params_.all()[i];
    if (!p.trainable) continue;
    for (const bool second : {false, true}) {
      const int64_t at = !second ? p.offset : muon_ ? muon_v_at_[i] : p.offset;
      if (at < 0) continue;  // (a Muon matrix has no second moment)
      const Buffer* buf = second ? &v_ : &m_;
      // (a NorMuon matrix's second state is its variance EMA, one value per row or column)
      const bool variance = second && normuon_ && muon_param_[i];
      const Shape shape = variance ? Shape{normuon_variance_size(p.shape)} : p.shape;
      tensors.push_back(
          {(variance ? "normuon_variance."
            : second ? "exp_avg_sq."
                     : "exp_avg.") +
               p.name,
           DType::F32, shape, [this, shape, buf, at](void* dst) {
             const Tensor src{static_cast<float*>(buf->data()) + at, DType::F32, shape, buf->device()};
             ops_.copy_to_host(Tensor{dst, DType::F32, shape, Device::CPU}, src, DeferredWrites::queueing());
           }});
    }
  }
  write_safetensors_streamed(file, tensors,
                             {{"step", std::to_string(step_)}, {"format", kFormat}, {"optimizer", optimizer_name()}});
}

void AdamW::load(const std::filesystem::path& file) {
  load(std::vector<std::filesystem::path>{file});
}

namespace {
// A metadata value of an optimizer file; UserError naming the file when it is missing.
std::string meta_of(const SafetensorsFile& f, const std::filesystem::path& file, const std::string& k) {
  const auto it = f.metadata().find(k);
  if (it == f.metadata().end()) user_error(file.string(), ": optimizer state has no '", k, "' in its metadata");
  return it->second;
}

// Every file of a set at one step: the first file's step kept in `step_text`, a later one at another is an error.
void same_step(const SafetensorsFile& f, const std::filesystem::path& file, std::string& step_text) {
  const std::string step = meta_of(f, file, "step");
  if (!step_text.empty() && step != step_text)
    user_error(file.string(), ": optimizer shard at step ", step, ", another at ", step_text);
  step_text = step;
}
int parsed_step(const std::string& step_text, const std::filesystem::path& file) {
  try {
    return std::stoi(step_text);
  } catch (const std::exception&) {
    user_error(file.string(), ": optimizer step \"", step_text, "\" is not a number");
  }
}
// A shard's [offset, length] ranges (its metadata).
std::vector<std::pair<int64_t, int64_t>> shard_ranges(const SafetensorsFile& f, const std::filesystem::path& file) {
  try {
    return nlohmann::json::parse(meta_of(f, file, "ranges")).get<std::vector<std::pair<int64_t, int64_t>>>();
  } catch (const nlohmann::json::exception&) {
    user_error(file.string(), ": malformed 'ranges' in its metadata");
  }
}

// One rank's shard (kShardFormat) into the whole model's flat moments; returns how many it covers.
int64_t read_shard(const SafetensorsFile& f, const std::filesystem::path& file, const ParameterStore& params,
                   std::vector<float>& m, std::vector<float>& v) {
  auto meta = [&](const std::string& k) { return meta_of(f, file, k); };
  if (meta("numel") != std::to_string(params.numel()) || meta("layout") != layout_fingerprint(params))
    user_error(file.string(), ": optimizer shard was saved for another model (parameter layout differs)");
  const std::vector<std::pair<int64_t, int64_t>> ranges = shard_ranges(f, file);
  int64_t n = 0;
  for (const auto& [off, len] : ranges) {
    if (off < 0 || len < 0 || off + len > params.numel()) user_error(file.string(), ": range outside the model");
    n += len;
  }
  std::vector<float> fm(size_t(std::max<int64_t>(1, n))), fv(fm.size());
  read_as_f32(f.at("exp_avg"), Shape{int64_t(fm.size())}, fm.data(), file.string() + ": exp_avg");
  read_as_f32(f.at("exp_avg_sq"), Shape{int64_t(fv.size())}, fv.data(), file.string() + ": exp_avg_sq");
  int64_t local = 0;
  for (const auto& [off, len] : ranges) {
    std::copy_n(fm.begin() + local, len, m.begin() + off);
    std::copy_n(fv.begin() + local, len, v.begin() + off);
    local += len;
  }
  return n;
}
}  // namespace

namespace {
// A mapped file's tensor, flat, as host memory to copy from.
Tensor mapped(const TensorEntry& e) {
  return Tensor{const_cast<void*>(e.data), e.dtype, {shape_numel(e.shape)}, Device::CPU};
}
}  // namespace

void AdamW::load_low_bit(const std::vector<std::filesystem::path>& files) {
  const int64_t b = moment_block(moments_);
  std::vector<int64_t> covered(slots_.size(), 0);
  std::string step_text;
  for (const std::filesystem::path& file : files) {
    const SafetensorsFile f(file);
    auto meta = [&](const std::string& k) { return meta_of(f, file, k); };
    const bool pieces = meta("format") == kShardFormat8;
    if (!pieces && meta("format") != kFormat8)
      user_error(file.string(), ": optimizer state of another format (", meta("format"), ") among ", optimizer_name(),
                 "'s");
    same_step(f, file, step_text);
    std::map<std::string, std::pair<int64_t, int64_t>> held;  // name -> [first element, length] of the file's piece
    if (pieces) try {
        held = nlohmann::json::parse(meta("pieces")).get<std::map<std::string, std::pair<int64_t, int64_t>>>();
      } catch (const nlohmann::json::exception&) {
        user_error(file.string(), ": malformed 'pieces' in its metadata");
      }
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      const int64_t n = shape_numel(s.param->shape);
      std::pair<int64_t, int64_t> piece{0, n};
      if (pieces) {
        const auto it = held.find(s.param->name);
        if (it == held.end()) continue;  // another rank's file holds it
        piece = it->second;
        if (piece.first < 0 || piece.second <= 0 || piece.first + piece.second > n ||
            (s.quantised && piece.first % b != 0))
          user_error(file.string(), ": ", s.param->name, "'s piece [", piece.first, ", ", piece.first + piece.second,
                     ") is not a piece of its ", n, " elements");
      }
      // The elements both hold; both start on a block boundary of the parameter, so whole blocks map over.
      const int64_t lo = std::max(s.at, piece.first), hi = std::min(s.at + s.numel, piece.first + piece.second);
      if (hi <= lo) continue;
      covered[i] += hi - lo;
      for (bool second : {false, true}) {
        const std::string name = (second ? "exp_avg_sq." : "exp_avg.") + s.param->name;
        const Tensor dst = s.quantised ? quantised(s, second).code : fp32_moment(s, second);
        const int64_t want = s.quantised ? code_bytes(moments_, piece.second) : piece.second;
        const TensorEntry& e = f.at(name);
        if (e.dtype != dst.dtype || shape_numel(e.shape) != want)
          user_error(file.string(), ": ", name, " is ", dtype_name(e.dtype), " ", shape_str(e.shape), ", expected ",
                     dtype_name(dst.dtype), " of ", want, " elements");
        // [lo, hi) in each: codes (bytes) or fp32 moments, then the blocks' absmax
        const int64_t count = s.quantised ? code_bytes(moments_, hi - lo) : hi - lo;
        const int64_t from = s.quantised ? code_bytes(moments_, lo - piece.first) : lo - piece.first;
        ops_.copy(dst.flat_part(s.quantised ? code_bytes(moments_, lo - s.at) : lo - s.at, count),
                  mapped(e).flat_part(from, count));
        if (!s.quantised) continue;
        const std::string abs_name = (second ? "exp_avg_sq.absmax." : "exp_avg.absmax.") + s.param->name;
        const Tensor abs_dst = quantised(s, second).absmax;
        const TensorEntry& a = f.at(abs_name);
        const int64_t blocks = (piece.second + b - 1) / b, nb = (hi - lo + b - 1) / b;
        if (a.dtype != DType::F32 || shape_numel(a.shape) != blocks)
          user_error(file.string(), ": ", abs_name, " is ", dtype_name(a.dtype), " ", shape_str(a.shape),
                     ", expected F32 [", blocks, "]");
        ops_.copy(abs_dst.flat_part((lo - s.at) / b, nb), mapped(a).flat_part((lo - piece.first) / b, nb));
      }
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i)
    if (covered[i] != slots_[i].numel)
      user_error(files[0].parent_path().string(), ": the optimizer files hold ", covered[i], " of ",
                 slots_[i].param->name, "'s ", slots_[i].numel,
                 " moments this rank needs (a shard file is missing or "
                 "repeated)");
  step_ = parsed_step(step_text, files[0]);
}

// A sharded optimizer's fp32 moments, each file's ranges (a shard's, or a whole file's parameters) copied where
// they meet this rank's shard: no rank reads or holds more than its own moments and one file's range at a time.
void AdamW::load_shard_fp32(const std::vector<std::filesystem::path>& files) {
  struct Mine {
    int64_t offset, numel, local;
  };
  std::vector<Mine> mine;
  int64_t local = 0;
  for (const ParamRange& r : *shard_) mine.push_back({r.offset, r.numel, local}), local += r.numel;
  int64_t covered = 0;
  std::vector<float> staged;
  // Flat elements [offset, offset + len) of the moments, held in `m` / `v` from element `first` on.
  auto place = [&](int64_t offset, int64_t len, const TensorEntry& m, const TensorEntry& v, int64_t first,
                   const std::string& what) {
    for (const Mine& r : mine) {
      const int64_t lo = std::max(offset, r.offset), hi = std::min(offset + len, r.offset + r.numel);
      if (hi <= lo) continue;
      covered += hi - lo;
      staged.resize(size_t(hi - lo));
      for (const auto& [e, buf] : {std::pair{&m, &m_}, std::pair{&v, &v_}}) {
        read_range_as_f32(*e, e->shape, first + lo - offset, hi - lo, staged.data(), what);
        const Tensor moments{buf->data(), DType::F32, {total(*shard_)}, buf->device()};
        ops_.copy(moments.flat_part(r.local + lo - r.offset, hi - lo),
                  Tensor{staged.data(), DType::F32, {hi - lo}, Device::CPU});
      }
    }
  };
  std::string step_text;
  for (const std::filesystem::path& file : files) {
    const SafetensorsFile f(file);
    auto meta = [&](const std::string& k) { return meta_of(f, file, k); };
    same_step(f, file, step_text);
    if (meta("format") == kShardFormat) {
      if (meta("numel") != std::to_string(params_.numel()) || meta("layout") != layout_fingerprint(params_))
        user_error(file.string(), ": optimizer shard was saved for another model (parameter layout differs)");
      const std::vector<std::pair<int64_t, int64_t>> ranges = shard_ranges(f, file);
      const TensorEntry &m = f.at("exp_avg"), &v = f.at("exp_avg_sq");
      int64_t at = 0;
      for (const auto& [off, len] : ranges) {
        if (off < 0 || len < 0 || off + len > params_.numel() || at + len > shape_numel(m.shape) || m.shape != v.shape)
          user_error(file.string(), ": range outside the model or its tensors");
        place(off, len, m, v, at, file.string());
        at += len;
      }
    } else if (meta("format") == kFormat) {
      for (const Parameter& p : params_.all()) {
        if (!p.trainable) continue;
        const TensorEntry &m = f.at("exp_avg." + p.name), &v = f.at("exp_avg_sq." + p.name);
        for (const TensorEntry* e : {&m, &v})
          if (e->shape != p.shape)
            user_error(file.string(), ": ", p.name, "'s moments are ", shape_str(e->shape), ", expected ",
                       shape_str(p.shape));
        place(p.offset, shape_numel(p.shape), m, v, 0, file.string() + ": " + p.name);
      }
    } else {
      user_error(file.string(), ": optimizer state of another format (", meta("format"), ")");
    }
  }
  if (covered != total(*shard_))
    user_error(files[0].parent_path().string(), ": the optimizer files hold ", covered, " of the ", total(*shard_),
               " moments this rank needs (a shard file is missing or repeated)");
  step_ = parsed_step(step_text, files[0]);
}

void AdamW::load(const std::vector<std::filesystem::path>& files) {
  SOLTRAIN_CHECK(!files.empty());
  {  // low-bit state: a whole file or shards of pieces
    const SafetensorsFile f(files[0]);
    auto meta = [&](const std::string& k) { return meta_of(f, files[0], k); };
    const bool file_8bit = meta("format") == kFormat8 || meta("format") == kShardFormat8;
    if (file_8bit != low_bit(moments_))
      user_error(files[0].string(), ": optimizer state was saved with ",
                 file_8bit ? "adamw_8bit" : "adamw (fp32 moments)", ", this run uses ",
                 file_8bit ? "adamw (fp32 moments)" : "adamw_8bit",
                 ": resume with the same optimizer, or start a fresh run");
    // Muon's momentum, torchao's 8-bit moments or AdamW's (a file without the key is AdamW's)
    const auto it = f.metadata().find("optimizer");
    const std::string saved = it == f.metadata().end() ? "adamw" : it->second;
    if (saved != optimizer_name())
      user_error(files[0].string(), ": optimizer state was saved with ", saved, ", this run uses ", optimizer_name(),
                 ": resume with the same optimizer, or start a fresh run");
    if (file_8bit) return load_low_bit(files);
    if (shard_ && (meta("format") == kShardFormat || meta("format") == kFormat)) return load_shard_fp32(files);
  }
  std::vector<float> m(size_t(params_.numel())), v(m.size());
  std::string step_text;
  int64_t covered = 0;
  for (const std::filesystem::path& file : files) {
    const SafetensorsFile f(file);
    auto meta = [&](const std::string& k) {
      const auto it = f.metadata().find(k);
      if (it == f.metadata().end()) user_error(file.string(), ": optimizer state has no '", k, "' in its metadata");
      return it->second;
    };
    same_step(f, file, step_text);
    covered += params_.numel();
    if (meta("format") == kShardFormat) {
      covered += read_shard(f, file, params_, m, v) - params_.numel();
    } else if (meta("format") == kFormat) {
      for (size_t i = 0; i < params_.all().size(); ++i) {
        const Parameter& p = params_.all()[i];
        if (!p.trainable) continue;
        for (auto [prefix, host] : {std::pair{"exp_avg.", &m}, std::pair{"exp_avg_sq.", &v}})
          if (host == &m || !muon_ || !muon_param_[i])  // (a Muon matrix's exp_avg_sq, if an older file has it, unread)
            read_as_f32(f.at(prefix + p.name), p.shape, host->data() + p.offset,
                        file.string() + ": " + prefix + p.name);
        if (normuon_ && muon_param_[i])  // its variance EMA, at the start of its place in the flat layout
          read_as_f32(f.at("normuon_variance." + p.name), Shape{normuon_variance_size(p.shape)}, v.data() + p.offset,
                      file.string() + ": normuon_variance." + p.name);
      }
    } else {
      // The first format: two flat tensors laid out [every decayed parameter | the rest], each in model order.
      if (meta("decayed_numel") != std::to_string(params_.decayed_numel()))
        user_error(file.string(), ": optimizer state was saved for another model (parameter layout differs)");
      const Shape flat{params_.numel()};
      std::vector<float> fm(m.size()), fv(m.size());
      read_as_f32(f.at("exp_avg"), flat, fm.data(), file.string() + ": exp_avg");
      read_as_f32(f.at("exp_avg_sq"), flat, fv.data(), file.string() + ": exp_avg_sq");
      int64_t off[2] = {0, params_.decayed_numel()};
      for (const Parameter& p : params_.all()) {
        if (!p.trainable) continue;
        int64_t& o = off[p.decay ? 0 : 1];
        const int64_t n = shape_numel(p.shape);
        std::copy_n(fm.begin() + o, n, m.begin() + p.offset);
        std::copy_n(fv.begin() + o, n, v.begin() + p.offset);
        o += n;
      }
    }
  }
  if (covered != params_.numel())
    user_error(files[0].parent_path().string(), ": the optimizer shards hold ", covered, " of the model's ",
               params_.numel(), " moments (a shard file is missing or repeated)");
  if (shard_) {  // keep this rank's ranges
    int64_t local = 0;
    for (const ParamRange& r : *shard_) {
      const Shape s{r.numel};
      ops_.copy(Tensor{static_cast<float*>(m_.data()) + local, DType::F32, s, ops_.device()},
                Tensor{m.data() + r.offset, DType::F32, s, Device::CPU});
      ops_.copy(Tensor{static_cast<float*>(v_.data()) + local, DType::F32, s, ops_.device()},
                Tensor{v.data() + r.offset, DType::F32, s, Device::CPU});
      local += r.numel;
    }
  } else {
    const Shape shape{params_.numel()};
    ops_.copy(Tensor{m_.data(), DType::F32, shape, m_.device()}, Tensor{m.data(), DType::F32, shape, Device::CPU});
    if (!muon_) {
      ops_.copy(Tensor{v_.data(), DType::F32, shape, v_.device()}, Tensor{v.data(), DType::F32, shape, Device::CPU});
    } else {  // AdamW's parameters' second moments, packed
      for (size_t i = 0; i < params_.all().size(); ++i) {
        const Parameter& p = params_.all()[i];
        if (muon_v_at_[i] < 0) continue;
        const Shape flat{muon_param_[i] ? normuon_variance_size(p.shape) : shape_numel(p.shape)};
        ops_.copy(Tensor{static_cast<float*>(v_.data()) + muon_v_at_[i], DType::F32, flat, v_.device()},
                  Tensor{v.data() + p.offset, DType::F32, flat, Device::CPU});
      }
    }
  }
  step_ = parsed_step(step_text, files[0]);
}

}  // namespace soltrain
