#include "train/train_data.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "core/host_memory.h"
#include "data/tokenize_job.h"
#include "hub/hub_download.h"
#include "io/json_file.h"
#include "io/output_lock.h"
#include "train/run_tokenizer.h"

namespace soltrain {

void append_shards(ShardSet& a, const ShardSet& b) {
  if (a.documents() == 0)
    a.token_labels = b.token_labels;
  else if (a.token_labels != b.token_labels)
    user_error("stepwise_supervised datasets (labels per step) cannot be mixed with other types");
  const int64_t base = int64_t(a.tokens.size());
  a.tokens.insert(a.tokens.end(), b.tokens.begin(), b.tokens.end());
  a.mask.insert(a.mask.end(), b.mask.begin(), b.mask.end());
  for (size_t d = 1; d < b.doc_offsets.size(); ++d) a.doc_offsets.push_back(base + b.doc_offsets[d]);
}

ShardSet select_documents(const ShardSet& from, const std::vector<int64_t>& docs) {
  ShardSet out;
  out.token_labels = from.token_labels;
  for (int64_t d : docs) {
    const int64_t b = from.doc_offsets[size_t(d)], e = from.doc_offsets[size_t(d) + 1];
    out.tokens.insert(out.tokens.end(), from.tokens.begin() + b, from.tokens.begin() + e);
    out.mask.insert(out.mask.end(), from.mask.begin() + b, from.mask.begin() + e);
    out.doc_offsets.push_back(int64_t(out.tokens.size()));
  }
  return out;
}

std::vector<int64_t> sample_indices(int64_t size, int64_t n, uint64_t seed) {
  // Surogate's `samples` (post_process → sample_dataset, the ms-swift rule): the whole dataset n / size
  // times, then a random n % size of its documents. The random choice is ours (mt19937_64 keyed by the
  // seed), not numpy's, so the same count but not the same documents as Surogate.
  std::vector<int64_t> docs;
  if (size == 0) return docs;
  for (int64_t r = 0; r < n / size; ++r)
    for (int64_t d = 0; d < size; ++d) docs.push_back(d);
  std::vector<int64_t> perm(static_cast<size_t>(size));
  for (int64_t d = 0; d < size; ++d) perm[size_t(d)] = d;
  std::mt19937_64 rng(seed ^ 0x5a3b1e5ULL);
  for (size_t k = perm.size(); k > 1; --k) std::swap(perm[k - 1], perm[size_t(rng() % k)]);
  docs.insert(docs.end(), perm.begin(), perm.begin() + (n % size));
  return docs;
}

ShardSet sample_documents(const ShardSet& from, int64_t n, uint64_t seed) {
  const int64_t size = from.documents();
  if (size == 0) return from;
  // n / size copies of every document: checked against host memory before any is made.
  const uint64_t copies = uint64_t(n / size) + 1;
  check_host_memory(copies * (from.tokens.size() * (sizeof(int32_t) + 1) + uint64_t(size) * 2 * sizeof(int64_t)),
                    cat("samples: ", n, " (", copies, " copies of ", size, " documents)"), "lower samples");
  return select_documents(from, sample_indices(size, n, seed));
}

std::pair<int64_t, int64_t> slice_bounds(int64_t n, const std::pair<std::string, std::string>& slice) {
  // Hugging Face datasets' ReadInstruction with its default rounding ("closest"): a percentage p is
  // round(p * n / 100) documents (Python's round: halves to even, as nearbyint), a negative bound counts
  // from the end, and the result is clamped to [0, n]. Applied to the documents made from the records, so
  // a skipped bad record (bad_records: skip) shifts the bounds by one.
  auto resolve = [&](const std::string& b, int64_t open) {
    if (b.empty()) return open;
    int64_t v = b.back() == '%' ? int64_t(std::nearbyint(std::stod(b.substr(0, b.size() - 1)) * double(n) / 100.0))
                                : std::stoll(b);
    if (v < 0) v += n;
    return std::clamp<int64_t>(v, 0, n);
  };
  return {resolve(slice.first, 0), resolve(slice.second, n)};
}

ShardSet slice_documents(const ShardSet& from, const std::pair<std::string, std::string>& slice) {
  const auto [begin, end] = slice_bounds(from.documents(), slice);
  std::vector<int64_t> docs;
  for (int64_t d = begin; d < end; ++d) docs.push_back(d);
  return select_documents(from, docs);
}

int64_t drop_duplicate_documents(ShardSet& set, const ShardSet* seen_in, int docs_per_item) {
  // Axolotl's dataset_exact_deduplication hashes each tokenized row (input_ids, labels, ...) and keeps the
  // first of equal ones; here a row is `docs_per_item` consecutive documents (one; a preference pair's two),
  // their tokens and loss masks. Buckets by a 64-bit FNV-1a hash, then compares the documents themselves, so a
  // hash collision never drops one.
  const int64_t g = docs_per_item;
  SOLTRAIN_CHECK(g >= 1 && set.documents() % g == 0 && (!seen_in || seen_in->documents() % g == 0),
                 "deduplication: documents in items of ", g);
  auto hash_of = [g](const ShardSet& s, int64_t item) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t d = item * g; d < (item + 1) * g; ++d) {
      for (int64_t i = s.doc_offsets[size_t(d)]; i < s.doc_offsets[size_t(d) + 1]; ++i)
        h = (h ^ (uint64_t(uint32_t(s.tokens[size_t(i)])) << 1 ^ s.mask[size_t(i)])) * 1099511628211ULL;
      h = (h ^ 0xffffffffULL) * 1099511628211ULL;  // (where one document ends)
    }
    return h;
  };
  auto same_doc = [](const ShardSet& a, int64_t da, const ShardSet& b, int64_t db) {
    const int64_t ba = a.doc_offsets[size_t(da)], ea = a.doc_offsets[size_t(da) + 1];
    const int64_t bb = b.doc_offsets[size_t(db)], eb = b.doc_offsets[size_t(db) + 1];
    return ea - ba == eb - bb && std::equal(a.tokens.begin() + ba, a.tokens.begin() + ea, b.tokens.begin() + bb) &&
           std::equal(a.mask.begin() + ba, a.mask.begin() + ea, b.mask.begin() + bb);
  };
  auto same = [&](const ShardSet& a, int64_t ia, const ShardSet& b, int64_t ib) {
    for (int64_t k = 0; k < g; ++k)
      if (!same_doc(a, ia * g + k, b, ib * g + k)) return false;
    return true;
  };
  // (set, document) pairs already kept, by hash: the other set's documents first (the validation data is
  // checked against the training data), then this set's own.
  std::unordered_map<uint64_t, std::vector<std::pair<const ShardSet*, int64_t>>> kept;
  if (seen_in)
    for (int64_t it = 0; it < seen_in->documents() / g; ++it) kept[hash_of(*seen_in, it)].push_back({seen_in, it});
  std::vector<int64_t> keep;
  int64_t dropped = 0;
  for (int64_t it = 0; it < set.documents() / g; ++it) {
    auto& bucket = kept[hash_of(set, it)];
    const bool dup =
        std::any_of(bucket.begin(), bucket.end(), [&](const auto& k) { return same(*k.first, k.second, set, it); });
    if (dup) {
      ++dropped;
      continue;
    }
    bucket.push_back({&set, it});
    for (int64_t k = 0; k < g; ++k) keep.push_back(it * g + k);
  }
  if (dropped > 0) set = select_documents(set, keep);
  return dropped;
}

int64_t drop_short_documents(ShardSet& set, int64_t min_tokens) {
  std::vector<int64_t> keep;
  for (int64_t d = 0; d < set.documents(); ++d)
    if (set.doc_offsets[size_t(d) + 1] - set.doc_offsets[size_t(d)] >= min_tokens) keep.push_back(d);
  const int64_t dropped = set.documents() - int64_t(keep.size());
  if (dropped > 0) set = select_documents(set, keep);
  return dropped;
}

namespace {

// A dataset file's name as part of its shard folder's: letters, digits, '.', '-', '_' kept, anything else (a
// newline or an escape sequence in a downloaded file's name) replaced, so no folder name carries it.
std::string folder_safe(std::string name) {
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_') ch = '_';
  return name;
}

// A dataset's fields with the run's settings that apply to every dataset.
DatasetFields run_fields(const TrainConfig& c, const DatasetSpec& spec, const std::string& kind) {
  DatasetFields f = spec.fields;
  if (f.chat_template.empty()) f.chat_template = c.chat_template;
  f.step_separator = spec.step_separator.value_or(c.step_separator);
  f.last_step_label_only =
      spec.train_on_last_step_only.value_or(c.train_on_last_step_only) && kind == "train";  // (TRL's is_eval keeps all)
  return f;
}

ShardSet tokenize_all(const TrainConfig& c, const std::vector<DatasetSpec>& specs, const std::string& kind,
                      std::ostream& log) {
  ShardSet all;
  for (size_t i = 0; i < specs.size(); ++i) {
    TokenizeOptions o;
    o.tokenizer = run_tokenizer_folder(c);
    o.sources = {{specs[i].path, specs[i].type, specs[i].split}};
    o.fields = run_fields(c, specs[i], kind);
    // One folder per dataset: each keeps its own cache key, so editing one dataset re-tokenizes only it.
    o.out = c.dataset_prepared_path / cat(kind, "-", i, "-", folder_safe(specs[i].path.stem().string()));
    o.seq_len = c.sequence_len;
    o.train_on_inputs = c.train_on_inputs;
    o.bad_records = c.bad_records;
    o.from_config = true;
    o.progress = &log == &std::cerr && ::isatty(2);  // a redrawn line only makes sense on a terminal
    run_tokenize(o, log);
    ShardSet set = load_shards(o.out);
    if (specs[i].slice) set = slice_documents(set, *specs[i].slice);
    if (specs[i].samples > 0) set = sample_documents(set, specs[i].samples, c.seed + i);
    append_shards(all, set);
  }
  return all;
}

}  // namespace

namespace fs = std::filesystem;

TrainData prepare_train_data(const TrainConfig& c, std::ostream& log) {
  TrainData d;
  // Runs sharing dataset_prepared_path take it in turn: one writes a dataset's shards, the next reuses them
  // (a folder replaced under a reader, or two writers of one folder, would mix their files).
  fs::create_directories(c.dataset_prepared_path);
  const OutputLock shards_lock =
      OutputLock::wait_for(c.dataset_prepared_path, kShardsLockFile, "dataset_prepared_path", log);
  if (!c.streaming) d.train = tokenize_all(c, c.datasets, "train", log);
  if (c.min_sample_len > 0 && !c.streaming) {  // (a stream drops them as it reads: stream_train_data)  // (Axolotl
                                               // drops them from every dataset it prepares, evaluation data too)
    const int64_t dropped = drop_short_documents(d.train, c.min_sample_len);
    log << "min_sample_len: dropped " << dropped << " documents shorter than " << c.min_sample_len << " tokens, "
        << d.train.documents() << " left\n";
  }
  if (c.dataset_exact_deduplication && !c.streaming) {
    const int64_t dropped = drop_duplicate_documents(d.train, nullptr);
    log << "dataset_exact_deduplication: dropped " << dropped << " duplicate documents, " << d.train.documents()
        << " left\n";
  }
  if (!c.validation_datasets.empty()) {
    d.validation = tokenize_all(c, c.validation_datasets, "validation", log);
    if (c.min_sample_len > 0) drop_short_documents(d.validation, c.min_sample_len);
    if (c.dataset_exact_deduplication) {
      const int64_t dropped = drop_duplicate_documents(d.validation, &d.train);
      log << "dataset_exact_deduplication: dropped " << dropped << " validation documents also in the training data"
          << " or repeated, " << d.validation.documents() << " left\n";
    }
  } else if (c.validation_split_ratio > 0 || c.validation_count > 0) {
    // A seeded choice of documents, kept in their original order on both sides.
    const int64_t n = d.train.documents();
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i;
    std::mt19937_64 rng(c.seed ^ 0x5eed5eedULL);
    for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[size_t(rng() % i)]);
    if (c.validation_count > 0 && c.validation_count >= n)
      user_error("val_set_size ", c.validation_count, ": the training data has only ", n,
                 " documents (a count must leave some to train on)");
    const int64_t n_val = c.validation_count > 0
                              ? c.validation_count
                              : std::min<int64_t>(n - 1, int64_t(std::ceil(double(n) * c.validation_split_ratio)));
    if (n_val <= 0)
      user_error("validation_split_ratio ", c.validation_split_ratio, ": ", n, " documents are too few to split");
    std::vector<int64_t> val(idx.begin(), idx.begin() + n_val), train(idx.begin() + n_val, idx.end());
    std::sort(val.begin(), val.end());
    std::sort(train.begin(), train.end());
    d.validation = select_documents(d.train, val);
    d.train = select_documents(d.train, train);
  }
  return d;
}

std::unique_ptr<StreamLoader> stream_train_data(const TrainConfig& c, const LoaderOptions& lo, int64_t vocab_size,
                                                std::ostream& log) {
  std::vector<StreamInput> inputs;
  for (const DatasetSpec& d : c.datasets) {
    std::function<void()> fetch;
    if (d.fetch)  // a streamed hub dataset's file: downloaded when the stream first opens it
      fetch = [path = d.path, f = *d.fetch, &log] {
        std::error_code ec;
        if (fs::exists(path, ec)) return;
        const HubClient hub = hub_client_from_env(log, &log == &std::cerr && ::isatty(2));
        hub_download_file(hub, RepoRef{RepoType::kDataset, f.repo, f.commit}, f.commit, f.file);
      };
    inputs.push_back({d.path, d.split, d.type, run_fields(c, d, "train"), std::move(fetch)});
  }
  StreamOptions o;
  o.loader = lo;
  o.tokenizer_dir = run_tokenizer_folder(c);
  o.train_on_inputs = c.train_on_inputs;
  o.bad_records = c.bad_records;
  o.vocab_size = vocab_size;
  o.min_tokens = c.min_sample_len;
  return std::make_unique<StreamLoader>(std::move(inputs), std::move(o), &log);
}

}  // namespace soltrain
