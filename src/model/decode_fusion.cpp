#include "model/decode_fusion.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace soltrain {

namespace {
// Whether `next` starts where `t` ends (same dtype and device).
bool follows(const Tensor& t, const Tensor& next) {
  return t.data && next.data && t.dtype == next.dtype && t.device == next.device &&
         static_cast<const char*>(t.data) + t.bytes() == next.data;
}
bool fusion_off() {
  const char* e = std::getenv("SOLTRAIN_DECODE_FUSED");
  return e && std::string_view(e) == "0";
}
}  // namespace

FusedProjection fuse_projections(std::vector<const Linear*> parts, const Ops& ops) {
  FusedProjection f;
  f.parts = std::move(parts);
  if (f.parts.size() < 2 || fusion_off()) return f;
  int64_t out = 0;
  const int64_t in = f.parts[0]->weight_parameter().shape[1];
  const bool biased = f.parts[0]->bias_parameter() != nullptr;
  for (size_t i = 0; i < f.parts.size(); ++i) {
    const Linear& p = *f.parts[i];
    const Parameter& w = p.weight_parameter();
    if (w.format != WeightFormat::Dense || p.on_fp8() || w.value.dtype != ops.activation_dtype() ||
        w.value.device != ops.device() || w.shape.size() != 2 || w.shape[1] != in ||
        (p.bias_parameter() != nullptr) != biased)
      return f;
    if (i > 0 && !follows(f.parts[i - 1]->weight_parameter().value, w.value)) return f;
    if (p.adapted()) {
      if (f.rank && p.lora_rank() != f.rank) return f;
      f.adapted.push_back(int(i));
      f.rank = p.lora_rank();
      f.scale = p.lora_scale();
    }
    out += w.shape[0];
  }
  const Tensor& first = f.parts[0]->weight_parameter().value;
  f.weight = Tensor{first.data, first.dtype, {out, in}, first.device};
  return f;
}

bool FusedProjection::biased() const {
  return !parts.empty() && parts[0]->bias_parameter() != nullptr;
}

std::array<Shape, 3> FusedProjection::copy_shapes() const {
  std::array<Shape, 3> s;
  if (!fused()) return s;
  if (biased()) s[0] = {out()};
  if (!adapted.empty()) {
    const int64_t n = int64_t(adapted.size()) * rank;
    s[1] = {n, weight.dim(1)};
    s[2] = {out(), n};
  }
  return s;
}

void FusedProjection::forward(Ops& o, Tensor y, const Tensor& x, const Tensor& u) const {
  o.linear_forward(y, x, weight, biased() ? &copies[0] : nullptr);
  if (adapted.empty()) return;
  // As Linear::forward: the scale on A's GEMM, B's product accumulated into y.
  const Tensor uu{u.data, u.dtype, {x.dim(0), copies[1].dim(0)}, u.device};
  o.linear_forward(uu, x, copies[1], nullptr, scale);
  o.linear_forward(y, uu, copies[2], nullptr, 1.0f, /*accumulate=*/true);
}

void FusedProjection::refresh(Ops& o) const {
  int64_t row0 = 0;
  for (const Linear* p : parts) {
    const int64_t rows = p->weight_parameter().shape[0];
    if (biased()) o.copy(copies[0].rows(row0, row0 + rows), p->bias_parameter()->value.view({rows}));
    row0 += rows;
  }
  if (adapted.empty()) return;
  const Tensor &a = copies[1], &bd = copies[2];
  const int64_t r = rank, width = bd.dim(1);
  const size_t e = dtype_size(bd.dtype);
  // B block-diagonal, built on the host (a row of each B lands at its own column offset) and uploaded once.
  std::vector<char> host(bd.bytes(), 0), part;
  row0 = 0;
  int64_t slot = 0;
  for (const Linear* p : parts) {
    const int64_t rows = p->weight_parameter().shape[0];
    if (p->adapted()) {
      o.copy(a.rows(slot * r, (slot + 1) * r), p->lora_a()->value);
      const Tensor& b = p->lora_b()->value;  // [rows, r]
      part.resize(b.bytes());
      o.copy(Tensor{part.data(), b.dtype, b.shape, Device::CPU}, b);
      for (int64_t j = 0; j < rows; ++j)
        std::memcpy(host.data() + size_t((row0 + j) * width + slot * r) * e, part.data() + size_t(j * r) * e,
                    size_t(r) * e);
      ++slot;
    }
    row0 += rows;
  }
  o.copy(bd, Tensor{host.data(), bd.dtype, bd.shape, Device::CPU});
}

}  // namespace soltrain
