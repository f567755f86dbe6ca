// Expert parallelism (Surogate's `ep_size`): the ranks of a data-parallel job in groups of ep_size consecutive
// ranks; within a group, rank i runs experts [i·E/P, (i+1)·E/P) for the whole group's tokens. An MoE layer's
// pairs (token, expert) are already sorted by expert (Ops::moe_permute), so the rows bound for each rank are
// one block: an all-to-all sends them to their experts' ranks, which run their grouped GEMMs over what they
// received (sorted by expert again) and send the outputs back; backward sends the outputs' gradients the same
// way and the inputs' gradients back. The router, attention and the rest stay data parallel.
//
// Over a frozen (LoRA) base a rank holds only its experts' base weights (MoeConfig::held_first, load_pretrained's
// ExpertShare); the adapters are small and stay whole: the experts a rank does not run get no gradient there, so
// the data-parallel reduction (ZeRO 0-3) sums each expert's gradient over the ranks that ran it, exactly. Full
// fine-tuning keeps every expert's weights on every rank the same way for now; holding only the local experts
// there needs the experts' gradients reduced (and their optimizer sharded) over the ranks holding the same
// experts instead of over all. CPU ranks only: the all-to-all is the host one (Communicator::all_to_all); NCCL's
// is not built.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "dist/communicator.h"
#include "kernels/ops.h"
#include "model/expert_placement.h"

namespace soltrain {

class ExpertParallel {
 public:
  // `group`: this rank's expert-parallel group (Communicator::split of the job by rank / ep_size).
  ExpertParallel(std::unique_ptr<Communicator> group, int num_experts, int num_layers, LoadBalance balance = {});
  int size() const { return group_->size(); }
  // the experts this rank owns
  int64_t first_expert() const { return int64_t(group_->rank()) * local_experts(); }
  int64_t local_experts() const { return experts_ / size(); }
  const LoadBalance& balance() const { return balance_; }
  // The experts whose rows this rank may run (local_offsets' window): its own, or every one with LLEP.
  int64_t run_first() const { return balance_.on ? 0 : first_expert(); }
  int64_t run_count() const { return balance_.on ? experts_ : local_experts(); }

  // Before layer `layer`'s experts run, from this rank's pairs' offsets by expert (I32 [E+1]): every rank
  // learns every rank's rows per expert, places them (natively, or by LLEP when the native placement's imbalance
  // is above the threshold: every rank computes the same placement), and so what it sends each rank and the order
  // that sorts what it receives by expert.
  // Kept for the layer's backward and its recompute (a sync: the counts go through the host).
  void plan(int64_t layer, const Tensor& offsets);
  int64_t received(int64_t layer) const { return plans_.at(size_t(layer)).received; }
  // The run window's experts' offsets into what this rank received (I32 [run_count + 1]).
  Tensor local_offsets(int64_t layer) const;
  // This rank's pairs [M, w] (by expert) → the rows its experts received [received, w] (by expert).
  void dispatch(Ops& ops, int64_t layer, Tensor experts_rows, const Tensor& pairs);
  // The inverse: the experts' rows back to the ranks (and pair positions) they came from.
  void send_back(Ops& ops, int64_t layer, Tensor pairs, const Tensor& experts_rows);

  // The group's balance: the most rows any rank ran over the group's mean (1: even; P: one rank took
  // everything), at each layer's last plan. Worst and mean over the layers planned (metrics ep_load_imbalance and
  // ep_load_imbalance_mean), and the same of the native placement (what it would have been without LLEP); {}
  // before any plan.
  struct Load {
    double worst = 0, mean = 0;
    double native_worst = 0, native_mean = 0;
  };
  Load load() const;

 private:
  struct Plan {
    std::vector<int64_t> send, recv;  // rows to / from each rank of the group
    // row i of what is sent is pair send_order[i], and pair j is row send_inverse[j] of it (both empty when the
    // pairs already are in the order sent: the native placement)
    std::vector<int32_t> send_order, send_inverse;
    std::vector<int32_t> by_expert;  // row i (by expert) of what was received is row by_expert[i] (by sender)
    std::vector<int32_t> by_sender;  // its inverse
    std::vector<int32_t> offsets;    // [run_count + 1]
    int64_t received = 0;
    double imbalance = 0, native_imbalance = 0;  // 0: not planned (not an MoE layer)
  };
  static Tensor indices(const std::vector<int32_t>& v);
  // `rows` rows shaped as `like`'s, in `buffer` (grown as needed)
  static Tensor transit(std::vector<char>& buffer, int64_t rows, const Tensor& like);

  std::unique_ptr<Communicator> group_;
  int64_t experts_;
  LoadBalance balance_;
  std::vector<Plan> plans_;            // per layer (MoE layers only used)
  std::vector<char> received_, sent_;  // what arrives (by sender) and what leaves (by destination) when reordered
};

}  // namespace soltrain
