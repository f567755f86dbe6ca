#include "model/fp8_recipe.h"

#include <algorithm>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "kernels/quant.h"

namespace soltrain {

namespace {
Tensor at(const Buffer& b, size_t offset_bytes, DType t, Shape s) {
  return Tensor{static_cast<char*>(b.data()) + offset_bytes, t, std::move(s), b.device()};
}
size_t round256(size_t n) {
  return (n + 255) / 256 * 256;
}
// One of the four cast scratch buffers (FP8 codes of a pass's input or output gradient, or their transposes).
size_t scratch_bytes(int64_t tokens, int64_t widest) {
  return size_t(tokens * widest);
}
}  // namespace

Fp8Recipe::Fp8Recipe(Ops& ops, Fp8Settings s) : ops_(ops), settings_(s) {}

Fp8Projection* Fp8Recipe::add(int64_t out, int64_t in, bool trains, Fp8Projection* same_input_as, bool quantised) {
  SOLTRAIN_CHECK(!weights_.data(), "Fp8Recipe::add after allocate");
  SOLTRAIN_CHECK(!(quantised && trains), "a quantised base weight is frozen");
  quantised_left_ += quantised;
  if (quantised) widest_quantised_ = std::max(widest_quantised_, out * in);
  auto p = std::make_unique<Fp8Projection>();
  p->recipe_ = this;
  p->out_ = out;
  p->in_ = in;
  p->trains_ = trains;
  p->input_owner_ = same_input_as;
  SOLTRAIN_CHECK(!same_input_as || same_input_as->in_ == in, "a shared input has one width");
  widest_ = std::max({widest_, out, in});
  projections_.push_back(std::move(p));
  return projections_.back().get();
}

Fp8Recipe::Bytes Fp8Recipe::planned(const std::vector<std::pair<int64_t, int64_t>>& shapes, const Fp8Settings& s,
                                    int64_t tokens) {
  Bytes b;
  int64_t widest = 0;
  for (const auto& [out, in] : shapes) {
    b.weights += 2 * round256(size_t(out * in));  // W [out, in] and Wᵀ, E4M3
    widest = std::max({widest, out, in});
  }
  b.weights = std::max<size_t>(b.weights, 256);
  // F32 state: scale records (16 bytes each: Ops::Fp8Scaling) of the inputs [P], of the output gradients [P]
  // and of the weights [P], then the x and dy amax histories [P, H] each.
  b.state = size_t(int64_t(shapes.size()) * (12 + 2 * int64_t(s.amax_history))) * sizeof(float) + 256;
  b.scratch = 4 * scratch_bytes(tokens, widest);  // x, xᵀ, dy, dyᵀ codes
  return b;
}

void Fp8Recipe::allocate() {
  const int64_t P = int64_t(projections_.size()), H = settings_.amax_history;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const auto& p : projections_) shapes.emplace_back(p->out_, p->in_);
  const Bytes b = planned(shapes, settings_, 0);
  weights_ = ops_.alloc(b.weights);
  state_ = ops_.alloc(b.state);
  const size_t f = sizeof(float);
  x_scales_ = at(state_, 0, DType::F32, {P, 4});
  dy_scales_ = at(state_, size_t(4 * P) * f, DType::F32, {P, 4});
  x_history_ = at(state_, size_t(12 * P) * f, DType::F32, {P, H});
  dy_history_ = at(state_, size_t(12 * P + P * H) * f, DType::F32, {P, H});
  // Scales start at 1 (never used before a current-scaled first cast sets them); histories at 0.
  ops_.fill(Tensor{state_.data(), DType::F32, {12 * P}, state_.device()}, 1.0f);
  size_t off = 0;
  for (int64_t i = 0; i < P; ++i) {
    Fp8Projection& p = *projections_[size_t(i)];
    p.w8_ = at(weights_, off, DType::F8E4M3, {p.out_, p.in_});
    off += round256(size_t(p.out_ * p.in_));
    p.w8t_ = at(weights_, off, DType::F8E4M3, {p.in_, p.out_});
    off += round256(size_t(p.out_ * p.in_));
    p.x_.scale = at(state_, size_t(4 * i) * f, DType::F32, {4});
    p.dy_.scale = at(state_, size_t(4 * P + 4 * i) * f, DType::F32, {4});
    p.w_scale_ = at(state_, size_t(8 * P + 4 * i) * f, DType::F32, {4});
    if (settings_.delayed) {
      p.x_.amax = at(state_, size_t(12 * P + i * H) * f, DType::F32, {1});
      p.dy_.amax = at(state_, size_t(12 * P + P * H + i * H) * f, DType::F32, {1});
    }
  }
}

void Fp8Recipe::plan(int64_t tokens) {
  if (tokens <= scratch_tokens_) return;
  for (Buffer& b : scratch_) b = ops_.alloc(scratch_bytes(tokens, widest_));
  scratch_tokens_ = tokens;
}

Tensor Fp8Recipe::scratch(int i, int64_t rows, int64_t cols, DType t) const {
  SOLTRAIN_CHECK(rows * cols <= scratch_tokens_ * widest_, "FP8 scratch planned for ", scratch_tokens_, " tokens");
  return at(scratch_[i], 0, t, {rows, cols});
}

Tensor Fp8Recipe::amax_histories() const {
  if (!settings_.delayed || projections_.empty()) return Tensor{};
  // x's [P, H] then dy's, one after the other in state_ (allocate())
  return Tensor{x_history_.data, DType::F32, {2 * x_history_.dim(0), x_history_.dim(1)}, x_history_.device};
}

void Fp8Recipe::after_update() {
  if (settings_.delayed && !projections_.empty()) {
    ops_.fp8_update_scales(x_history_, x_scales_, quant::kE4m3Max, settings_.margin);
    ops_.fp8_update_scales(dy_history_, dy_scales_, quant::kE5m2Max, settings_.margin);
  }
  for (const auto& p : projections_) {
    if (p->trains_) p->weight_stale_ = true;
    p->x_seen_ = p->dy_seen_ = true;  // from here on the histories scale them (delayed scaling)
  }
}

size_t Fp8Recipe::device_bytes() const {
  size_t n = weights_.bytes() + state_.bytes();
  for (const Buffer& b : scratch_) n += b.bytes();
  return n;
}

void Fp8Recipe::save(const std::filesystem::path& file) const {
  std::string seen;
  for (const auto& p : projections_) seen += cat(int(p->x_seen_), int(p->dy_seen_));
  const int64_t n = int64_t(state_.bytes() / sizeof(float));
  write_safetensors_streamed(
      file,
      {{"fp8_state",
        DType::F32,
        {n},
        [this, n](void* dst) {
          ops_.copy(Tensor{dst, DType::F32, {n}, Device::CPU}, Tensor{state_.data(), DType::F32, {n}, state_.device()});
        }}},
      {{"projections", std::to_string(projections_.size())},
       {"amax_history", std::to_string(settings_.amax_history)},
       {"seen", seen}});
}

void Fp8Recipe::load(const std::filesystem::path& file) {
  const SafetensorsFile f(file);
  const auto meta = [&](const std::string& k) {
    const auto it = f.metadata().find(k);
    if (it == f.metadata().end()) user_error(file.string(), ": no '", k, "' in its metadata");
    return it->second;
  };
  if (meta("projections") != std::to_string(projections_.size()) ||
      meta("amax_history") != std::to_string(settings_.amax_history))
    user_error(file.string(), ": FP8 scaling state of ", meta("projections"), " projections with amax history ",
               meta("amax_history"), "; this run has ", projections_.size(), " and ", settings_.amax_history,
               " (resume with the checkpoint's fp8_amax_history and skip_quant_* settings)");
  const std::string seen = meta("seen");
  const int64_t n = int64_t(state_.bytes() / sizeof(float));
  const TensorEntry& e = f.at("fp8_state");
  if (e.dtype != DType::F32 || e.shape != Shape{n} || seen.size() != 2 * projections_.size())
    user_error(file.string(), ": malformed FP8 scaling state");
  ops_.copy(Tensor{state_.data(), DType::F32, {n}, state_.device()},
            Tensor{const_cast<void*>(e.data), DType::F32, {n}, Device::CPU});
  for (size_t i = 0; i < projections_.size(); ++i) {
    projections_[i]->x_seen_ = seen[2 * i] == '1';
    projections_[i]->dy_seen_ = seen[2 * i + 1] == '1';
    projections_[i]->weight_stale_ = true;  // the weights were loaded too
  }
}

// ---- one projection ----

// Delayed scaling reads the stored scale, except before the first update (no history yet): then, as with
// current scaling throughout, the cast computes the scale from the tensor itself. (Not "the tensor's first
// cast": a later micro-batch of that update would then scale from the first one's amax, which another rank
// of a data-parallel run never saw.)
Ops::Fp8Scaling Fp8Projection::scaling(Ops::Fp8Scaling s, bool seen) const {
  s.current = !recipe_->settings_.delayed || !seen;
  return s;
}

Tensor Fp8Recipe::dequantised(int64_t rows, int64_t cols) {
  const DType t = ops_.activation_dtype();
  SOLTRAIN_CHECK(rows * cols <= widest_quantised_, "a quantised projection the recipe was not told of");
  // (one allocation, for the widest: the first pass casts the projections of every size in turn)
  if (!dequant_.data()) dequant_ = ops_.alloc(size_t(widest_quantised_) * dtype_size(t));
  return Tensor{dequant_.data(), t, {rows, cols}, dequant_.device()};
}

void Fp8Recipe::dequantised_done() {
  if (--quantised_left_ == 0) dequant_ = {};  // (stream order: the casts before it have been queued)
}

void Fp8Projection::refresh_weight(Ops& o, const Weight& w) {
  if (!weight_stale_) return;
  if (w.format == WeightFormat::Dense) {
    o.fp8_quantize(w8_, w8t_, w.data, Ops::Fp8Scaling{w_scale_, {}, true});
  } else {  // a frozen QLoRA base: its dequantised values cast once
    const Tensor dense = recipe_->dequantised(out_, in_);
    o.dequantize(dense, w);
    o.fp8_quantize(w8_, w8t_, dense, Ops::Fp8Scaling{w_scale_, {}, true});
    recipe_->dequantised_done();
  }
  weight_stale_ = false;
}

void Fp8Projection::forward(Ops& o, Tensor y, const Tensor& x, const Weight& w, const Tensor* bias) {
  refresh_weight(o, w);
  recipe_->xt_cast_by_ = nullptr;
  const int64_t N = x.dim(0);
  const Tensor x8 = recipe_->scratch(0, N, in_, DType::F8E4M3);
  Fp8Projection& in = input();
  // The owner of a shared input always casts (its pass starts there); a sharer casts only when the scratch
  // does not hold its owner's cast of this very tensor (a pass that skipped the owner).
  if (input_owner_ == nullptr || recipe_->x_cast_by_ != input_owner_ || recipe_->x_cast_data_ != x.data) {
    o.fp8_quantize(x8, {}, x, in.scaling(in.x_, in.x_seen_));
    recipe_->x_cast_data_ = x.data;
    recipe_->x_cast_by_ = &in;
  }
  o.fp8_matmul(y, x8, in.x_.scale, w8_, w_scale_, bias, 1.0f, false, /*precise=*/false);
}

void Fp8Projection::backward(Ops& o, Tensor* dx, bool accumulate_dx, Tensor* dw, const Tensor& dy, const Tensor& x,
                             const Weight& w) {
  if (!dx && !dw) return;
  refresh_weight(o, w);
  const int64_t N = dy.dim(0);
  const Tensor dy8 = dx ? recipe_->scratch(2, N, out_, DType::F8E5M2) : Tensor{};
  const Tensor dyt8 = dw ? recipe_->scratch(3, out_, N, DType::F8E5M2) : Tensor{};
  o.fp8_quantize(dy8, dyt8, dy, scaling(dy_, dy_seen_));
  if (dx) o.fp8_matmul(*dx, dy8, dy_.scale, w8t_, w_scale_, nullptr, 1.0f, accumulate_dx, /*precise=*/true);
  if (dw) {
    // xᵀ with forward's scale (stored by then), recording nothing: forward already counted this x.
    const Tensor xt8 = recipe_->scratch(1, in_, N, DType::F8E4M3);
    Fp8Projection& in = input();
    const Tensor& x_scale = in.x_.scale;
    if (recipe_->xt_cast_by_ != &in || recipe_->xt_cast_data_ != x.data) {
      o.fp8_quantize({}, xt8, x, Ops::Fp8Scaling{x_scale, {}, false});
      recipe_->xt_cast_data_ = x.data;
      recipe_->xt_cast_by_ = &in;
    }
    o.fp8_matmul(*dw, dyt8, dy_.scale, xt8, x_scale, nullptr, 1.0f, /*accumulate=*/true, /*precise=*/true);
  }
}

}  // namespace soltrain
