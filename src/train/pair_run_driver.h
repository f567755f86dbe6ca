// The pair loader's half of a run driver (train/train_loop.h) shared by the preference runs (DPO and its relatives,
// train/run_dpo.cpp) and reward models (train/run_reward.cpp): each update's micro-batches from the PairLoader, the
// tokens an update runs, the epoch and loader state, the validation batches.
#pragma once
#include <utility>
#include <vector>

#include "data/batch_file.h"
#include "data/pair_loader.h"
#include "train/train_config.h"
#include "train/train_loop.h"

namespace soltrain {

class PairRunDriver : public RunDriver {
 public:
  PairRunDriver(const TrainConfig& c, PairLoader& loader, std::vector<HostBatch> val)
      : c_(c), loader_(loader), val_(std::move(val)), micro_(size_t(c.gradient_accumulation_steps)) {}
  // tokens/s counts the chosen and rejected tokens the step ran (rows × sequence_len), as SFT counts its rows
  double tokens_per_update() const override {
    return double(2 * c_.per_device_train_batch_size) * c_.sequence_len * c_.gradient_accumulation_steps;
  }
  double epoch() const override {
    return double(loader_.state().epoch) + double(loader_.state().index) / double(loader_.pairs());
  }
  LoaderState loader_state() const override { return loader_.state(); }
  void restore(const LoaderState& s) override { loader_.restore(s); }
  bool has_validation() const override { return !val_.empty(); }
  const char* order_name() const override { return "pair order"; }

 protected:
  // The next update's micro-batches (written out with --dump-batches, as every run's are); `done` updates before.
  std::vector<HostBatch>& next_update(int64_t done) {
    for (HostBatch& b : micro_) b = loader_.next();
    if (!c_.dump_batches.empty()) save_update_batches(c_.dump_batches, done + 1, micro_);
    return micro_;
  }
  const TrainConfig& c_;
  PairLoader& loader_;
  std::vector<HostBatch> val_;

 private:
  std::vector<HostBatch> micro_;
};

}  // namespace soltrain
