// Reads every source, encodes samples, writes shards through a StagedDir, reports progress and skips.
#include "data/tokenize_job.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <ostream>

#include "data/record_encoder.h"
#include "data/record_reader.h"
#include "data/shards.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/sha256.h"

namespace soltrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path tokenizer_dir(const fs::path& p) {
  if (!fs::exists(p)) user_error(p.string(), ": no such folder (expected a model folder with tokenizer.json)");
  return fs::is_directory(p) ? p : p.parent_path();
}

json fields_json(const DatasetFields& f) {
  return {{"text", f.text},
          {"instruction", f.instruction},
          {"input", f.input},
          {"output", f.output},
          {"output_prefix", f.output_prefix},
          {"messages", f.messages},
          {"conversations", f.conversations},
          {"role", f.role},
          {"content", f.content},
          {"from", f.from},
          {"value", f.value},
          {"roles", f.roles},
          {"system_prompt", f.system_prompt},
          {"system", f.system},
          {"segments", f.segments},
          {"completions", f.completions},
          {"labels", f.labels},
          {"step_separator", f.step_separator},
          {"last_step_label_only", f.last_step_label_only},
          {"completion", f.completion},
          {"roles_to_train", f.roles_to_train},
          {"train_on_eos", f.train_on_eos},
          {"chat_template", f.chat_template},
          {"chat_template_jinja", f.chat_template_jinja},
          {"drop_system_message", f.drop_system_message},
          {"user_defined", f.user_defined ? json{f.user_defined->system_prompt, f.user_defined->format,
                                                 f.user_defined->no_input_format, f.user_defined->system_format}
                                          : json()},
          {"llama_factory", f.llama_factory ? lf_format_json(*f.llama_factory) : json()}};
}

// Redraws one status line at most 5 times a second.
class Progress {
 public:
  Progress(std::ostream& log, bool on) : log_(log), on_(on) {}
  // Ended by an error: the line is finished, so the error line that follows starts a line of its own.
  ~Progress() {
    if (open_) log_ << "\n" << std::flush;
  }
  void update(int64_t records, int64_t tokens, bool final = false) {
    const auto now = std::chrono::steady_clock::now();
    if (!on_ || (!final && now - last_ < std::chrono::milliseconds(200))) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    char line[160];
    std::snprintf(line, sizeof line, "\rtokenize: %lld records, %lld tokens, %.0f records/s, %.2fM tokens/s",
                  static_cast<long long>(records), static_cast<long long>(tokens), s > 0 ? records / s : 0.0,
                  s > 0 ? tokens / s / 1e6 : 0.0);
    log_ << line << (final ? "\n" : "") << std::flush;
    open_ = !final;
  }

 private:
  std::ostream& log_;
  bool on_, open_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_{};
};

}  // namespace

json tokenize_key(const TokenizeOptions& o) {
  json inputs = json::array();
  for (const DatasetSource& src : o.sources)
    // A folder is every file it holds: adding, removing or changing one re-tokenizes the dataset.
    for (const fs::path& file : dataset_files(src.path, src.split)) {
      const uint64_t size = fs::file_size(file);
      inputs.push_back({{"path", fs::absolute(file).lexically_normal().string()},
                        {"type", to_string(src.type)},
                        {"size", size},
                        {"mtime_ns", int64_t(fs::last_write_time(file).time_since_epoch().count())},
                        {"sha256", sha256_file_edges(file)},
                        {"sha256_of", size <= 2u << 20 ? "file" : "size + first and last MiB"}});
    }
  const fs::path dir = tokenizer_dir(o.tokenizer);
  return {{"inputs", inputs},
          {"settings",
           {{"train_on_inputs", o.train_on_inputs},
            {"bad_records", o.bad_records == BadRecordPolicy::kSkip ? "skip" : "error"},
            {"seq_len", o.seq_len},
            {"fields", fields_json(o.fields)},
            // How samples become tokens; raised when that changes, so older shards are not reused
            // (2: the post_processor's BOS on text and alpaca rows, Surogate's auto detection).
            {"encoding", 2}}},
          {"tokenizer",
           {{"tokenizer.json", sha256_file(dir / "tokenizer.json")},
            {"tokenizer_config.json", sha256_file(dir / "tokenizer_config.json")}}}};
}

TokenizeResult run_tokenize(const TokenizeOptions& o, std::ostream& log) {
  if (o.sources.empty()) user_error("tokenize: no --data given");
  const json key = tokenize_key(o);
  TokenizeResult r;
  if (shards_match(o.out, key)) {
    const json m = read_json_file(o.out / "manifest.json");
    r.reused = true;
    r.documents = m.value("documents", int64_t(0));
    r.tokens = m.value("tokens", int64_t(0));
    r.trained_tokens = m.value("trained_tokens", int64_t(0));
    r.skipped = m.value("skipped_records", int64_t(0));
    r.longer_than_seq_len = m.value("longer_than_seq_len", int64_t(0));
    log << "tokenize: " << o.out.string() << " is up to date (same inputs, settings and tokenizer): reusing "
        << r.documents << " documents, " << r.tokens << " tokens\n";
    if (r.skipped > 0) log << "tokenize: " << r.skipped << " bad records were skipped when these shards were written\n";
    return r;
  }
  const fs::path dir = tokenizer_dir(o.tokenizer);
  Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  // A process reward model's rows carry a label per step, every other type trained tokens: one kind per folder.
  const bool token_labels = o.sources.front().type == DatasetType::kStepwiseSupervised;
  for (const DatasetSource& src : o.sources)
    if ((src.type == DatasetType::kStepwiseSupervised) != token_labels)
      user_error("tokenize: stepwise_supervised data (labels per step) cannot be mixed with other types");

  StagedDir staged(o.out);
  ShardWriter writer(staged.path());
  Progress progress(log, o.progress);
  std::string first_skip;
  int64_t records = 0;
  for (const DatasetSource& src : o.sources) {
    RecordReader reader(src.path, needed_fields(src.type, o.fields), src.split);
    RecordEncoder enc(tok, dir, src.type, o.fields, o.train_on_inputs);
    nlohmann::ordered_json rec;
    std::string where, error;
    while (reader.next(rec, where, error)) {
      ++records;
      try {
        if (!error.empty()) throw BadRecord(error);
        const Document d = enc.encode(rec);
        writer.add(d);
        ++r.documents;
        r.tokens += int64_t(d.ids.size());
        for (uint8_t m : d.mask) r.trained_tokens += m != 0;
        if (o.seq_len > 0 && int64_t(d.ids.size()) > o.seq_len) ++r.longer_than_seq_len;
      } catch (const BadRecord& e) {
        if (o.bad_records == BadRecordPolicy::kError)
          user_error(where, ": ", e.what(),
                     o.from_config ? " (bad_records: skip in the config skips such records)"
                                   : " (--bad-records skip to skip such records)");
        if (r.skipped++ == 0) first_skip = cat(where, ": ", e.what());
      }
      progress.update(records, r.tokens);
    }
  }
  progress.update(records, r.tokens, true);
  if (r.documents == 0) {
    std::string files;
    for (const DatasetSource& src : o.sources) files += (files.empty() ? "" : ", ") + src.path.string();
    user_error("tokenize: no usable records in ", files, r.skipped ? cat(" (", r.skipped, " skipped as bad)") : "");
  }
  json manifest = shard_manifest(key, writer.finish());
  manifest.update({{"documents", r.documents},
                   {"tokens", r.tokens},
                   {"trained_tokens", r.trained_tokens},
                   {"skipped_records", r.skipped},
                   {"longer_than_seq_len", r.longer_than_seq_len},
                   {"token_labels", token_labels}});
  write_file_atomic(staged.path() / "manifest.json", manifest.dump(2) + "\n");
  staged.commit();
  log << "tokenize: wrote " << r.documents << " documents, " << r.tokens << " tokens (" << r.trained_tokens
      << " trained) to " << o.out.string() << "\n";
  if (r.skipped > 0) log << "tokenize: skipped " << r.skipped << " bad records (first: " << first_skip << ")\n";
  if (r.longer_than_seq_len > 0)
    log << "tokenize: " << r.longer_than_seq_len << " documents are longer than "
        << (o.from_config ? "sequence_len " : "--seq-len ") << o.seq_len << "\n";
  return r;
}

}  // namespace soltrain
