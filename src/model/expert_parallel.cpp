#include "model/expert_parallel.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "core/error.h"

namespace soltrain {

ExpertParallel::ExpertParallel(std::unique_ptr<Communicator> group, int num_experts, int num_layers,
                               LoadBalance balance)
    : group_(std::move(group)), experts_(num_experts), balance_(balance), plans_(size_t(num_layers)) {
  SOLTRAIN_CHECK(group_ && experts_ % group_->size() == 0, "expert parallel: ", experts_, " experts over ",
                 group_ ? group_->size() : 0, " ranks");
}

Tensor ExpertParallel::indices(const std::vector<int32_t>& v) {
  return Tensor{const_cast<int32_t*>(v.data()), DType::I32, {int64_t(v.size())}, Device::CPU};
}

Tensor ExpertParallel::local_offsets(int64_t layer) const {
  return indices(plans_.at(size_t(layer)).offsets);
}

Tensor ExpertParallel::transit(std::vector<char>& buffer, int64_t rows, const Tensor& like) {
  const size_t row = size_t(like.dim(1)) * dtype_size(like.dtype);
  if (buffer.size() < size_t(rows) * row) buffer.resize(size_t(rows) * row);
  return Tensor{buffer.data(), like.dtype, {rows, like.dim(1)}, Device::CPU};
}

void ExpertParallel::plan(int64_t layer, const Tensor& offsets) {
  SOLTRAIN_CHECK(offsets.device == Device::CPU, "expert parallelism runs on CPU ranks");
  const int P = size(), me = group_->rank();
  const int64_t E = experts_;
  SOLTRAIN_CHECK(offsets.numel() == E + 1, "expert parallel: offsets for ", offsets.numel() - 1, " experts");
  const int32_t* off = offsets.i32();
  Plan& p = plans_.at(size_t(layer));
  // every rank's rows per expert (a few hundred bytes; F64: a split group's collectives take F32/F64)
  std::vector<double> mine(static_cast<size_t>(E)), every(static_cast<size_t>(P * E));
  for (int64_t e = 0; e < E; ++e) mine[size_t(e)] = double(off[e + 1] - off[e]);
  group_->all_gather(Tensor{every.data(), DType::F64, {P * E}, Device::CPU},
                     Tensor{mine.data(), DType::F64, {E}, Device::CPU});
  auto count = [&](int q, int64_t e) { return int64_t(every[size_t(q * E + e)]); };
  std::vector<int64_t> rows(static_cast<size_t>(E), 0);  // the group's rows per expert
  for (int q = 0; q < P; ++q)
    for (int64_t e = 0; e < E; ++e) rows[size_t(e)] += count(q, e);
  const ExpertPlacement native = native_placement(rows, P);
  p.native_imbalance = placement_imbalance(native, P);
  const ExpertPlacement placement = balance_.on && p.native_imbalance > balance_.threshold
                                        ? least_loaded_placement(rows, P, balance_.capacity, balance_.min_rows)
                                        : native;
  p.imbalance = placement_imbalance(placement, P);

  // Each expert's rows in the group's order (rank 0's first) cut by its chunks: how many of rank q's rows of
  // expert e rank g runs (to_me for g = this rank), and this rank's own pieces (destination, expert, first pair).
  std::vector<int64_t> to_me(static_cast<size_t>(P * E), 0);
  struct Piece {
    int rank;
    int64_t expert, first, count;
  };
  std::vector<Piece> pieces;
  for (int64_t e = 0; e < E; ++e) {
    int64_t begin = 0;
    for (int q = 0; q < P; ++q) {
      const int64_t n = count(q, e);
      for (const ExpertChunk& c : placement[size_t(e)]) {
        const int64_t lo = std::max(begin, c.begin), hi = std::min(begin + n, c.end);
        if (lo >= hi) continue;
        if (c.rank == me) to_me[size_t(q * E + e)] += hi - lo;
        if (q == me) pieces.push_back({c.rank, e, off[e] + (lo - begin), hi - lo});
      }
      begin += n;
    }
  }
  // What this rank sends: by destination, each destination's rows by expert (then in pair order).
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return std::tie(a.rank, a.expert, a.first) < std::tie(b.rank, b.expert, b.first);
  });
  p.send.assign(size_t(P), 0);
  p.recv.assign(size_t(P), 0);
  p.send_order.clear();
  bool identity = true;
  for (const Piece& x : pieces) {
    p.send[size_t(x.rank)] += x.count;
    for (int64_t j = 0; j < x.count; ++j) {
      identity = identity && x.first + j == int64_t(p.send_order.size());
      p.send_order.push_back(int32_t(x.first + j));
    }
  }
  SOLTRAIN_CHECK(int64_t(p.send_order.size()) == off[E], "expert parallel: ", p.send_order.size(), " of ", off[E],
                 " pairs placed");
  p.send_inverse.assign(p.send_order.size(), 0);
  for (size_t i = 0; i < p.send_order.size(); ++i) p.send_inverse[size_t(p.send_order[i])] = int32_t(i);
  if (identity) p.send_order.clear(), p.send_inverse.clear();
  for (int q = 0; q < P; ++q)
    for (int64_t e = 0; e < E; ++e) p.recv[size_t(q)] += to_me[size_t(q * E + e)];

  // What arrives is by sender, each sender's rows by expert; the experts' GEMMs want it by expert, each expert's
  // rows by sender (the order one process would see them in: rank 0's tokens first).
  const int64_t first = run_first(), window = run_count();
  std::vector<int64_t> sender_row(size_t(P) + 1, 0);  // where sender q's rows begin
  for (int q = 0; q < P; ++q) sender_row[size_t(q) + 1] = sender_row[size_t(q)] + p.recv[size_t(q)];
  p.received = sender_row[size_t(P)];
  p.by_expert.assign(size_t(p.received), 0);
  p.by_sender.assign(size_t(p.received), 0);
  p.offsets.assign(size_t(window) + 1, 0);
  std::vector<int64_t> cursor(sender_row.begin(), sender_row.end() - 1);  // next row of each sender's block
  int64_t i = 0;
  for (int64_t e = first; e < first + window; ++e) {
    for (int q = 0; q < P; ++q)
      for (int64_t j = 0; j < to_me[size_t(q * E + e)]; ++j, ++i) {
        p.by_expert[size_t(i)] = int32_t(cursor[size_t(q)]);
        p.by_sender[size_t(cursor[size_t(q)]++)] = int32_t(i);
      }
    p.offsets[size_t(e - first) + 1] = int32_t(i);
  }
  SOLTRAIN_CHECK(i == p.received, "expert parallel: ", i, " of ", p.received, " received rows placed");
}

ExpertParallel::Load ExpertParallel::load() const {
  Load l;
  int layers = 0;
  for (const Plan& p : plans_)
    if (p.imbalance > 0) {
      l.worst = std::max(l.worst, p.imbalance);
      l.mean += p.imbalance;
      l.native_worst = std::max(l.native_worst, p.native_imbalance);
      l.native_mean += p.native_imbalance;
      ++layers;
    }
  if (layers) l.mean /= double(layers), l.native_mean /= double(layers);
  return l;
}

void ExpertParallel::dispatch(Ops& ops, int64_t layer, Tensor experts_rows, const Tensor& pairs) {
  const Plan& p = plans_.at(size_t(layer));
  SOLTRAIN_CHECK(experts_rows.dim(0) == p.received, "expert parallel dispatch: ", experts_rows.dim(0), " rows for ",
                 p.received);
  Tensor sent = pairs;
  if (!p.send_order.empty()) {
    sent = transit(sent_, int64_t(p.send_order.size()), pairs);
    ops.gather_rows(sent, pairs, indices(p.send_order));
  }
  const Tensor by_sender = transit(received_, p.received, pairs);
  group_->all_to_all(by_sender, p.recv, sent, p.send);
  ops.gather_rows(experts_rows, by_sender, indices(p.by_expert));
}

void ExpertParallel::send_back(Ops& ops, int64_t layer, Tensor pairs, const Tensor& experts_rows) {
  const Plan& p = plans_.at(size_t(layer));
  SOLTRAIN_CHECK(experts_rows.dim(0) == p.received, "expert parallel send_back: ", experts_rows.dim(0), " rows for ",
                 p.received);
  const Tensor by_sender = transit(received_, p.received, experts_rows);
  ops.gather_rows(by_sender, experts_rows, indices(p.by_sender));
  if (p.send_order.empty()) {
    group_->all_to_all(pairs, p.send, by_sender, p.recv);
    return;
  }
  const Tensor back = transit(sent_, int64_t(p.send_order.size()), experts_rows);
  group_->all_to_all(back, p.send, by_sender, p.recv);
  ops.gather_rows(pairs.rows(0, back.dim(0)), back, indices(p.send_inverse));
}

}  // namespace soltrain
