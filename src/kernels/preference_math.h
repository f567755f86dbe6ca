// One preference pair's loss, its derivative and its metrics, as a pure function shared by the CPU and
// CUDA backends (kernels/ops.h preference_loss), so both compute the same values in the same order. In
// double: the pair terms are few (one per answer pair), and logσ of a large margin loses nothing.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/dropout_mask.h"  // SOLTRAIN_HOST_DEVICE
#include "kernels/ops.h"

namespace soltrain {

struct PairResult {
  double loss;                // ℓ of the pair
  double dz;                  // d ℓ / d z
  double logp_c, logp_r;      // the policy's log-probs (averaged over tokens for IPO)
  double reward_c, reward_r;  // β (π − ref) of each answer
  double dnll_c, dnll_r;      // d z / d NLL sum of each answer (before dℓ/dz)
};

// log σ(x) without overflow: min(x, 0) − log1p(e^−|x|).
SOLTRAIN_HOST_DEVICE inline double log_sigmoid(double x) {
  return fmin(x, 0.0) - log1p(exp(-fabs(x)));
}
SOLTRAIN_HOST_DEVICE inline double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

// log(1 − eˣ) for x < 0 without cancellation (TRL's log1mexp: the branch at −ln 2).
SOLTRAIN_HOST_DEVICE inline double log1mexp(double x) {
  return x < -0.6931471805599453 ? log1p(-exp(x)) : log(-expm1(x));
}

// kernels/ops.h reference_free, callable on the device (ops.h's is host code: a device call to it is undefined)
SOLTRAIN_HOST_DEVICE inline bool without_reference(PreferenceLoss l) {
  return l == PreferenceLoss::Simpo || l == PreferenceLoss::Orpo;
}

// nll_* / ref_nll_*: Σ NLL of each answer (policy, reference); len_*: counted targets of each answer.
SOLTRAIN_HOST_DEVICE inline PairResult preference_pair(const PreferenceParams& p, double nll_c, double nll_r,
                                                       double ref_nll_c, double ref_nll_r, int32_t len_c,
                                                       int32_t len_r) {
  // TRL averages the log-probs over the answer's tokens for IPO (the IPO paper's per-token form), SimPO and
  // ORPO; those two have no reference.
  const bool avg = p.loss == PreferenceLoss::Ipo || without_reference(p.loss);
  const double sc = avg && len_c > 0 ? 1.0 / len_c : 1.0, sr = avg && len_r > 0 ? 1.0 / len_r : 1.0;
  PairResult r;
  r.logp_c = -nll_c * sc;
  r.logp_r = -nll_r * sr;
  const double ref_c = without_reference(p.loss) ? 0.0 : -ref_nll_c * sc;
  const double ref_r = without_reference(p.loss) ? 0.0 : -ref_nll_r * sr;
  const double beta = p.beta;
  double z = (r.logp_c - r.logp_r) - (ref_c - ref_r);
  r.dnll_c = -sc;  // z rises with π_c = −nll_c·sc
  r.dnll_r = sr;
  switch (p.loss) {
    case PreferenceLoss::Simpo:
      z -= double(p.simpo_gamma) / beta;  // the target margin γ, in the log-ratio's units
      [[fallthrough]];
    case PreferenceLoss::Sigmoid: {
      const double eps = p.label_smoothing;
      r.loss = -(1 - eps) * log_sigmoid(beta * z) - eps * log_sigmoid(-beta * z);
      // d/dz −logσ(βz) = −β σ(−βz); d/dz −logσ(−βz) = β σ(βz)
      r.dz = -(1 - eps) * beta * sigmoid(-beta * z) + eps * beta * sigmoid(beta * z);
      break;
    }
    case PreferenceLoss::Ipo: {
      const double d = z - 1.0 / (2.0 * beta);
      r.loss = d * d;
      r.dz = 2.0 * d;
      break;
    }
    case PreferenceLoss::Hinge: {
      const double h = 1.0 - beta * z;
      r.loss = h > 0 ? h : 0.0;
      r.dz = h > 0 ? -beta : 0.0;  // torch's relu has gradient 0 at 0
      break;
    }
    case PreferenceLoss::Kto:  // not a pair loss: kto_example below
      r.loss = r.dz = 0;
      break;
    case PreferenceLoss::Orpo: {
      // z is the log odds ratio: (π̄_c − π̄_r) − (log(1 − e^π̄_c) − log(1 − e^π̄_r)); d z / d π̄ = 1 / (1 − e^π̄)
      z -= log1mexp(r.logp_c) - log1mexp(r.logp_r);
      r.loss = -beta * log_sigmoid(z);
      r.dz = -beta * sigmoid(-z);
      r.dnll_c = -sc / -expm1(r.logp_c);
      r.dnll_r = sr / -expm1(r.logp_r);
      break;
    }
  }
  r.reward_c = beta * (r.logp_c - ref_c);
  r.reward_r = beta * (r.logp_r - ref_r);
  return r;
}

// Pair q's part of a micro-batch: its documents' weights d loss / d doc_nll (chosen c, rejected r; the chosen
// one, and its prompt's segment `prompt` when ORPO counts it (else -1), also carry the NLL term) and its
// metrics added to acc (kPreferenceStats sums). The CPU loop and each CUDA thread call it alike.
SOLTRAIN_HOST_DEVICE inline void apply_pair(const PreferenceParams& p, const PairResult& q, double nll_c,
                                            double nll_prompt, int64_t c, int64_t r, int64_t prompt, float* w,
                                            double* acc) {
  const double nll_w = double(p.nll_alpha) * p.nll_scale;
  w[c] = float(p.pair_scale * q.dz * q.dnll_c + nll_w);
  w[r] = float(p.pair_scale * q.dz * q.dnll_r);
  if (prompt >= 0) w[prompt] = float(nll_w);
  acc[kPrefLoss] += q.loss;
  acc[kPrefRewardChosen] += q.reward_c;
  acc[kPrefRewardRejected] += q.reward_r;
  acc[kPrefAccuracy] += q.reward_c > q.reward_r ? 1.0 : 0.0;
  acc[kPrefLogpChosen] += q.logp_c;
  acc[kPrefLogpRejected] += q.logp_r;
  acc[kPrefChosenNll] += nll_c + (prompt >= 0 ? nll_prompt : 0.0);
  acc[kPrefPairs] += 1.0;
}

// KTO's example (model/dpo_objective.h): x = π − ref of its completion (summed log-probs), kl the call's KL
// estimate (0 for apo_zero_unpaired: desirable 1 − σ(βx), undesirable σ(βx), as TRL writes it). dz = d ℓ / d x; dnll_c
// = d x / d NLL = −1 (the KL document gets no gradient).
SOLTRAIN_HOST_DEVICE inline PairResult kto_example(const PreferenceParams& p, double nll, double ref_nll, double kl,
                                                   bool desirable) {
  PairResult r;
  const double beta = p.beta, x = ref_nll - nll;
  r.logp_c = r.logp_r = -nll;
  r.reward_c = r.reward_r = beta * x;
  // 1 − σ(βm) has derivative −β·σ(βm)·σ(−βm) in m; m = x − kl (desirable) or kl − x
  const double m = desirable ? x - kl : kl - x, w = desirable ? p.desirable_weight : p.undesirable_weight;
  r.loss = w * sigmoid(-beta * m);
  r.dz = (desirable ? -1.0 : 1.0) * w * beta * sigmoid(beta * m) * sigmoid(-beta * m);
  r.dnll_c = -1.0;
  r.dnll_r = 0.0;
  return r;
}

// Example q's part: its document's weight (its KL document's is 0) and its metrics (as chosen when desirable).
SOLTRAIN_HOST_DEVICE inline void apply_kto(const PreferenceParams& p, const PairResult& q, bool desirable, int64_t e,
                                           int64_t k, float* w, double* acc) {
  w[e] = float(p.pair_scale * q.dz * q.dnll_c);
  w[k] = 0.0f;
  acc[kPrefLoss] += q.loss;
  acc[desirable ? kPrefRewardChosen : kPrefRewardRejected] += q.reward_c;
  acc[desirable ? kPrefLogpChosen : kPrefLogpRejected] += q.logp_c;
  acc[kPrefDesirable] += desirable ? 1.0 : 0.0;
  acc[kPrefPairs] += 1.0;
}

}  // namespace soltrain
