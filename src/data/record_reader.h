// The records of a dataset path: a file (JSONL, JSON, CSV, TSV, parquet; JSONL/JSON/CSV/TSV also as
// .gz or .zst) or a folder of such files, read in sorted order as one dataset.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace soltrain {

// The data files of `path`: the file itself, or a folder's files with a known extension (hidden ones
// skipped), sorted by relative path. `split` (Axolotl/Surogate `split:`) keeps the files whose path names it
// (train-00000-of-00002.parquet, data/test/...); when no file names any split, every file is "train".
// UserError when there is nothing to read.
std::vector<std::filesystem::path> dataset_files(const std::filesystem::path& path, const std::string& split = "");

class RecordSource;  // one open file

// Whether a data file's path (relative to its dataset's root) names `split`: a component split at anything but
// letters and digits equal to it or to one of Hugging Face's keywords for it (train/training; validation/valid/
// dev/val; test/testing/eval/evaluation): "data/train-00000-of-00002.parquet" and "en/c4-train.00000.json.gz"
// name "train".
bool names_split(const std::filesystem::path& rel, const std::string& split);

class RecordReader {
 public:
  // `columns`: the fields the dataset needs; parquet decodes only these (empty: every column). Other
  // formats carry every field. UserError if the path is missing, unreadable or not a known format.
  explicit RecordReader(const std::filesystem::path& path, std::vector<std::string> columns = {},
                        const std::string& split = "");
  ~RecordReader();
  // The next record: true and `where` set ("file:line", "file: element N", "file: row N"); `record` is
  // null when that one record cannot be read (bad JSON line, bad CSV row) with `error` saying why. False
  // at the end. A file that cannot be read at all (bad parquet, truncated .gz) is a UserError.
  bool next(nlohmann::ordered_json& record, std::string& where, std::string& error);

 private:
  std::vector<std::filesystem::path> files_;
  std::vector<std::string> columns_;
  size_t file_ = 0;
  std::unique_ptr<RecordSource> source_;
};

}  // namespace soltrain
