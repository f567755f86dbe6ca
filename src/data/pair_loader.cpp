#include "data/pair_loader.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace soltrain {

PairLoader::PairLoader(const ShardSet& docs, std::vector<float> ref_nll, int pairs_per_batch, int seq_len,
                       uint64_t seed, bool shuffle, bool pack, bool chosen_prompt_targets, bool unpaired)
    : docs_(docs),
      ref_(std::move(ref_nll)),
      per_batch_(pairs_per_batch),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(shuffle),
      pack_(pack),
      chosen_prompt_targets_(chosen_prompt_targets),
      unpaired_(unpaired) {
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
  // Place the pairs first: each document at the end of the first row it fits in (packed), or alone in an
  // empty row; a pair goes in only when both its answers do, so none is ever split between micro-batches.
  struct Placed {
    int64_t doc;
    int row, start, len;
  };
  std::vector<Placed> placed;
  std::vector<int> fill(size_t(rows()), 0);
  auto fit = [&](int len) {
    for (int r = 0; r < rows(); ++r)
      if ((pack_ || fill[size_t(r)] == 0) && fill[size_t(r)] + len <= seq_len_) return r;
    return -1;
  };
  auto length = [&](int64_t d) {  // the encoder already fits every answer in seq_len
    return int(std::min<int64_t>(docs_.doc_offsets[size_t(d) + 1] - docs_.doc_offsets[size_t(d)], seq_len_));
  };
  for (int taken = 0; pack_ || taken < per_batch_; ++taken) {
    if (state_.index >= pairs()) {
      if (partial) break;
      ++state_.epoch;
      state_.index = 0;
    }
    ensure_order();
    const int64_t pair = order_[size_t(state_.index)];
    const int lc = length(2 * pair), lr = length(2 * pair + 1);
    const int rc = fit(lc);
    if (rc < 0) break;
    fill[size_t(rc)] += lc;
    const int rr = fit(lr);
    if (rr < 0) {
      fill[size_t(rc)] -= lc;
      break;
    }
    placed.push_back({2 * pair, rc, fill[size_t(rc)] - lc, lc});
    placed.push_back({2 * pair + 1, rr, fill[size_t(rr)], lr});
    fill[size_t(rr)] += lr;
    ++state_.index;
  }
  // Then lay the rows out: documents in position order, each row's unused end a padding segment of its own.
  HostBatch b;
  b.rows = rows();
  b.seq_len = seq_len_;
  const size_t N = size_t(b.rows) * size_t(seq_len_);
  b.input_ids.assign(N, 0);
  b.targets.assign(N, -100);
  b.positions.assign(N, 0);
  b.cu_seqlens = {0};
  std::vector<int32_t> index_of(placed.size());      // placed document -> its index among cu_seqlens' documents
  std::vector<int32_t> prompt_of(placed.size(), 0);  // placed document -> its prompt's targets (ORPO's chosen)
  for (int r = 0; r < rows(); ++r) {
    const size_t base = size_t(r) * size_t(seq_len_);
    for (size_t k = 0; k < placed.size(); ++k) {  // a row's documents were placed in position order
      const Placed& p = placed[k];
      if (p.row != r) continue;
      const int64_t a = docs_.doc_offsets[size_t(p.doc)];
      // ORPO's chosen answer: every token a target, the prompt's (the mask's leading untrained run) counted apart
      const bool all_targets = chosen_prompt_targets_ && p.doc % 2 == 0;
      int prompt = 0;
      for (int i = 0; i < p.len; ++i) {
        const size_t at = base + size_t(p.start + i);
        b.input_ids[at] = docs_.tokens[size_t(a + i)];
        b.positions[at] = i;
        // the target of position i is token i+1, trained when the mask says that token is
        if (i + 1 < p.len && (all_targets || docs_.mask[size_t(a + i + 1)]))
          b.targets[at] = docs_.tokens[size_t(a + i + 1)];
        if (all_targets && i + 1 < p.len && prompt == i && !docs_.mask[size_t(a + i + 1)]) ++prompt;
      }
      prompt_of[k] = prompt;
      index_of[k] = int32_t(b.cu_seqlens.size() - 1);
      b.cu_seqlens.push_back(int32_t(base) + p.start + p.len);
    }
    const int used = fill[size_t(r)];
    if (used < seq_len_) {  // never a target; positions restart as for a document
      for (int i = used; i < seq_len_; ++i) b.positions[base + size_t(i)] = i - used;
      b.cu_seqlens.push_back(int32_t(base) + seq_len_);
    }
  }
  for (size_t k = 0; k < placed.size(); ++k) {  // chosen, rejected of each pair, in pair order
    b.pairs.push_back(index_of[k]);
    if (!ref_.empty()) b.ref_nll.push_back(ref_[size_t(placed[k].doc)]);
    if (chosen_prompt_targets_ && k % 2 == 0) b.prompt_targets.push_back(prompt_of[k]);
    if (unpaired_ && k % 2 == 0)
      b.desirable.push_back(docs_.mask[size_t(docs_.doc_offsets[size_t(placed[k].doc)])] != kUndesirableMark);
  }
  return b;
}

int64_t PairLoader::batches_in_epoch() const {
  PairLoader probe(docs_, {}, per_batch_, seq_len_, seed_, shuffle_, pack_, chosen_prompt_targets_, unpaired_);
  int64_t n = 0;
  while (probe.state_.epoch == 0 && probe.state_.index < probe.pairs()) probe.next(), ++n;
  return n;
}

std::vector<HostBatch> all_pair_batches(const ShardSet& docs, std::vector<float> ref_nll, int pairs_per_batch,
                                        int seq_len, bool pack, bool chosen_prompt_targets, bool unpaired) {
  std::vector<HostBatch> out;
  if (docs.documents() == 0) return out;
  PairLoader l(docs, std::move(ref_nll), pairs_per_batch, seq_len, 0, false, pack, chosen_prompt_targets, unpaired);
  for (HostBatch b = l.next(true); !b.pairs.empty(); b = l.next(true)) out.push_back(std::move(b));
  return out;
}

}  // namespace soltrain
