#include "data/pair_loader.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace soltrain {

PairLoader::PairLoader(const ShardSet& docs, std::vector<float> ref_nll, int pairs_per_batch, int seq_len,
                       uint64_t seed, bool shuffle)
    : docs_(docs),
      ref_(std::move(ref_nll)),
      per_batch_(pairs_per_batch),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(shuffle) {
  SOLTRAIN_CHECK(docs.documents() % 2 == 0, "a pair set with an odd number of documents");
  SOLTRAIN_CHECK(ref_.empty() || int64_t(ref_.size()) == docs.documents(), "reference sums do not match the pairs");
  if (pairs() == 0) user_error("no preference pairs to train on");
}

void PairLoader::ensure_order() {
  if (order_epoch_ == state_.epoch) return;
  order_.resize(size_t(pairs()));
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = int64_t(i);
  if (shuffle_) {
    // Fisher-Yates from (seed, epoch): the same order on every rank and after a resume.
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + uint64_t(state_.epoch) + 0x51ced);
    for (size_t k = order_.size(); k > 1; --k) std::swap(order_[k - 1], order_[size_t(rng() % k)]);
  }
  order_epoch_ = state_.epoch;
}

void PairLoader::restore(const LoaderState& s) {
  if (s.epoch < 0 || s.index < 0 || s.index > pairs())
    user_error("checkpoint loader state (epoch ", s.epoch, ", index ", s.index, ") is outside the ", pairs(),
               " preference pairs of this data");
  state_ = s;
}

HostBatch PairLoader::next(bool partial) {
  HostBatch b;
  b.rows = rows();
  b.seq_len = seq_len_;
  const size_t N = size_t(b.rows) * size_t(seq_len_);
  b.input_ids.assign(N, 0);
  b.targets.assign(N, -100);
  b.positions.assign(N, 0);
  b.cu_seqlens = {0};
  int row = 0;
  for (int p = 0; p < per_batch_; ++p) {
    if (state_.index >= pairs()) {
      if (partial) break;
      ++state_.epoch;
      state_.index = 0;
    }
    ensure_order();
    const int64_t pair = order_[size_t(state_.index++)];
    for (int side = 0; side < 2; ++side, ++row) {
      const int64_t d = 2 * pair + side;
      const int64_t a = docs_.doc_offsets[size_t(d)], e = docs_.doc_offsets[size_t(d) + 1];
      const int len = int(std::min<int64_t>(e - a, seq_len_));  // the encoder already fits answers in
      const size_t base = size_t(row) * size_t(seq_len_);
      for (int i = 0; i < len; ++i) {
        b.input_ids[base + size_t(i)] = docs_.tokens[size_t(a + i)];
        b.positions[base + size_t(i)] = i;
        // the target of position i is token i+1, trained when the mask says that token is
        if (i + 1 < len && docs_.mask[size_t(a + i + 1)]) b.targets[base + size_t(i)] = docs_.tokens[size_t(a + i + 1)];
      }
      b.pairs.push_back(int32_t(b.cu_seqlens.size() - 1));
      b.cu_seqlens.push_back(int32_t(base) + len);
      if (len < seq_len_) {  // the row's padding: a segment of its own, never a target
        for (int i = len; i < seq_len_; ++i) b.positions[base + size_t(i)] = i - len;
        b.cu_seqlens.push_back(int32_t(base) + seq_len_);
      }
      if (!ref_.empty()) b.ref_nll.push_back(ref_[size_t(d)]);
    }
  }
  for (; row < b.rows; ++row) {  // rows no pair filled (the end of an evaluation): padding
    const size_t base = size_t(row) * size_t(seq_len_);
    for (int i = 0; i < seq_len_; ++i) b.positions[base + size_t(i)] = i;
    b.cu_seqlens.push_back(int32_t(base) + seq_len_);
  }
  return b;
}

}  // namespace soltrain
