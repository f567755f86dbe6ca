// Packing and shuffling. The shuffle is our own Fisher-Yates over mt19937_64 (std::shuffle and the
// std distributions differ between standard libraries), so an order is the same on every machine.
#include "data/loader.h"

#include <random>

#include "core/error.h"

namespace soltrain {

OverlongPolicy parse_overlong_policy(const std::string& s) {
  if (s == "truncate") return OverlongPolicy::kTruncate;
  if (s == "drop") return OverlongPolicy::kDrop;
  if (s == "raise") return OverlongPolicy::kRaise;
  user_error("over-long policy \"", s, "\": expected truncate, drop or raise");
}

nlohmann::json LoaderState::to_json() const {
  nlohmann::json j{{"epoch", epoch}, {"index", index}};
  if (!kind.empty()) j["kind"] = kind;
  return j;
}

LoaderState LoaderState::from_json(const nlohmann::json& j) {
  try {
    LoaderState s{j.at("epoch").get<int64_t>(), j.at("index").get<int64_t>(), j.value("kind", std::string())};
    if (s.epoch < 0 || s.index < 0) user_error("loader state: negative epoch or index");
    return s;
  } catch (const nlohmann::json::exception& e) {
    user_error("loader state: expected {\"epoch\": N, \"index\": N} (", e.what(), ")");
  }
}

void LoaderState::check_reader(const char* reader) const {
  if (kind.empty() || kind == reader) return;
  auto how = [](const std::string& k) {
    return k == kStreamed ? "streamed as training goes (streaming: true or pretraining_dataset)"
                          : "tokenized ahead (no streaming)";
  };
  user_error("resume_from_checkpoint: the checkpoint read its datasets ", how(kind), ", this run reads them ",
             how(reader), ": its place in the data (", index,
             ") would be another row here; resume with the "
             "checkpoint's setting");
}

Loader::Loader(ShardSet data, LoaderOptions options) : data_(std::move(data)), o_(options) {
  state_.kind = LoaderState::kTokenized;
  if (o_.rows <= 0 || o_.seq_len <= 0) user_error("loader: rows and seq_len must be positive");
  for (int64_t d = 0; d < data_.documents(); ++d) {
    const int64_t len = data_.doc_offsets[d + 1] - data_.doc_offsets[d];
    if (len > o_.seq_len && o_.overlong == OverlongPolicy::kRaise)
      user_error("a document of ", len, " tokens is longer than sequence_len ", o_.seq_len,
                 " (excess_length_strategy: raise; drop or truncate take it)");
    const bool overlong = len > o_.seq_len && o_.overlong == OverlongPolicy::kDrop;
    if (len == 0 || overlong)
      ++dropped_, overlong_ += overlong;
    else
      usable_.push_back(d);
  }
  if (usable_.empty())
    user_error("loader: no document fits in seq_len ", o_.seq_len, " (", dropped_, " dropped as too long)");
}

void shuffle_for_epoch(std::vector<int64_t>& order, uint64_t seed, int64_t epoch) {
  // Seeds from (seed, epoch) through a seed sequence so neighbouring epochs get unrelated orders.
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(epoch), uint32_t(uint64_t(epoch) >> 32)};
  std::mt19937_64 rng(seq);
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = size_t(rng() % i);  // modulo bias is < i / 2^64: irrelevant here
    std::swap(order[i - 1], order[j]);
  }
}

std::vector<int64_t> Loader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order = usable_;
  if (o_.shuffle) shuffle_for_epoch(order, o_.seed, epoch);
  return order;
}

void Loader::ensure_order() {
  if (state_.index >= int64_t(usable_.size())) {
    ++state_.epoch;
    state_.index = 0;
  }
  if (order_epoch_ != state_.epoch) {
    order_ = epoch_order(state_.epoch);
    order_epoch_ = state_.epoch;
  }
}

void Loader::restore(const LoaderState& s) {
  s.check_reader(LoaderState::kTokenized);
  if (s.index > int64_t(usable_.size()))
    user_error("loader state: index ", s.index, " is past the ", usable_.size(), " documents of an epoch");
  state_ = {s.epoch, s.index, LoaderState::kTokenized};
}

int Loader::capped_length(int64_t doc) const {
  return int(std::min<int64_t>(data_.doc_offsets[size_t(doc) + 1] - data_.doc_offsets[size_t(doc)], o_.seq_len));
}

int64_t Loader::rows_in_epoch(int64_t epoch) const {
  int64_t rows = 0;
  int fill = 0;
  for (int64_t d : epoch_order(epoch)) {
    const int len = capped_length(d);
    if (fill > 0 && !fits(fill, len)) ++rows, fill = 0;
    fill += len;
  }
  return rows + (fill > 0);
}

HostBatch pack_batch(const LoaderOptions& o, const std::function<DocView()>& peek, const std::function<void()>& take) {
  const int T = o.seq_len;
  HostBatch b;
  b.rows = o.rows;
  b.seq_len = T;
  const size_t n = size_t(o.rows) * size_t(T);
  b.input_ids.assign(n, o.pad_id);
  b.targets.assign(n, -100);
  b.positions.assign(n, 0);
  b.cu_seqlens.assign(1, 0);
  for (int r = 0; r < o.rows; ++r) {
    const size_t row = size_t(r) * size_t(T);
    int fill = 0;
    while (fill < T) {
      if (!o.pack && fill > 0) break;  // (before peek, which would roll the epoch over early)
      const DocView d = peek();
      if (fill + d.len > T) break;  // starts the next row
      for (int k = 0; k < d.len; ++k) {
        const size_t at = row + size_t(fill + k);
        b.input_ids[at] = d.tokens[k];
        b.positions[at] = k;
        // A target is the document's next token, counted only where that token is trained (a token label: its own)
        if (d.token_labels)
          b.targets[at] = d.mask[k] ? int32_t(d.mask[k]) - 1 : -100;
        else
          b.targets[at] = k + 1 < d.len && d.mask[k + 1] ? d.tokens[k + 1] : -100;
      }
      fill += d.len;
      b.cu_seqlens.push_back(int32_t(row) + fill);
      take();
    }
    // Padding is a segment of its own, so no row's segments reach into the next row.
    if (fill < T) {
      for (int k = fill; k < T; ++k) b.positions[row + size_t(k)] = k - fill;
      b.cu_seqlens.push_back(int32_t(row) + T);
    }
  }
  return b;
}

HostBatch Loader::next() {
  return pack_batch(
      o_,
      [&] {
        ensure_order();
        const int64_t d = order_[size_t(state_.index)];
        const int64_t begin = data_.doc_offsets[size_t(d)];
        return DocView{data_.tokens.data() + begin, data_.mask.data() + begin, capped_length(d), data_.token_labels};
      },
      [&] { ++state_.index; });
}

}  // namespace soltrain
