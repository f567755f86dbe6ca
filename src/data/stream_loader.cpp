#include "data/stream_loader.h"

#include <ostream>

#include "core/error.h"

namespace soltrain {

StreamLoader::StreamLoader(std::vector<StreamInput> inputs, StreamOptions options, std::ostream* log)
    : in_(std::move(inputs)),
      o_(std::move(options)),
      log_(log),
      tok_(Tokenizer::load(o_.tokenizer_dir / "tokenizer.json")),
      enc_(in_.size()) {
  if (in_.empty()) user_error("streaming: no dataset to read");
  if (o_.loader.rows <= 0 || o_.loader.seq_len <= 0) user_error("loader: rows and seq_len must be positive");
  state_.kind = LoaderState::kStreamed;
  start_pass();
}

StreamLoader::~StreamLoader() = default;

void StreamLoader::start_pass() {
  input_ = 0;
  records_ = 0;
  usable_in_pass_ = 0;
  pending_.reset();
  reader_.reset();
}

bool StreamLoader::read_record() {
  while (input_ < in_.size()) {
    const StreamInput& in = in_[input_];
    if (!reader_) {
      if (in.fetch) in.fetch();
      reader_ = std::make_unique<RecordReader>(in.path, needed_fields(in.type, in.fields), in.split);
    }
    if (reader_->next(rec_, where_, error_)) {
      ++records_;
      return true;
    }
    reader_.reset();
    ++input_;
  }
  return false;
}

void StreamLoader::read_document() {
  while (!pending_) {
    if (!read_record()) {
      // (a pass resumed part-way may end before its next usable document: only a whole pass with none is an error)
      if (usable_in_pass_ == 0 && whole_pass_)
        user_error("streaming: no usable document in the datasets (", skipped_, " bad records skipped, ", dropped_,
                   " documents dropped)");
      ++state_.epoch;
      state_.index = 0;
      start_pass();
      whole_pass_ = true;
      continue;
    }
    StreamInput& in = in_[input_];
    try {
      if (!error_.empty()) throw BadRecord(error_);
      auto& enc = enc_[input_];
      if (!enc) enc = std::make_unique<RecordEncoder>(tok_, o_.tokenizer_dir, in.type, in.fields, o_.train_on_inputs);
      Document d = enc->encode(rec_);
      const int64_t len = int64_t(d.ids.size());
      if (len > o_.loader.seq_len && o_.loader.overlong == OverlongPolicy::kRaise)
        user_error(where_, ": a document of ", len, " tokens is longer than sequence_len ", o_.loader.seq_len,
                   " (excess_length_strategy: raise; drop or truncate take it)");
      for (int32_t id : d.ids)
        if (o_.vocab_size > 0 && (id < 0 || id >= o_.vocab_size))
          user_error(where_, ": the tokenizer produced id ", id, " but the model's vocab_size is ", o_.vocab_size);
      const bool overlong = len > o_.loader.seq_len && o_.loader.overlong == OverlongPolicy::kDrop;
      if (len == 0 || len < o_.min_tokens || overlong) {
        if (overlong && overlong_++ == 0 && log_)
          *log_ << "streaming: excess_length_strategy drop: leaving out documents longer than sequence_len "
                << o_.loader.seq_len << " (the first: " << where_ << ", " << len << " tokens)\n";
        ++dropped_;
        continue;
      }
      if (len > o_.loader.seq_len) {  // truncate: its first seq_len tokens
        d.ids.resize(size_t(o_.loader.seq_len));
        d.mask.resize(size_t(o_.loader.seq_len));
      }
      pending_ = std::move(d);
      ++usable_in_pass_;
      ++documents_;
    } catch (const BadRecord& e) {
      if (o_.bad_records == BadRecordPolicy::kError)
        user_error(where_, ": ", e.what(), " (bad_records: skip in the config skips such records)");
      if (skipped_++ == 0 && log_)
        *log_ << "streaming: skipping bad records (bad_records: skip); the first: " << where_ << ": " << e.what()
              << "\n";
    }
  }
}

DocView StreamLoader::peek() {
  read_document();
  return DocView{pending_->ids.data(), pending_->mask.data(), int(pending_->ids.size()), false};
}

void StreamLoader::take() {
  pending_.reset();
  state_.index = records_;  // every record read so far is in a batch or was passed over
}

HostBatch StreamLoader::next() {
  return pack_batch(
      o_.loader, [&] { return peek(); }, [&] { take(); });
}

void StreamLoader::restore(const LoaderState& s) {
  s.check_reader(LoaderState::kStreamed);
  start_pass();
  state_ = LoaderState{s.epoch, 0, LoaderState::kStreamed};
  whole_pass_ = s.index == 0;
  while (records_ < s.index) {
    if (!read_record())
      user_error("loader state: record ", s.index, " is past the ", records_, " records of the streamed datasets");
    // type: auto is decided by an input's first usable record, as reading it from the start decides it
    if (StreamInput& in = in_[input_]; in.type == DatasetType::kAuto && error_.empty()) try {
        in.type = detect_auto(rec_, in.fields);
      } catch (const BadRecord&) {
      }
  }
  state_.index = s.index;
}

}  // namespace soltrain
