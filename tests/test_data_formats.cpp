// Data files: the same rows as JSONL, JSON (array, object holding one), CSV, TSV, their .gz/.zst, parquet
// (pyarrow-written fixtures) and folders give the same records and then the same tokens; malformed files
// are one line and exit 2 through the CLI.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <fstream>
#include <sstream>

#include "cli_test_util.h"
#include "data/csv.h"
#include "data/dataset.h"
#include "data/record_reader.h"
#include "data/shards.h"
#include "data/tokenize_job.h"
#include "data_test_util.h"
#include "test_util.h"
#include "train/train_data.h"

namespace soltrain {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

const fs::path kParquet = fs::path(SOLTRAIN_FIXTURES) / "parquet";

std::vector<ordered_json> records(const fs::path& p, std::vector<std::string> columns = {}, std::string split = "") {
  RecordReader r(p, std::move(columns), split);
  std::vector<ordered_json> out;
  ordered_json rec;
  std::string where, error;
  while (r.next(rec, where, error)) {
    EXPECT_EQ(error, "") << where;
    out.push_back(rec);
  }
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string gzip(const std::string& s) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);  // 16: gzip header
  std::string out(deflateBound(&z, uLong(s.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = uInt(s.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& s) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), s.data(), s.size(), 3));
  return out;
}

// Instruction rows with the awkward characters: quotes, commas, tabs, line breaks, non-ASCII; a missing input.
const std::vector<ordered_json> kRows = {
    {{"instruction", "Say \"hi\", please"}, {"input", "a\tb"}, {"output", "hi\nthere"}},
    {{"instruction", "Café 東京 🙂"}, {"input", nullptr}, {"output", "ok"}},
    {{"instruction", "Sum 2, 3"}, {"input", "x"}, {"output", "5"}},
};

std::string jsonl(const std::vector<ordered_json>& rows) {
  std::string s;
  for (const auto& r : rows) s += r.dump() + "\n";
  return s;
}

std::string csv_field(const ordered_json& v, char delim) {
  if (v.is_null()) return "";
  const std::string s = v.get<std::string>();
  if (s.find_first_of(std::string("\"\n\r") + delim) == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv(const std::vector<ordered_json>& rows, char delim, const std::string& eol = "\n") {
  std::string s = std::string("instruction") + delim + "input" + delim + "output" + eol;
  for (const auto& r : rows)
    s += csv_field(r["instruction"], delim) + delim + csv_field(r["input"], delim) + delim +
         csv_field(r["output"], delim) + eol;
  return s;
}

TEST(DataFormats, EveryTextFormatGivesTheSameRecords) {
  test::TempDir t;
  test::write_text(t.path / "d.jsonl", jsonl(kRows));
  std::string array = "[\n";
  for (size_t i = 0; i < kRows.size(); ++i) array += (i ? ",\n" : "") + kRows[i].dump(2);
  array += "\n]\n";
  test::write_text(t.path / "array.json", array);
  test::write_text(t.path / "object.json", "{\"version\": 1, \"data\": " + array + "}");
  test::write_text(t.path / "lines.json", jsonl(kRows));  // JSON Lines under a .json name, as HF reads it
  test::write_text(t.path / "d.csv", csv(kRows, ','));
  test::write_text(t.path / "crlf.csv", csv(kRows, ',', "\r\n"));
  test::write_text(t.path / "d.tsv", csv(kRows, '\t'));
  test::write_text(t.path / "d.jsonl.gz", gzip(jsonl(kRows)));
  test::write_text(t.path / "two-members.jsonl.gz", gzip(jsonl({kRows[0]})) + gzip(jsonl({kRows[1], kRows[2]})));
  test::write_text(t.path / "d.jsonl.zst", zstd(jsonl(kRows)));
  test::write_text(t.path / "d.csv.gz", gzip(csv(kRows, ',')));
  test::write_text(t.path / "d.tsv.zst", zstd(csv(kRows, '\t')));
  test::write_text(t.path / "d.json.zst", zstd(array));
  const auto want = records(t.path / "d.jsonl");
  ASSERT_EQ(want, kRows);
  for (const char* f : {"array.json", "object.json", "lines.json", "d.csv", "crlf.csv", "d.tsv", "d.jsonl.gz",
                        "two-members.jsonl.gz", "d.jsonl.zst", "d.csv.gz", "d.tsv.zst", "d.json.zst"})
    EXPECT_EQ(records(t.path / f), want) << f;
}

TEST(DataFormats, CsvQuotingLinesAndErrors) {
  CsvParser p("a,\"b \"\"q\"\"\nline\",c\n\nx,y\"z,\n\"open", ',');
  CsvRow r;
  ASSERT_TRUE(p.next(r));
  ASSERT_EQ(r.fields.size(), 3u);
  EXPECT_EQ(r.fields[1].value, "b \"q\"\nline");
  EXPECT_EQ(r.line, 1u);
  ASSERT_TRUE(p.next(r));
  EXPECT_TRUE(r.blank);
  ASSERT_TRUE(p.next(r));
  EXPECT_EQ(r.line, 4u);  // the quoted line break counts
  ASSERT_EQ(r.fields.size(), 3u);
  EXPECT_EQ(r.fields[1].value, "y\"z");  // a quote inside an unquoted field is kept, as pandas does
  EXPECT_EQ(r.fields[2].value, "");
  ASSERT_TRUE(p.next(r));
  EXPECT_EQ(r.error, "a quote opened on line 5 is never closed");
  CsvParser after("\"a\"b,c\nd,e\n", ',');
  ASSERT_TRUE(after.next(r));
  EXPECT_NE(r.error.find("text after a closing quote"), std::string::npos);
  ASSERT_TRUE(after.next(r));  // the parser resumes at the next line
  EXPECT_EQ(r.fields.size(), 2u);
  EXPECT_EQ(r.fields[0].value, "d");
}

TEST(DataFormats, FolderIsOneDatasetInSortedOrderAndSplitsSelectFiles) {
  test::TempDir t;
  fs::create_directories(t.path / "ds" / "sub");
  fs::create_directories(t.path / "ds" / ".cache");
  test::write_text(t.path / "ds" / "b.jsonl", jsonl({kRows[1]}));
  test::write_text(t.path / "ds" / "a.csv", csv({kRows[0]}, ','));
  test::write_text(t.path / "ds" / "sub" / "c.jsonl.zst", zstd(jsonl({kRows[2]})));
  test::write_text(t.path / "ds" / "README.md", "# not data\n");
  test::write_text(t.path / "ds" / ".cache" / "x.jsonl", "garbage\n");
  EXPECT_EQ(records(t.path / "ds"), kRows);
  EXPECT_EQ(records(t.path / "ds", {}, "train"), kRows);  // no file names a split: all of them are train

  fs::create_directories(t.path / "hub" / "data");
  test::write_text(t.path / "hub" / "data" / "train-00001-of-00002.jsonl", jsonl({kRows[1]}));
  test::write_text(t.path / "hub" / "data" / "train-00000-of-00002.jsonl", jsonl({kRows[0]}));
  test::write_text(t.path / "hub" / "data" / "test-00000-of-00001.jsonl", jsonl({kRows[2]}));
  EXPECT_EQ(records(t.path / "hub", {}, "train"), (std::vector<ordered_json>{kRows[0], kRows[1]}));
  EXPECT_EQ(records(t.path / "hub", {}, "test"), (std::vector<ordered_json>{kRows[2]}));
  try {
    records(t.path / "hub", {}, "validation");
    ADD_FAILURE() << "no error for a split no file names";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("split \"validation\": no file in the folder is named for it"),
              std::string::npos)
        << e.what();
  }
  fs::create_directories(t.path / "empty");
  EXPECT_THROW(records(t.path / "empty"), UserError);
}

TokenizeOptions options(const fs::path& data, const fs::path& out, DatasetType type) {
  TokenizeOptions o;
  o.tokenizer = test::tokenizer_folder("qwen3");
  o.sources = {{data, type}};
  o.out = out;
  o.progress = false;
  return o;
}

// The documents (ids and masks) tokenize writes for `data`.
std::pair<std::vector<int32_t>, std::vector<uint8_t>> tokens(const fs::path& data, const fs::path& out,
                                                             DatasetType type) {
  std::ostringstream log;
  run_tokenize(options(data, out, type), log);
  ShardSet s = load_shards(out);
  return {s.tokens, s.mask};
}

TEST(DataFormats, CsvAndCompressedFilesGiveTheSameTokensAsJsonl) {
  test::TempDir t;
  test::write_text(t.path / "d.jsonl", jsonl(kRows));
  test::write_text(t.path / "d.csv", csv(kRows, ','));
  test::write_text(t.path / "d.jsonl.zst", zstd(jsonl(kRows)));
  for (DatasetType type : {DatasetType::kAlpaca, DatasetType::kInstruction}) {
    const auto want = tokens(t.path / "d.jsonl", t.path / "o1", type);
    ASSERT_FALSE(want.first.empty());
    EXPECT_EQ(tokens(t.path / "d.csv", t.path / "o2", type), want) << to_string(type);
    EXPECT_EQ(tokens(t.path / "d.jsonl.zst", t.path / "o3", type), want) << to_string(type);
    for (const char* o : {"o1", "o2", "o3"}) fs::remove_all(t.path / o);
  }
}

// A folder's cache key is every file it holds: a new file re-tokenizes, an unchanged folder is reused.
TEST(DataFormats, FolderCacheKeyCoversItsFiles) {
  test::TempDir t;
  fs::create_directories(t.path / "ds");
  test::write_text(t.path / "ds" / "a.jsonl", jsonl({kRows[0]}));
  std::ostringstream log;
  EXPECT_EQ(run_tokenize(options(t.path / "ds", t.path / "out", DatasetType::kAlpaca), log).documents, 1);
  EXPECT_TRUE(run_tokenize(options(t.path / "ds", t.path / "out", DatasetType::kAlpaca), log).reused);
  test::write_text(t.path / "ds" / "b.csv", csv({kRows[1], kRows[2]}, ','));
  const TokenizeResult r = run_tokenize(options(t.path / "ds", t.path / "out", DatasetType::kAlpaca), log);
  EXPECT_FALSE(r.reused);
  EXPECT_EQ(r.documents, 3);
}

// --- parquet: the fixtures are pyarrow's (tests/tools/make_parquet_fixtures.py) ---

TEST(DataFormats, ParquetFlatFilesGiveTheJsonlRows) {
  const auto want = records(kParquet / "flat.jsonl");
  ASSERT_EQ(want.size(), 57u);
  for (const char* f : {"flat_snappy", "flat_zstd", "flat_gzip", "flat_none", "flat_snappy_plain"})
    EXPECT_EQ(records(kParquet / (std::string(f) + ".parquet")), want) << f;
  EXPECT_EQ(records(kParquet / "folder"), want);
  // Only the columns asked for are decoded, in the file's order.
  const auto some = records(kParquet / "flat_zstd.parquet", {"output", "instruction", "absent"});
  ASSERT_EQ(some.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(some[i], (ordered_json{{"instruction", want[i]["instruction"]}, {"output", want[i]["output"]}}));
}

TEST(DataFormats, ParquetConversationsGiveTheJsonlRows) {
  const auto want = records(kParquet / "chat.jsonl");
  ASSERT_EQ(want.size(), 23u);
  for (const char* f : {"chat_snappy", "chat_zstd", "chat_none"})
    EXPECT_EQ(records(kParquet / (std::string(f) + ".parquet")), want) << f;
}

TEST(DataFormats, ParquetGivesTheSameTokensAsJsonl) {
  test::TempDir t;
  for (DatasetType type : {DatasetType::kAlpaca, DatasetType::kAuto}) {
    const auto want = tokens(kParquet / "flat.jsonl", t.path / "a", type);
    EXPECT_EQ(tokens(kParquet / "flat_snappy.parquet", t.path / "b", type), want);
    EXPECT_EQ(tokens(kParquet / "folder", t.path / "c", type), want);
    for (const char* o : {"a", "b", "c"}) fs::remove_all(t.path / o);
  }
  const auto chat = tokens(kParquet / "chat.jsonl", t.path / "d", DatasetType::kConversation);
  EXPECT_EQ(tokens(kParquet / "chat_zstd.parquet", t.path / "e", DatasetType::kConversation), chat);
}

// A config's dataset entry: a parquet folder with `split: train` and Surogate's `samples` (the 57 rows once,
// then 43 of them drawn at random) through the training data path.
TEST(DataFormats, ConfigFolderSplitAndSamplesReachTheTrainingData) {
  test::TempDir t;
  TrainConfig c;
  c.model = test::tokenizer_folder("qwen3");
  c.dataset_prepared_path = t.path / "prepared";
  DatasetSpec spec;
  spec.path = kParquet / "folder";
  spec.type = DatasetType::kAlpaca;
  spec.split = "train";
  spec.samples = 100;
  c.datasets = {spec};
  std::ostringstream log;
  const TrainData d = prepare_train_data(c, log);
  EXPECT_EQ(d.train.documents(), 100);
  const ShardSet all = load_shards(c.dataset_prepared_path / "train-0-folder");
  ASSERT_EQ(all.documents(), 57);
  // The first 57 documents are the dataset in order.
  EXPECT_TRUE(std::equal(all.tokens.begin(), all.tokens.end(), d.train.tokens.begin()));
  c.datasets[0].split = "test";
  EXPECT_THROW(prepare_train_data(c, log), UserError);
}

// Malformed files through the CLI: one line naming the file, exit 2, nothing written.
TEST(DataFormats, MalformedFilesAreOneLineAndExit2) {
  test::TempDir t;
  const std::string good = read_bytes(kParquet / "flat_snappy.parquet");
  struct Case {
    std::string name, bytes, why;
  };
  std::vector<Case> cases = {
      {"truncated.parquet", good.substr(0, good.size() / 2), "does not end with PAR1"},
      {"magic.parquet", "XXXX" + good.substr(4), "does not start with PAR1"},
      {"short.parquet", "PAR1", "too short"},
      {"quote.csv", "instruction,input,output\n\"never closed,x,y\n", "a quote opened on line 2 is never closed"},
      {"line.jsonl", jsonl({kRows[0]}) + "{\"instruction\": oops}\n", ":2: not valid JSON"},
      {"cut.jsonl.gz", gzip(jsonl(kRows)).substr(0, 30), "cut short"},
      {"bad.jsonl.zst", "not zstd at all", "not a valid zstd file"},
  };
  // A footer whose length points before the file's start, and a corrupt page inside a valid footer.
  std::string footer = good;
  footer[footer.size() - 8] = '\xff';
  footer[footer.size() - 7] = '\xff';
  cases.push_back({"footer.parquet", footer, "footer length is larger than the file"});
  std::string page = good;
  for (size_t i = 4; i < 200 && i < page.size(); ++i) page[i] = char(0xA5);
  cases.push_back({"page.parquet", page, "row group 0"});
  for (const Case& c : cases) {
    test::write_text(t.path / c.name, c.bytes);
    const test::CliRun r =
        test::run("tokenize --tokenizer " + test::tokenizer_folder("qwen3").string() + " --data " +
                      (t.path / c.name).string() + ":alpaca --quiet --out " + (t.path / "out").string(),
                  t);
    EXPECT_EQ(r.code, 2) << c.name << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find((t.path / c.name).string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.why), std::string::npos) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(t.path / "out")) << c.name;
  }
}

}  // namespace
}  // namespace soltrain
