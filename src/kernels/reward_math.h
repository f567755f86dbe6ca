// One reward-model pair's loss, its derivatives and its metrics (kernels/ops.h reward_loss), as a pure function
// shared by the CPU and CUDA backends so both compute the same values in the same order. In double, as the
// preference losses are (kernels/preference_math.h).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/ops.h"
#include "kernels/preference_math.h"  // log_sigmoid, sigmoid

namespace soltrain {

struct RewardPair {
  double loss;    // ℓ of the pair
  double dc, dr;  // d ℓ / d r_c, d ℓ / d r_r
};

// TRL's RewardTrainer: −log σ(r_c − r_r − margin) + center_coef·(r_c + r_r)² (its mean over pairs is the caller's).
SOLTRAIN_HOST_DEVICE inline RewardPair reward_pair(const RewardParams& p, double rc, double rr, double margin) {
  const double z = rc - rr - margin, s = rc + rr, c = p.center_coef;
  RewardPair q;
  q.loss = -log_sigmoid(z) + c * s * s;
  const double dz = -sigmoid(-z);  // d/dz −log σ(z)
  q.dc = dz + 2.0 * c * s;
  q.dr = -dz + 2.0 * c * s;
  return q;
}

// Pair i's part: the two tokens' weights and its metrics added to acc (kRewardStats; min and max folded in).
SOLTRAIN_HOST_DEVICE inline void apply_reward_pair(const RewardParams& p, const RewardPair& q, double rc, double rr,
                                                   int64_t c, int64_t r, float* w, double* acc) {
  w[c] = float(p.pair_scale * q.dc);
  w[r] = float(p.pair_scale * q.dr);
  acc[kRewLoss] += q.loss;
  acc[kRewAccuracy] += rc > rr ? 1.0 : 0.0;
  acc[kRewMargin] += rc - rr;
  acc[kRewChosen] += rc;
  acc[kRewRejected] += rr;
  acc[kRewMin] = fmin(acc[kRewMin], fmin(rc, rr));
  acc[kRewMax] = fmax(acc[kRewMax], fmax(rc, rr));
  acc[kRewPairs] += 1.0;
}

// Accumulators before any pair: sums 0, min +inf, max −inf.
SOLTRAIN_HOST_DEVICE inline void reward_stats_init(double* acc) {
  for (int k = 0; k < kRewardStats; ++k) acc[k] = 0.0;
  acc[kRewMin] = INFINITY;
  acc[kRewMax] = -INFINITY;
}

// stats = acc, or stats folded with acc (sums added, min / max kept).
SOLTRAIN_HOST_DEVICE inline void reward_stats_store(double* stats, const double* acc, bool accumulate) {
  for (int k = 0; k < kRewardStats; ++k)
    stats[k] = !accumulate    ? acc[k]
               : k == kRewMin ? fmin(stats[k], acc[k])
               : k == kRewMax ? fmax(stats[k], acc[k])
                              : stats[k] + acc[k];
}

}  // namespace soltrain
