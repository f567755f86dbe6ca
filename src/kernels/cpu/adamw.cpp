// CPU: torch.optim.AdamW's single-tensor update, operation for operation (so fp32 results match).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/blockwise4.h"
#include "kernels/blockwise8.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/stochastic_round.h"

namespace soltrain {

namespace {
// One update's scalars, as torch computes them (bias corrections in double from the Python-float betas), and
// the element update itself, shared by the fp32 and the 8-bit moments.
struct AdamWStep {
  explicit AdamWStep(const AdamWParams& p)
      : bc2_sqrt(float(std::sqrt(1.0 - std::pow(p.beta2, p.step)))),
        step_size(float(double(p.lr) / (1.0 - std::pow(p.beta1, p.step)))),
        decay(float(1.0 - double(p.lr) * double(p.weight_decay))),
        b1c(float(1.0 - p.beta1)),
        b2c(float(1.0 - p.beta2)),
        beta2(float(p.beta2)),
        eps(p.eps),
        grad_scale(p.grad_scale * host_clip_factor(p)) {}
  void update(float& w, float& m, float& v, float g) const {
    w *= decay;
    const float gi = g * grad_scale;  // the one fp32 multiply torch's clip_grad_norm_ does in place
    m += b1c * (gi - m);              // lerp, as torch writes it
    v = v * beta2 + b2c * gi * gi;
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    w -= step_size * (m / denom);
  }
  float bc2_sqrt, step_size, decay, b1c, b2c, beta2, eps, grad_scale;
};

// The master's elements as fp32 for the update, and the updated values back: in place for an fp32 master; a
// BF16 one (bf16_stochastic_round) is widened into a scratch and rounded back stochastically, its fp32 compute
// copy (the CPU computes in fp32) receiving the rounded values.
class MasterAccess {
 public:
  MasterAccess(Tensor& master, Tensor* copy, const AdamWParams& p) : master_(master), seed_(p.sr_seed) {
    if (master.dtype == DType::F32) {
      SOLTRAIN_CHECK(!copy || copy->data == master.data, "the CPU computes in fp32: no copy");
      w_ = master.f32();
      return;
    }
    SOLTRAIN_CHECK(master.dtype == DType::BF16 && (!copy || copy->dtype == DType::F32), "AdamW on a ",
                   dtype_name(master.dtype), " master (fp32, or bf16 with an fp32 copy)");
    copy_ = copy ? copy->f32() : nullptr;
    wide_.resize(size_t(master.numel()));
    const uint16_t* b = master.as<uint16_t>();
    for (size_t i = 0; i < wide_.size(); ++i) wide_[i] = bf16_to_f32(b[i]);
    w_ = wide_.data();
  }
  float* w() { return w_; }
  void write_back() {
    if (wide_.empty()) return;
    uint16_t* b = master_.as<uint16_t>();
    for (size_t i = 0; i < wide_.size(); ++i) {
      b[i] = bf16_round_stochastic(wide_[i], stochastic_bits(seed_, i));
      if (copy_) copy_[i] = bf16_to_f32(b[i]);
    }
  }

 private:
  Tensor& master_;
  uint64_t seed_;
  float* w_ = nullptr;
  float* copy_ = nullptr;
  std::vector<float> wide_;
};
}  // namespace

void CpuOps::adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p, Tensor* compute_copy) {
  MasterAccess access(param, compute_copy, p);
  float *w = access.w(), *mp = m.f32(), *vp = v.f32();
  const float* g = grad.f32();
  const AdamWStep step(p);
  for (int64_t i = 0, n = param.numel(); i < n; ++i) step.update(w[i], mp[i], vp[i], g[i]);
  access.write_back();
}

// bitsandbytes' 8-bit blockwise AdamW (kernels/blockwise8.h) with the update above, element for element.
void CpuOps::adamw_8bit(Tensor param, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                        const AdamWParams& p, Tensor* compute_copy) {
  MasterAccess access(param, compute_copy, p);
  float* w = access.w();
  const float* g = grad.f32();
  uint8_t *mc = m.code.as<uint8_t>(), *vc = v.code.as<uint8_t>();
  float *ma = m.absmax.f32(), *va = v.absmax.f32();
  const float *mmap = m.map.f32(), *vmap = v.map.f32();
  float mmid[255], vmid[255];  // (map[i] + map[i+1]) / 2, as torch computes the bucket bounds
  for (int i = 0; i < 255; ++i) {
    mmid[i] = (mmap[i] + mmap[i + 1]) / 2;
    vmid[i] = (vmap[i] + vmap[i + 1]) / 2;
  }
  const AdamWStep step(p);
  const int64_t n = param.numel();
  float mb[kBlockwise8Block], vb[kBlockwise8Block];  // one block's updated moments, before quantising
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kBlockwise8Block, ++blk) {
    const int64_t len = std::min(kBlockwise8Block, n - b0);
    float mmax = 0, vmax = 0;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = b0 + j;
      float mi = mmap[mc[i]] * ma[blk], vi = vmap[vc[i]] * va[blk];
      step.update(w[i], mi, vi, g[i]);
      mb[j] = mi;
      vb[j] = vi;
      mmax = std::max(mmax, std::fabs(mi));
      vmax = std::max(vmax, std::fabs(vi));
    }
    // bitsandbytes: scaled = clamp(x * (1 / max(absmax, 1e-38)), -1, 1), then the nearest code
    const float minv = 1.0f / std::max(mmax, 1e-38f), vinv = 1.0f / std::max(vmax, 1e-38f);
    for (int64_t j = 0; j < len; ++j) {
      mc[b0 + j] = quantize_to_map(std::clamp(mb[j] * minv, -1.0f, 1.0f), mmid);
      vc[b0 + j] = quantize_to_map(std::clamp(vb[j] * vinv, -1.0f, 1.0f), vmid);
    }
    ma[blk] = mmax;
    va[blk] = vmax;
  }
  access.write_back();
}

// torchao's AdamW4bit (kernels/blockwise4.h): per block of 128, the moments dequantised, the update above in fp32
// (the new moments, not their quantised values, make the step, as torchao's), then each moment's block scaled by its
// max |x| and quantised again.
void CpuOps::adamw_4bit(Tensor param, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                        const AdamWParams& p, Tensor* compute_copy) {
  SOLTRAIN_CHECK(!compute_copy || compute_copy->data == param.data, "the CPU computes in fp32: no copy");
  SOLTRAIN_CHECK(param.dtype == DType::F32, "adamw_4bit: an fp32 master");
  const int64_t n = param.numel();
  SOLTRAIN_CHECK(n % kBlockwise4Block == 0 && m.code.numel() == n / 2 && m.absmax.numel() == n / kBlockwise4Block,
                 "adamw_4bit: a parameter of whole blocks");
  float* w = param.f32();
  const float* g = grad.f32();
  uint8_t *mc = m.code.as<uint8_t>(), *vc = v.code.as<uint8_t>();
  float *ms = m.absmax.f32(), *vs = v.absmax.f32();
  const float *mmap = m.map.f32(), *vmap = v.map.f32();
  const AdamWStep step(p);
  float mb[kBlockwise4Block], vb[kBlockwise4Block];
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kBlockwise4Block, ++blk) {
    float am = 0, av = 0;
    for (int64_t k = 0; k < kBlockwise4Block; ++k) {
      const int64_t i = b0 + k;
      const uint8_t mbyte = mc[i / 2], vbyte = vc[i / 2];
      const int mcode = i % 2 ? mbyte & 15 : mbyte >> 4, vcode = i % 2 ? vbyte & 15 : vbyte >> 4;
      mb[k] = mmap[mcode] * ms[blk];
      vb[k] = vmap[vcode] * vs[blk];
      step.update(w[i], mb[k], vb[k], g[i]);
      am = std::max(am, std::fabs(mb[k]));
      av = std::max(av, std::fabs(vb[k]));
    }
    ms[blk] = std::max(am, 1e-12f);
    vs[blk] = std::max(av, 1e-12f);
    for (int64_t k = 0; k < kBlockwise4Block; k += 2) {
      const int64_t i = b0 + k;
      mc[i / 2] = uint8_t(quantize4(mb[k] / ms[blk], mmap) << 4 | quantize4(mb[k + 1] / ms[blk], mmap));
      vc[i / 2] = uint8_t(quantize4(vb[k] / vs[blk], vmap) << 4 | quantize4(vb[k + 1] / vs[blk], vmap));
    }
  }
}

}  // namespace soltrain
