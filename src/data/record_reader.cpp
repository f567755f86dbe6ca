// Format dispatch by extension, decompression of whole .gz/.zst files, and the per-format record sources.
#include "data/record_reader.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/csv.h"
#include "data/parquet/reader.h"
#include "io/compression.h"
#include "io/input_file.h"
#include "io/json_file.h"
#include "tokenizer/utf8.h"

namespace soltrain {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

enum class Format { kJsonLines, kJson, kCsv, kTsv, kParquet, kUnknown };
enum class Packing { kNone, kGzip, kZstd };

struct Kind {
  Format format = Format::kUnknown;
  Packing packing = Packing::kNone;
};

Kind kind_of(const fs::path& p) {
  Kind k;
  fs::path name = p.filename();
  if (name.extension() == ".gz") k.packing = Packing::kGzip;
  if (name.extension() == ".zst") k.packing = Packing::kZstd;
  if (k.packing != Packing::kNone) name = name.stem();
  const std::string ext = name.extension().string();
  if (ext == ".jsonl" || ext == ".ndjson") k.format = Format::kJsonLines;
  if (ext == ".json") k.format = Format::kJson;
  if (ext == ".csv") k.format = Format::kCsv;
  if (ext == ".tsv") k.format = Format::kTsv;
  if (ext == ".parquet" && k.packing == Packing::kNone) k.format = Format::kParquet;
  return k;
}

std::string read_file_bytes(const fs::path& p) {
  return read_input_file(p, "a dataset");
}

// The file's text, decompressed when it is .gz/.zst (whole: the formats that need it are parsed whole or
// line by line from memory).
std::string read_text(const fs::path& p, Packing packing) {
  std::string raw = read_file_bytes(p);
  if (packing == Packing::kGzip) return gunzip(raw, p.string());
  if (packing == Packing::kZstd) return unzstd(raw, p.string());
  return raw;
}

}  // namespace

bool names_split(const fs::path& rel, const std::string& split) {
  // Hugging Face's split keywords (datasets' data_files.py): a split's other names count as its own
  static const std::map<std::string, std::vector<std::string>> synonyms = {
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}}};
  const auto it = synonyms.find(split);
  const std::vector<std::string> words = it == synonyms.end() ? std::vector<std::string>{split} : it->second;
  const std::string s = rel.generic_string();
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && !std::isalnum(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && std::isalnum(static_cast<unsigned char>(s[j]))) ++j;
    for (const std::string& w : words)
      if (j - i == w.size() && s.compare(i, j - i, w) == 0) return true;
    i = j;
  }
  return false;
}

class RecordSource {
 public:
  virtual ~RecordSource() = default;
  virtual bool next(ordered_json& record, std::string& where, std::string& error) = 0;
};

namespace {

class JsonLinesSource : public RecordSource {
 public:
  JsonLinesSource(std::string name, std::unique_ptr<std::istream> in) : name_(std::move(name)), in_(std::move(in)) {}
  bool next(ordered_json& record, std::string& where, std::string& error) override {
    std::string line;
    while (std::getline(*in_, line)) {
      ++line_;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      where = cat(name_, ":", line_);
      try {
        record = parse_json_text<ordered_json>(line, "record");
      } catch (const UserError& e) {
        record = nullptr;
        error = std::string(e.what()).substr(std::string("record: ").size());  // "not valid JSON (...)"
      }
      return true;
    }
    return false;
  }

 private:
  std::string name_;
  std::unique_ptr<std::istream> in_;
  size_t line_ = 0;
};

class JsonArraySource : public RecordSource {
 public:
  JsonArraySource(std::string name, ordered_json elements) : name_(std::move(name)), elements_(std::move(elements)) {}
  bool next(ordered_json& record, std::string& where, std::string&) override {
    if (index_ >= elements_.size()) return false;
    where = cat(name_, ": element ", index_);
    record = std::move(elements_[index_++]);
    return true;
  }

 private:
  std::string name_;
  ordered_json elements_;
  size_t index_ = 0;
};

// A .json file: an array of records, or an object holding exactly one array of records (`{"data": [...]}`).
// A file that is not one JSON value but starts with `{` is JSON Lines under a .json name, which Hugging
// Face's json loader reads too.
std::unique_ptr<RecordSource> open_json(const fs::path& p, std::string text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  ordered_json doc;
  try {
    doc = parse_json_text<ordered_json>(text, p.string());
  } catch (const UserError&) {
    if (first != std::string::npos && text[first] == '{')
      return std::make_unique<JsonLinesSource>(p.string(), std::make_unique<std::istringstream>(std::move(text)));
    throw;
  }
  if (doc.is_object()) {
    const ordered_json* array = nullptr;
    size_t arrays = 0;
    for (const auto& [k, v] : doc.items())
      if (v.is_array()) ++arrays, array = &v;
    if (arrays == 1) return std::make_unique<JsonArraySource>(p.string(), *array);
    // One record alone in a file is a one-line JSONL file.
    if (arrays == 0) return std::make_unique<JsonArraySource>(p.string(), ordered_json::array({doc}));
    user_error(p.string(), ": a JSON object holding ", arrays,
               " arrays: expected an array of records or an object holding one (or use .jsonl)");
  }
  if (!doc.is_array()) user_error(p.string(), ": expected a JSON array of records (or use .jsonl)");
  return std::make_unique<JsonArraySource>(p.string(), std::move(doc));
}

// A UTF-8 byte order mark (Excel writes one) is not part of the first column's name; pandas drops it too.
std::string without_bom(std::string text) {
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  return text;
}

class CsvSource : public RecordSource {
 public:
  CsvSource(std::string name, std::string text, char delim)
      : name_(std::move(name)), text_(without_bom(std::move(text))), csv_(text_, delim) {
    CsvRow header;
    while (csv_.next(header) && header.blank) {
    }
    if (!header.error.empty()) user_error(name_, ":", header.line, ": the header row: ", header.error);
    if (header.fields.empty()) user_error(name_, ": empty file (expected a header row naming the columns)");
    std::set<std::string> seen;  // a set: a header of 10^5 columns is checked in n log n, not n^2
    for (const auto& f : header.fields) {
      if (!seen.insert(f.value).second)
        user_error(name_, ":", header.line, ": the header names column \"", f.value, "\" twice");
      if (!utf8_valid(f.value)) user_error(name_, ":", header.line, ": the header is not valid UTF-8");
      names_.push_back(f.value);
    }
  }
  bool next(ordered_json& record, std::string& where, std::string& error) override {
    CsvRow row;
    do
      if (!csv_.next(row)) return false;
    while (row.blank);
    where = cat(name_, ":", row.line);
    record = nullptr;
    if (!row.error.empty()) {
      error = row.error;
      return true;
    }
    if (row.fields.size() != names_.size()) {
      error = cat("the row has ", row.fields.size(), " fields, the header ", names_.size());
      return true;
    }
    for (size_t i = 0; i < names_.size(); ++i)
      if (!utf8_valid(row.fields[i].value)) {
        error = cat("column \"", names_[i], "\" is not valid UTF-8 (save the file as UTF-8)");
        return true;
      }
    record = ordered_json::object();
    // An empty field is missing (null), as pandas reads it for Hugging Face's csv loader. The header's names
    // are distinct, so each is appended without the object's linear lookup (n^2 for a wide file).
    auto& fields = record.get_ref<ordered_json::object_t&>();
    fields.reserve(names_.size());
    for (size_t i = 0; i < names_.size(); ++i)
      fields.emplace_back(names_[i], row.fields[i].value.empty() ? ordered_json(nullptr)
                                                                 : ordered_json(std::move(row.fields[i].value)));
    return true;
  }

 private:
  std::string name_, text_;
  CsvParser csv_;
  std::vector<std::string> names_;
};

class ParquetSource : public RecordSource {
 public:
  ParquetSource(const fs::path& p, std::vector<std::string> columns)
      : name_(p.string()), file_(p), columns_(std::move(columns)) {}
  bool next(ordered_json& record, std::string& where, std::string&) override {
    while (index_ >= rows_.size()) {
      if (group_ >= file_.num_row_groups()) return false;
      rows_ = file_.read_row_group(group_++, columns_);
      index_ = 0;
    }
    where = cat(name_, ": row ", row_++);
    record = std::move(rows_[index_++]);
    return true;
  }

 private:
  std::string name_;
  parquet::ParquetFile file_;
  std::vector<std::string> columns_;
  std::vector<ordered_json> rows_;
  size_t group_ = 0, index_ = 0, row_ = 0;
};

std::unique_ptr<RecordSource> open_source(const fs::path& p, const std::vector<std::string>& columns) {
  const Kind k = kind_of(p);
  switch (k.format) {
    case Format::kParquet: return std::make_unique<ParquetSource>(p, columns);
    case Format::kJson: return open_json(p, read_text(p, k.packing));
    case Format::kCsv: return std::make_unique<CsvSource>(p.string(), read_text(p, k.packing), ',');
    case Format::kTsv: return std::make_unique<CsvSource>(p.string(), read_text(p, k.packing), '\t');
    case Format::kJsonLines:
    case Format::kUnknown:  // JSON Lines is what soltrain always read, whatever the name
      if (k.packing == Packing::kNone) {
        auto in = open_input_file(p, "a dataset");
        if (!in) user_error(p.string(), ": cannot open (unreadable)");
        return std::make_unique<JsonLinesSource>(p.string(), std::move(in));
      }
      // The decompressed text is moved into the stream, not copied: it may be most of the memory there is.
      return std::make_unique<JsonLinesSource>(p.string(),
                                               std::make_unique<std::istringstream>(read_text(p, k.packing)));
  }
  return nullptr;
}

}  // namespace

std::vector<fs::path> dataset_files(const fs::path& path, const std::string& split) {
  if (fs::is_regular_file(path)) {
    if (!split.empty() && split != "train")
      user_error(path.string(), ": split \"", split, "\": a single file is the train split (give the file of the \"",
                 split, "\" split as its path)");
    return {path};
  }
  if (!fs::is_directory(path)) {
    refuse_special_file(path, "a dataset");  // /dev/zero, a FIFO: named as what they are
    user_error(path.string(), ": dataset file not found");
  }
  std::vector<fs::path> all;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && kind_of(it->path()).format != Format::kUnknown) all.push_back(it->path());
  }
  if (ec) user_error(path.string(), ": cannot list the folder (", ec.message(), ")");
  std::sort(all.begin(), all.end(), [&](const fs::path& a, const fs::path& b) {
    return a.lexically_relative(path).generic_string() < b.lexically_relative(path).generic_string();
  });
  if (all.empty())
    user_error(path.string(), ": the folder holds no dataset files (.jsonl, .json, .csv, .tsv, .parquet, ",
               "or .gz/.zst of the text formats)");
  if (split.empty()) return all;
  std::vector<fs::path> chosen;
  for (const fs::path& f : all)
    if (names_split(f.lexically_relative(path), split)) chosen.push_back(f);
  if (!chosen.empty()) return chosen;
  bool any_split = false;
  for (const fs::path& f : all)
    for (const char* s : {"train", "test", "validation"})
      any_split = any_split || names_split(f.lexically_relative(path), s);
  if (split == "train" && !any_split) return all;
  user_error(path.string(), ": split \"", split, "\": no file in the folder is named for it (like ", split,
             "-00000-of-00001.parquet or ", split, "/...)");
}

RecordReader::RecordReader(const fs::path& path, std::vector<std::string> columns, const std::string& split)
    : files_(dataset_files(path, split)), columns_(std::move(columns)) {}

RecordReader::~RecordReader() = default;

bool RecordReader::next(ordered_json& record, std::string& where, std::string& error) {
  error.clear();
  while (file_ < files_.size()) {
    if (!source_) source_ = open_source(files_[file_], columns_);
    if (source_->next(record, where, error)) return true;
    source_.reset();
    ++file_;
  }
  return false;
}

}  // namespace soltrain
