// The training data loader: documents from shards, shuffled per epoch by seed, packed greedily in order
// into rows of seq_len tokens with per-document positions and cu_seqlens, resumable from (epoch, index); the
// packing rule (pack_batch) shared with streamed datasets.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/shards.h"
#include "model/transformer.h"

namespace soltrain {

// Documents longer than seq_len: keep their first seq_len tokens, leave them out, or stop naming the first
// (Axolotl's excess_length_strategy: truncate, drop, raise).
enum class OverlongPolicy { kTruncate, kDrop, kRaise };
OverlongPolicy parse_overlong_policy(const std::string& s);  // "truncate" | "drop" | "raise"

struct LoaderOptions {
  int rows = 1, seq_len = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  OverlongPolicy overlong = OverlongPolicy::kTruncate;
  int32_t pad_id = 0;  // fills the end of a row no next document fits in (never a target)
  bool pack = true;    // false: one document per row (sample_packing: false)
};

// Where the next batch starts: document `index` of epoch `epoch`'s order. Saved with checkpoints.
struct LoaderState {
  int64_t epoch = 0, index = 0;
  // Which reader's place it is (kTokenized: the Loader's document in a shuffled order; kStreamed: the
  // StreamLoader's record in file order), so a resume under the other reader is refused rather than landing
  // on another row. Empty: unknown (a checkpoint older than the field, or another run kind's driver).
  std::string kind;
  static constexpr const char* kTokenized = "tokenized";
  static constexpr const char* kStreamed = "streamed";
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && index == o.index; }
  nlohmann::json to_json() const;
  static LoaderState from_json(const nlohmann::json& j);  // UserError on a malformed state
  // UserError when this state is another reader's than `reader` (one of the kinds above).
  void check_reader(const char* reader) const;
};

// Where a run's training rows come from: the Loader over tokenized shards, or a streamed dataset
// (data/stream_loader.h). Both pack as pack_batch does and resume from a LoaderState.
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual HostBatch next() = 0;
  virtual const LoaderState& state() const = 0;
  virtual void restore(const LoaderState& s) = 0;  // UserError when s is not a place in this data
  // Epochs done, as a fraction where the epoch's length is known (a stream's is not: whole epochs only).
  virtual double epoch_progress() const = 0;
};

// A document as packing reads it: `len` tokens (already capped at seq_len) and their mask bytes, as a ShardSet
// holds them (token_labels: the mask byte is the token's label + 1).
struct DocView {
  const int32_t* tokens = nullptr;
  const uint8_t* mask = nullptr;
  int len = 0;
  bool token_labels = false;
};

// One rows x seq_len batch packed greedily in order: `peek` gives the next document without taking it (it may roll
// the source over to its next epoch), `take` takes it. A document that does not fit starts the next row; with
// o.pack false each row holds one. Positions restart at 0 per document; padding (o.pad_id, no target) is a segment
// of its own.
HostBatch pack_batch(const LoaderOptions& o, const std::function<DocView()>& peek, const std::function<void()>& take);

// Fisher-Yates over mt19937_64 seeded from (seed, epoch): every loader's epoch order (the same on every platform).
void shuffle_for_epoch(std::vector<int64_t>& order, uint64_t seed, int64_t epoch);

class Loader : public RowSource {
 public:
  Loader(ShardSet data, LoaderOptions options);  // UserError when no document is usable

  // The next rows × seq_len batch (input_ids, targets, positions, cu_seqlens); continues into the next
  // epoch when this one runs out, so every batch is full.
  HostBatch next() override;

  const LoaderState& state() const override { return state_; }
  void restore(const LoaderState& s) override;  // UserError if s.index is outside the epoch
  double epoch_progress() const override { return double(state_.epoch) + double(state_.index) / double(documents()); }
  int64_t documents() const { return int64_t(usable_.size()); }  // per epoch, after dropping
  int64_t dropped() const { return dropped_; }
  int64_t dropped_overlong() const { return overlong_; }  // of them, left out as longer than seq_len

  // The order in which epoch `epoch` visits documents (indices into the ShardSet).
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // How many rows next() fills in one pass over epoch `epoch`'s order (the packing rule of next()).
  int64_t rows_in_epoch(int64_t epoch) const;

 private:
  void ensure_order();
  // Whether a document of `len` tokens (already capped at seq_len) goes into a row holding `fill` tokens.
  bool fits(int fill, int len) const { return (o_.pack || fill == 0) && fill + len <= o_.seq_len; }
  int capped_length(int64_t doc) const;

  ShardSet data_;
  LoaderOptions o_;
  std::vector<int64_t> usable_;
  int64_t dropped_ = 0, overlong_ = 0;
  LoaderState state_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

}  // namespace soltrain
