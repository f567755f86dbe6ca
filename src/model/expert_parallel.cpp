#include "model/expert_parallel.h"

#include <algorithm>

#include "core/error.h"

namespace soltrain {

ExpertParallel::ExpertParallel(std::unique_ptr<Communicator> group, int num_experts, int num_layers)
    : group_(std::move(group)), experts_(num_experts), plans_(size_t(num_layers)) {
  SOLTRAIN_CHECK(group_ && experts_ % group_->size() == 0, "expert parallel: ", experts_, " experts over ",
                 group_ ? group_->size() : 0, " ranks");
}

Tensor ExpertParallel::indices(const std::vector<int32_t>& v) {
  return Tensor{const_cast<int32_t*>(v.data()), DType::I32, {int64_t(v.size())}, Device::CPU};
}

Tensor ExpertParallel::local_offsets(int64_t layer) const {
  return indices(plans_.at(size_t(layer)).offsets);
}

Tensor ExpertParallel::transit(int64_t rows, const Tensor& like) {
  const size_t row = size_t(like.dim(1)) * dtype_size(like.dtype);
  if (transit_.size() < size_t(rows) * row) transit_.resize(size_t(rows) * row);
  return Tensor{transit_.data(), like.dtype, {rows, like.dim(1)}, Device::CPU};
}

void ExpertParallel::plan(int64_t layer, const Tensor& offsets) {
  SOLTRAIN_CHECK(offsets.device == Device::CPU, "expert parallelism runs on CPU ranks");
  const int P = size();
  const int64_t El = local_experts();
  SOLTRAIN_CHECK(offsets.numel() == experts_ + 1, "expert parallel: offsets for ", offsets.numel() - 1, " experts");
  Plan& p = plans_.at(size_t(layer));
  // Each rank sends every other its pairs' counts for that rank's experts, and receives its own experts' counts
  // from each: counts[q·El + e] rows of expert first + e come from rank q.
  std::vector<int64_t> mine(static_cast<size_t>(experts_)), counts(static_cast<size_t>(P * El));
  for (int64_t e = 0; e < experts_; ++e) mine[size_t(e)] = offsets.i32()[e + 1] - offsets.i32()[e];
  const std::vector<int64_t> each(size_t(P), El);
  group_->all_to_all(Tensor{counts.data(), DType::I64, {P * El, 1}, Device::CPU}, each,
                     Tensor{mine.data(), DType::I64, {experts_, 1}, Device::CPU}, each);
  p.send.assign(size_t(P), 0);
  p.recv.assign(size_t(P), 0);
  for (int q = 0; q < P; ++q)
    for (int64_t e = 0; e < El; ++e) {
      p.send[size_t(q)] += mine[size_t(q * El + e)];
      p.recv[size_t(q)] += counts[size_t(q * El + e)];
    }
  // What arrives is by sender, each sender's rows by expert; the experts' GEMMs want it by expert, each expert's
  // rows by sender (the order one process would see them in: rank 0's tokens first).
  std::vector<int64_t> sender_row(size_t(P) + 1, 0);  // where sender q's rows begin
  for (int q = 0; q < P; ++q) sender_row[size_t(q) + 1] = sender_row[size_t(q)] + p.recv[size_t(q)];
  p.received = sender_row[size_t(P)];
  p.by_expert.assign(size_t(p.received), 0);
  p.by_sender.assign(size_t(p.received), 0);
  p.offsets.assign(size_t(El) + 1, 0);
  std::vector<int64_t> cursor(sender_row.begin(), sender_row.end() - 1);  // next row of each sender's block
  int64_t i = 0;
  for (int64_t e = 0; e < El; ++e) {
    // (each sender's block is by expert: expert e's rows follow its rows of experts < e, taken in order)
    for (int q = 0; q < P; ++q)
      for (int64_t j = 0; j < counts[size_t(q * El + e)]; ++j, ++i) {
        p.by_expert[size_t(i)] = int32_t(cursor[size_t(q)]);
        p.by_sender[size_t(cursor[size_t(q)]++)] = int32_t(i);
      }
    p.offsets[size_t(e) + 1] = int32_t(i);
  }
  SOLTRAIN_CHECK(i == p.received, "expert parallel: ", i, " of ", p.received, " received rows placed");
  // every rank's load, for the metrics (a few bytes: the counts' exchange above is the same size)
  double mine_rows = double(p.received);
  std::vector<double> loads(static_cast<size_t>(P));
  group_->all_gather(Tensor{loads.data(), DType::F64, {P}, Device::CPU},
                     Tensor{&mine_rows, DType::F64, {1}, Device::CPU});
  double most = 0, total = 0;
  for (double x : loads) most = std::max(most, x), total += x;
  p.imbalance = total > 0 ? most * double(P) / total : 1.0;
}

ExpertParallel::Load ExpertParallel::load() const {
  Load l;
  int layers = 0;
  for (const Plan& p : plans_)
    if (p.imbalance > 0) {
      l.worst = std::max(l.worst, p.imbalance);
      l.mean += p.imbalance;
      ++layers;
    }
  if (layers) l.mean /= double(layers);
  return l;
}

void ExpertParallel::dispatch(Ops& ops, int64_t layer, Tensor experts_rows, const Tensor& pairs) {
  const Plan& p = plans_.at(size_t(layer));
  SOLTRAIN_CHECK(experts_rows.dim(0) == p.received, "expert parallel dispatch: ", experts_rows.dim(0), " rows for ",
                 p.received);
  const Tensor by_sender = transit(p.received, pairs);
  group_->all_to_all(by_sender, p.recv, pairs, p.send);
  ops.gather_rows(experts_rows, by_sender, indices(p.by_expert));
}

void ExpertParallel::send_back(Ops& ops, int64_t layer, Tensor pairs, const Tensor& experts_rows) {
  const Plan& p = plans_.at(size_t(layer));
  SOLTRAIN_CHECK(experts_rows.dim(0) == p.received, "expert parallel send_back: ", experts_rows.dim(0), " rows for ",
                 p.received);
  const Tensor by_sender = transit(p.received, experts_rows);
  ops.gather_rows(by_sender, experts_rows, indices(p.by_sender));
  group_->all_to_all(pairs, p.send, by_sender, p.recv);
}

}  // namespace soltrain
