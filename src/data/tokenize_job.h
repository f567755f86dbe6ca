// `soltrain tokenize` as a library call: datasets → shards + manifest in one folder, reusing the folder
// when its manifest says it was built from the same inputs, settings and tokenizer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <vector>

#include "data/dataset.h"

namespace soltrain {

struct TokenizeOptions {
  std::filesystem::path tokenizer;  // folder with tokenizer.json and tokenizer_config.json
  std::vector<DatasetSource> sources;
  std::filesystem::path out;
  int64_t seq_len = 0;  // 0 = unknown; otherwise documents longer than it are counted in the report
  bool train_on_inputs = false;
  BadRecordPolicy bad_records = BadRecordPolicy::kError;
  DatasetFields fields;
  bool progress = true;      // a progress line on `log`, redrawn in place
  bool from_config = false;  // hints name the YAML keys (bad_records, sequence_len) rather than the flags
};

struct TokenizeResult {
  bool reused = false;
  int64_t documents = 0, tokens = 0, trained_tokens = 0, skipped = 0, longer_than_seq_len = 0;
};

// Bad input (missing file, bad record under the error policy) is a UserError naming file and line.
TokenizeResult run_tokenize(const TokenizeOptions& o, std::ostream& log);

// What decides reuse: inputs (path, type, size, mtime, sha256), settings and tokenizer hashes.
nlohmann::json tokenize_key(const TokenizeOptions& o);

}  // namespace soltrain
