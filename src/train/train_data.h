// A run's data: every dataset tokenized into its own cached shard folder (its own field mappings), the
// documents concatenated, and the validation set taken from validation_datasets or split off by ratio.
#pragma once
#include <iosfwd>
#include <memory>

#include "data/shards.h"
#include "data/stream_loader.h"
#include "train/train_config.h"

namespace soltrain {

struct TrainData {
  ShardSet train, validation;  // validation may have no documents
};

// A streamed run (c.streaming) tokenizes only its validation data here: its training data is read as it trains.
TrainData prepare_train_data(const TrainConfig& c, std::ostream& log);

// A streamed run's training rows: c.datasets read in order (data/stream_loader.h), encoded as prepare_train_data
// would encode them, packed by `lo`'s rule; token ids checked against `vocab_size`.
std::unique_ptr<StreamLoader> stream_train_data(const TrainConfig& c, const LoaderOptions& lo, int64_t vocab_size,
                                                std::ostream& log);

// Appends b's documents to a.
void append_shards(ShardSet& a, const ShardSet& b);

// Documents [d] of `from` for the given indices, in that order.
ShardSet select_documents(const ShardSet& from, const std::vector<int64_t>& docs);

// Hugging Face's split slice (train[:20%] → {"", "20%"}): the documents from..to of `from`; slice_bounds gives
// [begin, end) of n documents (records: GRPO's prompts take the same rule).
ShardSet slice_documents(const ShardSet& from, const std::pair<std::string, std::string>& slice);
std::pair<int64_t, int64_t> slice_bounds(int64_t n, const std::pair<std::string, std::string>& slice);

// Axolotl's dataset_exact_deduplication: keeps the first of items with equal tokens and loss masks (an item:
// `docs_per_item` consecutive documents, a preference pair's 2), and drops those equal to one of `seen_in` (may
// be null); returns how many items were dropped.
int64_t drop_duplicate_documents(ShardSet& set, const ShardSet* seen_in, int docs_per_item = 1);
// Axolotl's min_sample_len: drops documents of fewer than `min_tokens` tokens; returns how many.
int64_t drop_short_documents(ShardSet& set, int64_t min_tokens);

// Surogate's `samples: n`: the dataset repeated n / size times plus a seeded random n % size of it
// (sample_indices: which of `size` documents, in order).
ShardSet sample_documents(const ShardSet& from, int64_t n, uint64_t seed);
std::vector<int64_t> sample_indices(int64_t size, int64_t n, uint64_t seed);

}  // namespace soltrain
