// A streamed dataset (Axolotl's pretraining_dataset, or `streaming: true`): records read in order from the
// datasets' files as training needs them, each encoded as `soltrain tokenize` encodes it (data/record_encoder.h)
// and packed as the Loader packs (pack_batch); the dataset is never whole in memory, nor tokenized ahead.
// An epoch is one pass over every input in the order given. The LoaderState's index counts the records of the
// pass (bad and dropped ones too) before the first one the next batch holds, so a resume continues at that exact
// record, reading past the ones before it without encoding them.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/record_encoder.h"
#include "data/record_reader.h"

namespace soltrain {

struct StreamInput {
  std::filesystem::path path;  // a data file or a folder of them
  std::string split;
  DatasetType type = DatasetType::kAuto;
  DatasetFields fields;
  // Called before the input is first opened (a hub dataset's file downloaded only when the stream reaches it).
  std::function<void()> fetch;
};

struct StreamOptions {
  LoaderOptions loader;  // rows, seq_len, pack, overlong policy, pad id (shuffle and seed: not used, read in order)
  std::filesystem::path tokenizer_dir;
  bool train_on_inputs = false;
  BadRecordPolicy bad_records = BadRecordPolicy::kError;
  int64_t vocab_size = 0;  // > 0: a token id at or above it is a UserError (the model's vocabulary)
  int64_t min_tokens = 0;  // documents shorter than this are dropped (Axolotl's min_sample_len)
};

class StreamLoader : public RowSource {
 public:
  // `log` (may be null) gets a line when the first bad record is skipped. UserError when there is no input.
  StreamLoader(std::vector<StreamInput> inputs, StreamOptions options, std::ostream* log = nullptr);
  ~StreamLoader() override;

  HostBatch next() override;
  const LoaderState& state() const override { return state_; }
  void restore(const LoaderState& s) override;  // UserError when the pass has fewer records than s.index
  double epoch_progress() const override { return double(state_.epoch); }

  int64_t skipped() const { return skipped_; }            // bad records skipped (bad_records: skip)
  int64_t dropped() const { return dropped_; }            // empty, too short or (drop) too long documents
  int64_t dropped_overlong() const { return overlong_; }  // of them, longer than seq_len
  int64_t documents_read() const { return documents_; }   // usable documents encoded so far
  int64_t records_in_pass() const { return records_; }    // records read in this pass

 private:
  void start_pass();     // the first input, from its first record
  bool read_record();    // the next record of the pass into rec_ (false at its end)
  void read_document();  // fills pending_ with the next usable document, rolling over to the next pass
  DocView peek();
  void take();

  std::vector<StreamInput> in_;
  StreamOptions o_;
  std::ostream* log_;
  size_t input_ = 0;
  std::unique_ptr<RecordReader> reader_;
  Tokenizer tok_;                                    // loaded once for every input
  std::vector<std::unique_ptr<RecordEncoder>> enc_;  // per input, made when it is first read
  nlohmann::ordered_json rec_;
  std::string where_, error_;
  int64_t records_ = 0;         // records read in this pass
  int64_t usable_in_pass_ = 0;  // documents this pass has given (a pass with none would loop for ever)
  bool whole_pass_ = true;      // this pass was read from its first record (not resumed part-way)
  std::optional<Document> pending_;
  LoaderState state_;
  int64_t skipped_ = 0, dropped_ = 0, overlong_ = 0, documents_ = 0;
};

}  // namespace soltrain
