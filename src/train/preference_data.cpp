#include "train/preference_data.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <ostream>
#include <random>

#include "core/error.h"
#include "data/llama_factory_encode.h"
#include "data/pair_loader.h"
#include "data/preference.h"
#include "data/record_encoder.h"
#include "data/record_reader.h"
#include "data/tokenize_job.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/sha256.h"
#include "train/run_tokenizer.h"
#include "train/train_data.h"

namespace soltrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A LLaMA-Factory preference record: its template's pair (PairwiseDatasetProcessor), or with no template named the
// converted turns through the chat template as any conversational pair.
std::pair<Document, Document> llama_factory_pair(const nlohmann::ordered_json& rec, const LfFormat& f, Tokenizer& tok,
                                                 const LfSpecialIds& ids, PreferenceEncoder& enc) {
  const LfExample x = lf_convert(rec, f);
  if (x.tmpl) return lf_pairwise(tok, ids, x);
  if (x.response.size() != 2)
    throw BadRecord("not a chosen and a rejected answer: LLaMA-Factory drops such an example");
  PreferenceSample s;
  if (!x.system.empty()) s.prompt.push_back({{"role", "system"}, {"content", x.system}});
  for (const auto& m : x.prompt) s.prompt.push_back(m);
  s.chosen = nlohmann::ordered_json::array({x.response[0]});
  s.rejected = nlohmann::ordered_json::array({x.response[1]});
  return enc.encode(s);
}

ChatTemplate load_template(const TrainConfig& c, const DatasetSpec& spec) {
  const fs::path cfg = run_tokenizer_folder(c) / "tokenizer_config.json";
  std::string name = spec.fields.chat_template.empty() ? c.chat_template : spec.fields.chat_template;
  // Axolotl's chatml.* types write ChatML whatever the model's template is.
  if (spec.fields.chat_template.empty() && spec.preference_type.starts_with("chatml.")) name = "chatml";
  return chat_template_for(name, spec.fields.chat_template_jinja, cfg);
}

// KTO's pairs of one block of per_device_train_batch_size consecutive examples, as TRL makes them: each example,
// then its KL document (its prompt with the previous example's completion, the block's first taking the last
// one's), the example's label marked on its first mask byte (data/pair_loader.h kUndesirableMark).

size_t prompt_length(const Document& d) {
  size_t n = 0;
  while (n < d.mask.size() && d.mask[n] == 0) ++n;
  return n;
}

// A KTO example waiting for its block's KL documents: the document, whether it is desirable, and for a LLaMA-Factory
// row its uncut prompt and answer (its KL documents are cut anew, as LLaMA-Factory's FeedbackDatasetProcessor does).
struct UnpairedExample {
  Document doc;
  bool desirable = false;
  std::optional<LfUnpaired> llama_factory;
  int64_t cutoff_len = 0;
};

// (`with_kl` false, apo_zero_unpaired: no KL estimate is made, and each KL document is its example's first token)
int64_t write_unpaired_block(ShardWriter& writer, std::vector<UnpairedExample>& block, int64_t seq_len, bool with_kl) {
  int64_t tokens = 0;
  for (size_t i = 0; i < block.size(); ++i) {
    const UnpairedExample& ex = block[i];
    const UnpairedExample& other = block[(i + block.size() - 1) % block.size()];
    Document kl;
    if (with_kl && ex.llama_factory && other.llama_factory) {
      kl = lf_kl_document(ex.llama_factory->prompt, other.llama_factory->answer, ex.cutoff_len);
    } else {
      const size_t p = prompt_length(ex.doc), q = prompt_length(other.doc);
      kl.ids.assign(ex.doc.ids.begin(), ex.doc.ids.begin() + std::ptrdiff_t(p));
      kl.mask.assign(p, 0);
      for (size_t k = q; with_kl && k < other.doc.ids.size() && int64_t(kl.ids.size()) < seq_len; ++k)
        kl.ids.push_back(other.doc.ids[k]), kl.mask.push_back(1);
    }
    if (!with_kl) kl.ids.resize(1), kl.mask.resize(1);
    Document marked = ex.doc;
    if (!ex.desirable) marked.mask[0] = kUndesirableMark;
    writer.add(marked);
    writer.add(kl);
    tokens += int64_t(marked.ids.size() + kl.ids.size());
  }
  block.clear();
  return tokens;
}

// A LLaMA-Factory KTO record: its template's example (FeedbackDatasetProcessor), or with no template named the
// converted turns through the chat template.
UnpairedExample llama_factory_unpaired(const nlohmann::ordered_json& rec, const LfFormat& f, Tokenizer& tok,
                                       const LfSpecialIds& ids, PreferenceEncoder& enc) {
  const LfExample x = lf_convert(rec, f);
  if (!x.kto_tag) throw BadRecord("no boolean kto_tag: not a KTO example");
  if (x.tmpl) {
    LfUnpaired u = lf_unpaired(tok, ids, x);
    return {u.example, *x.kto_tag, std::move(u), x.cutoff_len};
  }
  if (x.response.size() != 2) throw BadRecord("not a KTO answer: LLaMA-Factory drops such an example");
  UnpairedSample u;
  if (!x.system.empty()) u.prompt.push_back({{"role", "system"}, {"content", x.system}});
  for (const auto& m : x.prompt) u.prompt.push_back(m);
  u.completion = nlohmann::ordered_json::array({x.response[*x.kto_tag ? 0 : 1]});
  u.desirable = *x.kto_tag;
  return {enc.encode(u), u.desirable, std::nullopt, 0};
}

// The run's name on its log lines: a reward model's preparation says reward.
const char* log_prefix(const TrainConfig& c) {
  return c.dpo.reward_model ? "reward: " : "dpo: ";
}

// One dataset's pairs into `out` (reused when its manifest key matches), returned as documents.
ShardSet tokenize_pairs(const TrainConfig& c, const DatasetSpec& spec, const fs::path& out, json& key,
                        std::ostream& log) {
  TokenizeOptions o;  // its key names the inputs, tokenizer and the settings shared with SFT
  o.tokenizer = run_tokenizer_folder(c);
  o.sources = {{spec.path, DatasetType::kAuto, spec.split}};
  o.fields = spec.fields;
  o.seq_len = c.sequence_len;
  o.bad_records = c.bad_records;
  key = tokenize_key(o);
  const DatasetFields& f = spec.fields;
  key["preference"] = {{"type", spec.preference_type},
                       {"max_prompt_len", c.dpo.max_prompt_len},
                       {"prompt", f.prompt},
                       {"chosen", f.chosen},
                       {"rejected", f.rejected},
                       {"chat_template", f.chat_template.empty() ? c.chat_template : f.chat_template},
                       {"format", 1}};
  const bool unpaired = c.dpo.method == PreferenceLoss::Kto;
  if (unpaired) key["preference"]["kto_block"] = c.per_device_train_batch_size;  // the KL documents' blocks
  if (unpaired && c.dpo.apo_zero_unpaired) key["preference"]["kto_kl"] = false;
  if (shards_match(out, key)) {
    const json m = read_json_file(out / "manifest.json");
    log << log_prefix(c) << out.string() << " is up to date: reusing " << m.value("pairs", int64_t(0)) << " pairs\n";
    return load_shards(out);
  }
  if (unpaired ? !is_unpaired_format(spec.preference_type) : !find_preference_format(spec.preference_type))
    user_error(spec.path.string(), ": type ", spec.preference_type,
               unpaired ? " is a paired preference shape; rl: kto reads prompt, completion and label records"
                        : " is an unpaired (KTO) shape: rl: kto reads it");
  const PreferenceFormat format = unpaired ? PreferenceFormat::kAuto : *find_preference_format(spec.preference_type);
  std::vector<UnpairedExample> block;  // KTO: examples waiting for their block's KL documents
  Tokenizer tok = Tokenizer::load(run_tokenizer_folder(c) / "tokenizer.json");
  const ChatTemplate tmpl = load_template(c, spec);
  PreferenceEncoder enc(tok, tmpl, c.sequence_len, c.dpo.max_prompt_len);
  // A LLaMA-Factory dataset's bos / eos markers as ids (other datasets need no eos token here)
  LfSpecialIds lf_ids;
  if (f.llama_factory) {
    const fs::path cfg = run_tokenizer_folder(c) / "tokenizer_config.json";
    lf_ids = {tok.token_to_id(read_bos_token(cfg)), tok.token_to_id(read_eos_token(cfg))};
  }
  StagedDir staged(out);
  ShardWriter writer(staged.path());
  int64_t pairs = 0, skipped = 0, tokens = 0;
  std::string first_skip;
  RecordReader reader(spec.path, {}, spec.split);
  nlohmann::ordered_json rec;
  std::string where, error;
  while (reader.next(rec, where, error)) {
    try {
      if (!error.empty()) throw BadRecord(error);
      if (unpaired) {
        if (f.llama_factory) {
          block.push_back(llama_factory_unpaired(rec, *f.llama_factory, tok, lf_ids, enc));
        } else {
          const UnpairedSample u = to_unpaired_sample(rec, f);
          block.push_back({enc.encode(u), u.desirable, std::nullopt, 0});
        }
        ++pairs;
        if (int(block.size()) == c.per_device_train_batch_size)
          tokens += write_unpaired_block(writer, block, c.sequence_len, !c.dpo.apo_zero_unpaired);
        continue;
      }
      const auto [chosen, rejected] = f.llama_factory ? llama_factory_pair(rec, *f.llama_factory, tok, lf_ids, enc)
                                                      : enc.encode(to_preference_sample(rec, format, f));
      writer.add(chosen);  // a pair's two documents stay adjacent: 2i chosen, 2i+1 rejected
      writer.add(rejected);
      ++pairs;
      tokens += int64_t(chosen.ids.size() + rejected.ids.size());
    } catch (const BadRecord& e) {
      if (c.bad_records == BadRecordPolicy::kError)
        user_error(where, ": ", e.what(), " (bad_records: skip in the config skips such records)");
      if (skipped++ == 0) first_skip = cat(where, ": ", e.what());
    }
  }
  if (!block.empty()) tokens += write_unpaired_block(writer, block, c.sequence_len, !c.dpo.apo_zero_unpaired);
  if (pairs == 0)
    user_error(spec.path.string(), unpaired ? ": no usable KTO examples" : ": no usable preference pairs",
               skipped ? cat(" (", skipped, " skipped as bad)") : "");
  json manifest = shard_manifest(key, writer.finish());
  manifest.update({{"documents", 2 * pairs}, {"pairs", pairs}, {"tokens", tokens}, {"skipped_records", skipped}});
  write_file_atomic(staged.path() / "manifest.json", manifest.dump(2) + "\n");
  staged.commit();
  log << log_prefix(c) << "wrote " << pairs << (unpaired ? " examples with their KL documents (" : " pairs (") << tokens
      << " tokens) to " << out.string() << "\n";
  if (skipped > 0) log << log_prefix(c) << "skipped " << skipped << " bad records (first: " << first_skip << ")\n";
  if (enc.answers_cut() > 0)
    log << log_prefix(c) << enc.answers_cut() << " answers were cut to fit sequence_len " << c.sequence_len
        << (c.dpo.reward_model ? " (a cut sequence is scored at its last kept token, as Axolotl cuts them; TRL's "
                                 "RewardTrainer drops such pairs: raise sequence_len to keep every answer whole)"
                               : "")
        << "\n";
  return load_shards(out);
}

ShardSet tokenize_all_pairs(const TrainConfig& c, const std::vector<DatasetSpec>& specs, const std::string& kind,
                            json& keys, std::ostream& log) {
  ShardSet all;
  for (size_t i = 0; i < specs.size(); ++i) {
    json key;
    append_shards(
        all, tokenize_pairs(c, specs[i],
                            c.dataset_prepared_path / cat("dpo-", kind, "-", i, "-", specs[i].path.stem().string()),
                            key, log));
    keys.push_back(key);
  }
  return all;
}

// Documents of the given pairs, in that order.
ShardSet select_pairs(const ShardSet& from, const std::vector<int64_t>& pairs) {
  std::vector<int64_t> docs;
  for (int64_t p : pairs) docs.push_back(2 * p), docs.push_back(2 * p + 1);
  return select_documents(from, docs);
}

}  // namespace

PreferenceData prepare_preference_data(const TrainConfig& c, std::ostream& log) {
  PreferenceData d;
  json keys = json::array();
  d.train = tokenize_all_pairs(c, c.datasets, "train", keys, log);
  // Axolotl deduplicates preference rows as it does SFT's (utils/data/rl.py): a pair is its two documents
  if (c.dataset_exact_deduplication) {
    const int64_t dropped = drop_duplicate_documents(d.train, nullptr, 2);
    log << "dataset_exact_deduplication: dropped " << dropped << " duplicate pairs, " << d.train.documents() / 2
        << " left\n";
    keys.push_back({{"dataset_exact_deduplication", true}});  // (the cached reference log-probs follow the pairs)
  }
  if (!c.validation_datasets.empty()) {
    json vkeys = json::array();
    d.validation = tokenize_all_pairs(c, c.validation_datasets, "validation", vkeys, log);
    if (c.dataset_exact_deduplication) {
      const int64_t dropped = drop_duplicate_documents(d.validation, &d.train, 2);
      log << "dataset_exact_deduplication: dropped " << dropped << " validation pairs also in the training data or "
          << "repeated, " << d.validation.documents() / 2 << " left\n";
    }
  } else if (c.validation_split_ratio > 0 || c.validation_count > 0) {
    // A seeded choice of pairs (both answers go together), in their original order on both sides.
    const int64_t n = d.train.documents() / 2;
    std::vector<int64_t> idx(size_t(n), 0);
    for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i;
    std::mt19937_64 rng(c.seed ^ 0x5eed5eedULL);
    for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[size_t(rng() % i)]);
    const int64_t n_val = c.validation_count > 0
                              ? c.validation_count
                              : std::min<int64_t>(n - 1, int64_t(std::ceil(double(n) * c.validation_split_ratio)));
    if (n_val <= 0 || n_val >= n)
      user_error("validation split: ", n, " preference pairs are too few to split off ", n_val);
    std::vector<int64_t> val(idx.begin(), idx.begin() + n_val), train(idx.begin() + n_val, idx.end());
    std::sort(val.begin(), val.end());
    std::sort(train.begin(), train.end());
    d.validation = select_pairs(d.train, val);
    d.train = select_pairs(d.train, train);
    keys.push_back({{"validation_split_ratio", c.validation_split_ratio},
                    {"validation_count", c.validation_count},
                    {"seed", c.seed}});
  }
  d.key = keys.dump();
  return d;
}

std::vector<float> cached_reference(const TrainConfig& c, const PreferenceData& d,
                                    const std::function<std::vector<float>()>& compute, std::ostream& log) {
  // The reference is the model as loaded: its files (size, mtime, config) identify it.
  json model = json::array();
  const fs::path dir = fs::is_directory(c.model) ? c.model : c.model.parent_path();
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && (e.path().extension() == ".safetensors" || e.path().filename() == "config.json"))
      model.push_back({e.path().filename().string(), e.file_size(),
                       int64_t(fs::last_write_time(e.path()).time_since_epoch().count())});
  std::sort(model.begin(), model.end());
  json keyed{{"pairs", d.key}, {"model", model}, {"sequence_len", c.sequence_len}};
  // (a resized vocabulary's new rows are part of the reference model)
  if (const auto resize = run_vocab_resize(c)) keyed["vocab_resize"] = resize->rows;
  const std::string key = keyed.dump();
  const fs::path file = c.dataset_prepared_path / cat("dpo-reference-", sha256_hex(key).substr(0, 16), ".f32");
  const size_t n = size_t(d.train.documents());
  if (fs::exists(file) && fs::file_size(file) == n * sizeof(float)) {
    std::vector<float> v(n);
    std::ifstream in(file, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(float)));
    // A negative log-prob sum is finite and >= 0; anything else is a damaged cache (it would read as a
    // diverged run).
    const bool valid = std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x) && x >= 0; });
    if (in && valid) {
      log << "dpo: reference log-probs reused from " << file.string() << "\n";
      return v;
    }
    if (in)
      log << "dpo: " << file.string()
          << " holds values no log-prob sum can take (NaN, inf or below 0): computing it again\n";
  }
  std::vector<float> v = compute();
  SOLTRAIN_CHECK(v.size() == n, "reference sums for ", v.size(), " of ", n, " documents");
  std::string bytes(n * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());
  write_file_atomic(file, bytes);  // little-endian fp32, one per document
  log << "dpo: reference log-probs of " << n / 2 << " pairs stored in " << file.string() << "\n";
  return v;
}

}  // namespace soltrain
