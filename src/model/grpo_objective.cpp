#include "model/grpo_objective.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace soltrain {

GrpoLossType parse_grpo_loss_type(const std::string& s, const std::string& where) {
  if (s == "grpo") return GrpoLossType::Grpo;
  if (s == "bnpo") return GrpoLossType::Bnpo;
  if (s == "dr_grpo") return GrpoLossType::DrGrpo;
  if (s == "dapo") return GrpoLossType::Dapo;
  user_error(where, ": loss_type '", s, "' is not one of grpo, bnpo, dr_grpo, dapo");
}

const char* grpo_loss_type_name(GrpoLossType t) {
  switch (t) {
    case GrpoLossType::Grpo: return "grpo";
    case GrpoLossType::Bnpo: return "bnpo";
    case GrpoLossType::DrGrpo: return "dr_grpo";
    case GrpoLossType::Dapo: return "dapo";
  }
  return "?";
}

ScaleRewards parse_scale_rewards(const std::string& s, const std::string& where) {
  // TRL still takes the booleans of its older versions: true is group, false none.
  if (s == "group" || s == "true") return ScaleRewards::Group;
  if (s == "batch") return ScaleRewards::Batch;
  if (s == "none" || s == "false") return ScaleRewards::None;
  user_error(where, ": scale_rewards '", s, "' is not one of group, batch, none");
}

const char* scale_rewards_name(ScaleRewards s) {
  switch (s) {
    case ScaleRewards::Group: return "group";
    case ScaleRewards::Batch: return "batch";
    case ScaleRewards::None: return "none";
  }
  return "?";
}

SamplingCorrection parse_sampling_correction(const std::string& s, const std::string& where) {
  if (s == "token_truncate") return SamplingCorrection::TokenTruncate;
  if (s == "token_mask") return SamplingCorrection::TokenMask;
  if (s == "sequence_truncate") return SamplingCorrection::SequenceTruncate;
  if (s == "sequence_mask") return SamplingCorrection::SequenceMask;
  user_error(where, ": '", s, "' is not one of token_truncate, token_mask, sequence_truncate, sequence_mask");
}

const char* sampling_correction_name(SamplingCorrection c) {
  switch (c) {
    case SamplingCorrection::None: return "none";
    case SamplingCorrection::TokenTruncate: return "token_truncate";
    case SamplingCorrection::TokenMask: return "token_mask";
    case SamplingCorrection::SequenceTruncate: return "sequence_truncate";
    case SamplingCorrection::SequenceMask: return "sequence_mask";
  }
  return "?";
}

void GrpoConfig::validate(const std::string& where) const {
  if (!(epsilon >= 0 && epsilon < 1)) user_error(where, ": epsilon ", epsilon, " must be in [0, 1)");
  if (!(epsilon_high >= 0)) user_error(where, ": epsilon_high ", epsilon_high, " must be >= 0");
  if (!(delta >= 0)) user_error(where, ": delta ", delta, " must be > 1 to cap the ratio, or 0 for none");
  if (delta > 0 && delta <= 1) user_error(where, ": delta ", delta, " must be > 1 (it caps the importance ratio)");
  if (!(beta >= 0) || !std::isfinite(beta)) user_error(where, ": beta ", beta, " must be >= 0");
  if (max_completion_length < 1) user_error(where, ": max_completion_length ", max_completion_length, " must be >= 1");
  if (!(top_entropy_quantile >= 0 && top_entropy_quantile <= 1))
    user_error(where, ": top_entropy_quantile ", top_entropy_quantile, " must be in [0, 1]");
  if (sampling_correction != SamplingCorrection::None) {
    if (!std::isnan(sampling_clip_min) && !(sampling_clip_min >= 0))
      user_error(where, ": vllm_importance_sampling_clip_min ", sampling_clip_min, " must be >= 0 (or none)");
    if (!std::isnan(sampling_clip_max) && !(sampling_clip_max > 0))
      user_error(where, ": vllm_importance_sampling_clip_max ", sampling_clip_max, " must be > 0 (or none)");
    if (sampling_clip_min > sampling_clip_max)
      user_error(where, ": vllm_importance_sampling_clip_min ", sampling_clip_min,
                 " is above vllm_importance_sampling_clip_max ", sampling_clip_max);
    if (std::isnan(sampling_clip_min) && std::isnan(sampling_clip_max) &&
        (sampling_correction == SamplingCorrection::TokenTruncate ||
         sampling_correction == SamplingCorrection::SequenceTruncate))
      user_error(where, ": vllm_importance_sampling_mode ", sampling_correction_name(sampling_correction),
                 " needs vllm_importance_sampling_clip_max or _clip_min (a bound to truncate at)");
  }
}

namespace {
float correction_bound(const GrpoConfig& c, float ratio) {
  const bool truncate = c.sampling_correction == SamplingCorrection::TokenTruncate ||
                        c.sampling_correction == SamplingCorrection::SequenceTruncate;
  if (truncate) {
    if (!std::isnan(c.sampling_clip_min)) ratio = std::max(ratio, c.sampling_clip_min);
    if (!std::isnan(c.sampling_clip_max)) ratio = std::min(ratio, c.sampling_clip_max);
    return ratio;
  }
  const float lo = std::isnan(c.sampling_clip_min) ? -INFINITY : c.sampling_clip_min;
  const float hi = std::isnan(c.sampling_clip_max) ? INFINITY : c.sampling_clip_max;
  return (ratio < lo || ratio > hi) ? 0.0f : ratio;
}

bool sequence_correction(const GrpoConfig& c) {
  return c.sampling_correction == SamplingCorrection::SequenceTruncate ||
         c.sampling_correction == SamplingCorrection::SequenceMask;
}

// TRL's log p_old − log p_sampling at token i, in fp32 as TRL's tensors are: 0 where nothing counts and where the
// sampling log-prob is NaN (its nan_to_num).
float correction_log_ratio(const HostBatch& b, size_t i) {
  if (b.targets[i] == -100) return 0.0f;
  const float d = (-b.old_nll[i]) - (-b.sampling_nll[i]);
  return std::isnan(d) ? 0.0f : d;
}
}  // namespace

std::vector<float> sampling_correction_weights(const GrpoConfig& c, const HostBatch& b) {
  if (c.sampling_correction == SamplingCorrection::None) return {};
  const size_t T = size_t(b.seq_len), N = size_t(b.rows) * T;
  SOLTRAIN_CHECK(b.old_nll.size() == N && b.sampling_nll.size() == N,
                 "the sampling correction needs the batch's old_nll and sampling_nll, one per token");
  std::vector<float> w(N, 1.0f);
  for (size_t t0 = 0; t0 < N; t0 += T) {
    if (sequence_correction(c)) {  // the completion's summed log ratio, one ratio for all its tokens
      float sum = 0.0f;
      for (size_t t = 0; t < T; ++t) sum += correction_log_ratio(b, t0 + t);
      std::fill(w.begin() + long(t0), w.begin() + long(t0 + T), correction_bound(c, std::exp(sum)));
    } else {
      for (size_t t = 0; t < T; ++t) w[t0 + t] = correction_bound(c, std::exp(correction_log_ratio(b, t0 + t)));
    }
  }
  return w;
}

SamplingCorrectionStats sampling_correction_stats(const GrpoConfig& c, std::span<const HostBatch> micro_batches) {
  SamplingCorrectionStats s;
  if (c.sampling_correction == SamplingCorrection::None) return s;
  double diff_sum = 0, ratio_sum = 0;
  int64_t diffs = 0, ratios = 0;
  s.ratio_min = INFINITY;
  s.ratio_max = -INFINITY;
  auto ratio = [&](double x) {
    s.ratio_min = std::min(s.ratio_min, x);
    s.ratio_max = std::max(s.ratio_max, x);
    ratio_sum += x;
    ++ratios;
  };
  for (const HostBatch& b : micro_batches) {
    const std::vector<float> w = sampling_correction_weights(c, b);
    const size_t T = size_t(b.seq_len);
    for (size_t t0 = 0; t0 < w.size(); t0 += T) {
      // a ratio per completion in the sequence modes (every row's, as TRL flattens them), else per counted token
      if (sequence_correction(c)) ratio(w[t0]);
      for (size_t i = t0; i < t0 + T; ++i) {
        if (b.targets[i] == -100) continue;
        const double d = std::fabs(double(-b.old_nll[i]) - double(-b.sampling_nll[i]));
        if (!std::isnan(d)) diff_sum += d, s.logp_diff_max = std::max(s.logp_diff_max, d), ++diffs;
        if (!sequence_correction(c)) ratio(w[i]);
      }
    }
  }
  s.logp_diff_mean = diffs ? diff_sum / double(diffs) : 0.0;
  if (ratios) {
    s.ratio_mean = ratio_sum / double(ratios);
  } else {
    s.ratio_min = s.ratio_max = 0;
  }
  return s;
}

std::vector<float> high_entropy_mask(std::span<const float> entropy, std::span<const int32_t> targets,
                                     float threshold) {
  SOLTRAIN_CHECK(entropy.size() == targets.size(), "high_entropy_mask: one entropy per target");
  std::vector<float> counted;
  for (size_t i = 0; i < entropy.size(); ++i)
    if (targets[i] != -100) counted.push_back(entropy[i]);
  std::vector<float> keep(entropy.size(), 0.0f);
  if (counted.empty()) return keep;
  std::sort(counted.begin(), counted.end());
  // torch.quantile: rank q·(n − 1) in the input's dtype, then lerp between the values either side of it (torch's
  // lerp: from the nearer end, for accuracy)
  const float rank = threshold * float(counted.size() - 1);
  const size_t below = size_t(rank), above = std::min(below + 1, counted.size() - 1);
  const float w = rank - float(below), a = counted[below], b = counted[above];
  const float cut = w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
  // Ties at the cut are common (a group's identical completions have identical entropies) and TRL keeps them all;
  // here equal contexts in different rows may differ in the last bits (another GEMM tile), so a token within
  // 1e-6 of the cut counts as reaching it.
  const float reach = cut - 1e-6f * std::fabs(cut);
  for (size_t i = 0; i < entropy.size(); ++i)
    if (targets[i] != -100 && entropy[i] >= reach) keep[i] = 1.0f;
  return keep;
}

std::pair<double, double> nan_mean_std(std::span<const double> v) {
  double s = 0, n = 0;
  for (double x : v)
    if (!std::isnan(x)) s += x, n += 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (n == 0) return {nan, nan};
  const double m = s / n;
  double q = 0;
  for (double x : v)
    if (!std::isnan(x)) q += (x - m) * (x - m);
  return {m, n > 1 ? std::sqrt(q / (n - 1)) : nan};
}

std::vector<float> grpo_advantages(std::span<const double> rewards, int num_generations, ScaleRewards scale,
                                   std::vector<bool>* zero_std) {
  const size_t n = rewards.size(), G = size_t(num_generations);
  SOLTRAIN_CHECK(G >= 1 && n % G == 0, "advantages: ", n, " rewards in groups of ", G);
  std::vector<float> adv(n);
  if (zero_std) zero_std->assign(n, false);
  const double batch_std = n > 1 ? nan_mean_std(rewards).second : 0.0;
  for (size_t g = 0; g < n; g += G) {
    const std::span<const double> group = rewards.subspan(g, G);
    const auto [mean, group_std] = nan_mean_std(group);
    const double std = scale == ScaleRewards::Batch ? batch_std : (G > 1 ? group_std : 0.0);
    for (size_t i = g; i < g + G; ++i) {
      double a = rewards[i] - mean;
      if (scale != ScaleRewards::None) a /= std + 1e-4;
      // torch.isclose(std, 0): |std| <= 1e-8 (NaN is not close)
      if (zero_std) (*zero_std)[i] = std::fabs(std) <= 1e-8;
      adv[i] = std::isnan(a) ? 0.0f : float(a);  // unscored completions (and NaN stds) carry no signal
    }
  }
  return adv;
}

std::vector<std::vector<float>> grpo_document_scales(const GrpoConfig& c, std::span<const HostBatch> micro_batches) {
  const double A = double(micro_batches.size());
  int64_t update_tokens = 0;
  for (const HostBatch& b : micro_batches) update_tokens += b.counted();
  std::vector<std::vector<float>> out;
  for (const HostBatch& b : micro_batches) {
    const std::vector<int32_t> counted = counted_per_document(b);
    const double rows = double(b.rows), tokens = double(b.counted());
    std::vector<float> s(counted.size());
    for (size_t d = 0; d < counted.size(); ++d) {
      double v = 0;
      switch (c.loss_type) {
        case GrpoLossType::Grpo: v = 1.0 / (std::max(counted[d], 1) * rows * A); break;
        case GrpoLossType::Bnpo: v = 1.0 / (std::max(tokens, 1.0) * A); break;
        case GrpoLossType::DrGrpo: v = 1.0 / (rows * c.max_completion_length * A); break;
        case GrpoLossType::Dapo: v = 1.0 / std::max(double(update_tokens), 1.0); break;
      }
      s[d] = float(v);
    }
    out.push_back(std::move(s));
  }
  return out;
}

GrpoObjective::GrpoObjective(Ops& ops, GrpoConfig cfg, int64_t max_tokens, int64_t max_rows)
    : ops_(ops),
      cfg_(cfg),
      max_tokens_(max_tokens),
      max_rows_(max_rows),
      old_(ops.alloc(size_t(max_tokens) * sizeof(float))),
      ref_(ops.alloc(size_t(max_tokens) * sizeof(float))),
      adv_(ops.alloc(size_t(max_rows) * sizeof(float))),
      scale_(ops.alloc(size_t(max_rows) * sizeof(float))),
      weight_(ops.alloc(size_t(max_tokens) * sizeof(float))),
      stats_(ops.alloc((kPolicyStats + 1) * sizeof(double))),
      keep_(cfg.top_entropy_quantile < 1 || cfg.sampling_correction != SamplingCorrection::None
                ? ops.alloc(size_t(max_tokens) * sizeof(float))
                : Buffer{}),
      upload_old_(ops, size_t(max_tokens) * sizeof(float)),
      upload_ref_(ops, size_t(max_tokens) * sizeof(float)),
      upload_adv_(ops, size_t(max_rows) * sizeof(float)),
      upload_scale_(ops, size_t(max_rows) * sizeof(float)) {
  cfg_.validate("grpo");
  if (cfg_.sampling_correction != SamplingCorrection::None && cfg_.top_entropy_quantile >= 1)
    upload_keep_.emplace(ops, size_t(max_tokens) * sizeof(float));
}

void GrpoObjective::begin_update() {
  first_ = true;
  micro_batches_ = 0;
}

void GrpoObjective::set_micro_batch(Ops& ops, const HostBatch& b, std::span<const float> doc_scale) {
  const int64_t N = int64_t(b.rows) * b.seq_len, R = b.rows;
  SOLTRAIN_CHECK(N <= max_tokens_ && R <= max_rows_ && b.cu_seqlens.empty(),
                 "a GRPO micro-batch larger than planned, or packed");
  SOLTRAIN_CHECK(int64_t(b.advantages.size()) == R && int64_t(doc_scale.size()) == R,
                 "a GRPO micro-batch needs one advantage and one scale per row");
  upload_adv_(ops, Tensor{adv_.data(), DType::F32, {R}, adv_.device()}, b.advantages.data());
  upload_scale_(ops, Tensor{scale_.data(), DType::F32, {R}, scale_.device()}, doc_scale.data());
  has_old_ = !b.old_nll.empty();
  if (has_old_) {
    SOLTRAIN_CHECK(int64_t(b.old_nll.size()) == N, "old_nll: one value per token");
    upload_old_(ops, Tensor{old_.data(), DType::F32, {N}, old_.device()}, b.old_nll.data());
  }
  if (!b.ref_token_nll.empty()) {
    SOLTRAIN_CHECK(int64_t(b.ref_token_nll.size()) == N, "ref_token_nll: one value per token");
    upload_ref_(ops, Tensor{ref_.data(), DType::F32, {N}, ref_.device()}, b.ref_token_nll.data());
  }
  host_correction_ = sampling_correction_weights(cfg_, b);
  if (upload_keep_)  // known before the forward: staged like the advantages, no sync in add_loss
    (*upload_keep_)(ops, Tensor{keep_.data(), DType::F32, {N}, keep_.device()}, host_correction_.data());
  weights_ready_ = false;
}

void GrpoObjective::set_reference(Ops& ops, const Tensor& ref_token_nll) {
  SOLTRAIN_CHECK(ref_token_nll.numel() <= max_tokens_, "reference NLL for more tokens than planned");
  ops.copy(Tensor{ref_.data(), DType::F32, {ref_token_nll.numel()}, ref_.device()}, ref_token_nll);
}

void GrpoObjective::add_loss(Ops& ops, const ForwardOutputs& out) {
  const int64_t N = out.token_nll.numel(), D = out.seq.cu_seqlens.numel() - 1;
  PolicyLossParams p;
  p.epsilon_low = cfg_.epsilon;
  p.epsilon_high = cfg_.epsilon_high;
  p.delta = cfg_.delta;
  p.beta = cfg_.beta;
  p.sequence_level = cfg_.sequence_level;
  p.kl_ratio = cfg_.kl_ratio;
  auto f32 = [](const Buffer& b, int64_t n) { return Tensor{b.data(), DType::F32, {n}, b.device()}; };
  const Tensor ent = out.token_entropy.rows(0, N);
  Tensor keep;
  std::vector<float> k;
  if (cfg_.top_entropy_quantile < 1) {
    // TRL's high-entropy mask from this micro-batch's entropies (read back: a sync per micro-batch while it is on)
    host_entropy_.resize(size_t(N));
    host_targets_.resize(size_t(N));
    ops.copy(Tensor{host_entropy_.data(), DType::F32, {N}, Device::CPU}, ent);
    ops.copy(Tensor{host_targets_.data(), DType::I32, {N}, Device::CPU}, out.targets.rows(0, N));
    k = high_entropy_mask(host_entropy_, host_targets_, 1.0f - cfg_.top_entropy_quantile);
  }
  if (!k.empty()) {
    // TRL multiplies the policy term by the mask, then by the correction
    if (!host_correction_.empty()) {
      SOLTRAIN_CHECK(int64_t(host_correction_.size()) == N, "sampling correction weights: one per token");
      for (size_t i = 0; i < k.size(); ++i) k[i] *= host_correction_[i];
    }
    keep = f32(keep_, N);
    ops.copy(keep, Tensor{k.data(), DType::F32, {N}, Device::CPU});
  } else if (upload_keep_) {
    keep = f32(keep_, N);  // (the correction's weights, staged by set_micro_batch)
  }
  ops.policy_loss(f32(weight_, N), Tensor{stats_.data(), DType::F64, {kPolicyStats}, stats_.device()}, out.token_nll,
                  out.targets, has_old_ ? f32(old_, N) : Tensor{}, f32(ref_, N), keep, f32(adv_, D), f32(scale_, D),
                  out.seq.cu_seqlens, p, !first_);
  // TRL's entropy metric: this micro-batch's mean over its completion tokens (the entropy is 0 elsewhere), summed
  // here and divided by the micro-batches at read().
  ops.scale(ent, out.counted > 0 ? 1.0f / float(out.counted) : 0.0f);
  ops.reduce_sum(Tensor{static_cast<double*>(stats_.data()) + kPolicyStats, DType::F64, {1}, stats_.device()}, ent,
                 /*squares=*/false, !first_);
  first_ = false;
  weights_ready_ = true;
  ++micro_batches_;
}

void GrpoObjective::token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) {
  SOLTRAIN_CHECK(weights_ready_, "token_weights before this micro-batch's forward");
  ops.copy(weight, Tensor{weight_.data(), DType::F32, {out.token_nll.numel()}, weight_.device()});
}

GrpoMetrics GrpoObjective::read(Ops& ops) const {
  GrpoMetrics m;
  if (first_) return m;
  double s[kPolicyStats + 1];
  ops.copy(Tensor{s, DType::F64, {kPolicyStats + 1}, Device::CPU},
           Tensor{stats_.data(), DType::F64, {kPolicyStats + 1}, stats_.device()});
  const double k = double(std::max<int64_t>(micro_batches_, 1));
  m.loss = s[kPolicyLoss];
  m.kl = s[kPolicyKl] / k;
  m.clip_low = s[kPolicyClipLow] / k;
  m.clip_high = s[kPolicyClipHigh] / k;
  m.clip_region = s[kPolicyClipRegion] / k;
  m.clip_low_min = s[kPolicyClipLowMin] / k;
  m.clip_high_max = s[kPolicyClipHighMax] / k;
  m.entropy = s[kPolicyStats] / k;
  m.tokens = int64_t(s[kPolicyTokens]);
  m.micro_batches = micro_batches_;
  return m;
}

void grpo_micro_batch(Transformer& model, GrpoObjective& grpo, const HostBatch& batch, std::span<const float> scale,
                      bool backward) {
  grpo.set_micro_batch(model.ops(), batch, scale);
  if (grpo.config().beta != 0 && batch.ref_token_nll.empty()) {
    GrpoReference ref(grpo);
    if (model.lora()) {
      model.enable_adapters(false);
      model.forward(batch, &ref, /*backward_follows=*/false);
      model.enable_adapters(true);
    } else {
      SOLTRAIN_CHECK(grpo.reference_weights(), "GRPO's reference pass under full fine-tuning needs reference weights");
      const ReferenceWeights::Lend lent(*grpo.reference_weights(), model.params());
      model.forward(batch, &ref, /*backward_follows=*/false);
    }
  }
  model.forward(batch, &grpo, backward);
  if (backward) model.backward(grpo);
}

}  // namespace soltrain
