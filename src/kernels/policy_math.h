// GRPO's clipped policy-gradient loss for one token, its derivative and its metrics, as pure functions
// shared by the CPU and CUDA backends (kernels/ops.h policy_loss), so both compute the same values in the
// same order. The definitions are TRL's GRPOTrainer._compute_loss (trl 1.16): ratio r = exp(log_ratio),
// ℓ = −min(r·A, clamp(r, 1 − ε_low, 1 + ε_high)·A) (r first capped at δ when δ > 0), plus β times the k3
// estimate of KL(π‖ref) = exp(ref − logp) − (ref − logp) − 1. torch's gradient rules are followed at the
// edges: min() at a tie and clamp() at its bounds pass the gradient on.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/dropout_mask.h"  // SOLTRAIN_HOST_DEVICE
#include "kernels/ops.h"

namespace soltrain {

// The policy-gradient part at one log importance weight `log_ratio` (the token's, or with sequence-level
// importance sampling its completion's mean) and advantage `adv`: the loss, d loss / d log_ratio, and
// whether the ratio (capped by δ) was clipped low (r < 1 − ε_low with A < 0) or high (r > 1 + ε_high with A > 0).
struct PolicyTerm {
  double loss, dlog_ratio;
  bool low, high;
};

SOLTRAIN_HOST_DEVICE inline PolicyTerm policy_term(const PolicyLossParams& p, double log_ratio, double adv) {
  const double r = exp(log_ratio);
  const double lo = 1.0 - p.epsilon_low, hi = 1.0 + p.epsilon_high;
  double c1 = r, dc1 = r;  // coef_1 and d coef_1 / d log_ratio
  if (p.delta > 0 && r > p.delta) {
    c1 = p.delta;
    dc1 = 0;
  }
  const double c2 = r < lo ? lo : (r > hi ? hi : r);
  const double dc2 = (r < lo || r > hi) ? 0.0 : r;
  const double a = c1 * adv, b = c2 * adv;
  PolicyTerm t;
  t.loss = -(a < b ? a : b);
  // torch.minimum sends the gradient to the smaller side, half to each at a tie.
  t.dlog_ratio = a < b ? -adv * dc1 : (a > b ? -adv * dc2 : -adv * 0.5 * (dc1 + dc2));
  t.low = c1 < lo && adv < 0;  // TRL counts the capped ratio
  t.high = c1 > hi && adv > 0;
  return t;
}

// k3 KL estimate at one token and its derivative by logp.
SOLTRAIN_HOST_DEVICE inline double kl_k3(double logp, double ref) {
  const double d = ref - logp;
  return exp(d) - d - 1.0;
}
SOLTRAIN_HOST_DEVICE inline double dkl_k3(double logp, double ref) {
  return 1.0 - exp(ref - logp);
}

// One counted token's weight d loss / d token_nll and its loss (into *loss) and KL term (*kl), given the
// policy term at its importance weight. `scale` is its completion's share of the update's loss (the loss type's
// normaliser). `ratio` is exp(log importance weight) (before δ's cap) and `kl_rest` what the ratio's derivative
// adds to this token's KL gradient (with kl_ratio): for token-level weights its own KL (read here); with
// sequence-level ones the completion's KL summed over its tokens, over its length (the ratio is the
// completion's, moved by each of its tokens).
// Sequence-level policy terms need nothing extra: d log_ratio / d logp = 1/len reaches each token through
// the len tokens that share it, 1 per token in all.
SOLTRAIN_HOST_DEVICE inline float policy_token_weight(const PolicyLossParams& p, const PolicyTerm& t, double logp,
                                                      double ref, double ratio, double kl_rest, double scale,
                                                      double* loss, double* kl) {
  double dlogp = t.dlog_ratio;
  double l = t.loss;
  *kl = 0;
  if (p.beta != 0) {
    const double k = kl_k3(logp, ref), dk = dkl_k3(logp, ref);
    if (p.kl_ratio) {
      *kl = k * ratio;
      dlogp += p.beta * (dk * ratio + (p.sequence_level ? kl_rest : k) * ratio);
    } else {
      *kl = k;
      dlogp += p.beta * dk;
    }
    l += p.beta * *kl;
  }
  *loss = scale * l;
  return float(-scale * dlogp);  // nll = −logp
}

// What one completion adds to a micro-batch's PolicyStat sums: acc[kPolicyLoss] its loss, and in the other
// slots its raw sums (KL over its tokens; clipped tokens, or 0/1 per completion with sequence-level weights;
// tokens). `low_mean` / `high_mean` get its own clip ratios (NaN without counted tokens, as TRL's per-sequence
// mean gives), for the micro-batch's min / max.
struct PolicyDocument {
  double loss = 0, kl = 0, low = 0, high = 0, region = 0, tokens = 0, low_mean = NAN, high_mean = NAN;
};

// Completion d (tokens [begin, end); nll, old and ref: −log p of each target under the policy, the sampling
// policy and the reference; keep, when given, a factor per token: TRL's top_entropy_quantile mask (1 or 0) times
// its importance-sampling correction, which multiply the policy term alone, not the KL, nor the clip metrics): every
// token's weight into w, and what it adds to the stats. Tokens whose target is -100 get weight 0 and count nothing.
// With sequence-level importance sampling the log ratio is the mean over the counted tokens (TRL: Σ log_ratio·mask /
// max(Σ mask, 1)); its derivative 1/len reaches each of the len tokens through the completion's len terms, so every
// token's weight takes the term's derivative once.
SOLTRAIN_HOST_DEVICE inline PolicyDocument policy_document(const PolicyLossParams& p, int32_t begin, int32_t end,
                                                           const float* nll, const int32_t* targets, const float* old,
                                                           const float* ref, const float* keep, double adv,
                                                           double scale, float* w) {
  PolicyDocument doc;
  double seq_lr = 0, seq_kl = 0, kept = 0;
  int32_t counted = 0;
  for (int32_t i = begin; i < end; ++i)
    if (targets[i] != -100) {
      ++counted;
      kept += keep ? double(keep[i]) : 1.0;
      if (old) seq_lr += double(old[i]) - double(nll[i]);  // log p − log p_old
      if (p.beta != 0) seq_kl += kl_k3(-double(nll[i]), -double(ref[i]));
    }
  const double len = counted > 0 ? counted : 1;
  if (p.sequence_level) seq_lr /= len;
  const PolicyTerm seq_term = policy_term(p, seq_lr, adv);
  const double seq_ratio = exp(seq_lr), kl_rest = seq_kl / len;
  for (int32_t i = begin; i < end; ++i) {
    if (targets[i] == -100) {
      w[i] = 0;
      continue;
    }
    const double logp = -double(nll[i]);
    const double lr = old ? double(old[i]) + logp : 0.0;
    const PolicyTerm t = p.sequence_level ? seq_term : policy_term(p, lr, adv);
    // The mask: this token's copy of the term counts keep[i] times; a sequence-level term's derivative reaches
    // each token through the kept copies alone (kept / len of them, where all give 1).
    PolicyTerm masked = t;
    if (keep) {
      masked.loss *= double(keep[i]);
      masked.dlog_ratio *= p.sequence_level ? kept / len : double(keep[i]);
    }
    const double r = p.beta != 0 ? -double(ref[i]) : 0.0;
    double l, k;
    w[i] = policy_token_weight(p, masked, logp, r, p.sequence_level ? seq_ratio : exp(lr), kl_rest, scale, &l, &k);
    doc.loss += l;
    doc.kl += k;
    if (!p.sequence_level) {
      doc.low += t.low ? 1 : 0;
      doc.high += t.high ? 1 : 0;
      doc.region += (t.low || t.high) ? 1 : 0;
    }
  }
  doc.tokens = counted;
  if (p.sequence_level) {  // one value per completion
    doc.low = seq_term.low ? 1 : 0;
    doc.high = seq_term.high ? 1 : 0;
    doc.region = (seq_term.low || seq_term.high) ? 1 : 0;
    doc.low_mean = doc.low;
    doc.high_mean = doc.high;
  } else if (counted > 0) {
    doc.low_mean = doc.low / counted;
    doc.high_mean = doc.high / counted;
  }
  return doc;
}

// The micro-batch's PolicyStat values from its completions' sums (`docs` of them with a non-zero scale).
SOLTRAIN_HOST_DEVICE inline void policy_stats(const PolicyLossParams& p, const PolicyDocument& sum, double low_min,
                                              double high_max, double docs, double* out) {
  const double tokens = sum.tokens > 0 ? sum.tokens : 1.0;
  const double per = p.sequence_level ? (docs > 0 ? docs : 1.0) : tokens;
  out[kPolicyLoss] = sum.loss;
  out[kPolicyKl] = sum.kl / tokens;
  out[kPolicyClipLow] = sum.low / per;
  out[kPolicyClipHigh] = sum.high / per;
  out[kPolicyClipRegion] = sum.region / per;
  out[kPolicyClipLowMin] = low_min;
  out[kPolicyClipHighMax] = high_max;
  out[kPolicyTokens] = sum.tokens;
}

}  // namespace soltrain
