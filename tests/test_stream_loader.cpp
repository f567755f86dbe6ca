// Streamed datasets (data/stream_loader.h): the batches equal the Loader's over the same data tokenized ahead (in
// order: one encoding, one packing rule), across epochs, with bad records skipped and over-long documents cut or
// left out; a resume from any saved state continues with the very batches an uninterrupted stream gives.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "data/loader.h"
#include "data/shards.h"
#include "data/stream_loader.h"
#include "data/tokenize_job.h"
#include "data_test_util.h"
#include "test_util.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

// Fresh random text rows of 1 to 60 words (some longer than the rows below), with a bad line and a record of the
// wrong shape among them; the second file is read after the first.
struct StreamFiles {
  test::TempDir t;
  fs::path a = t.path / "a.jsonl", b = t.path / "b.jsonl";
  explicit StreamFiles(uint32_t seed) {
    std::mt19937 rng(seed);
    const char* words[] = {"river", "stone", "light", "under", "the", "quiet", "north", "seven", "wind", "of"};
    auto row = [&] {
      std::string s;
      for (int k = 0, n = 1 + int(rng() % 60); k < n; ++k) s += (k ? " " : "") + std::string(words[rng() % 10]);
      return "{\"text\": \"" + s + "\"}\n";
    };
    std::string x, y;
    for (int i = 0; i < 37; ++i) x += row();
    x += "{not json\n";
    x += "{\"text\": 5}\n";
    for (int i = 0; i < 23; ++i) y += row();
    test::write_text(a, x);
    test::write_text(b, y);
  }
};

LoaderOptions rows_of(int rows, int seq_len, OverlongPolicy overlong, bool pack = true) {
  LoaderOptions o;
  o.rows = rows, o.seq_len = seq_len, o.shuffle = false, o.pad_id = 3, o.overlong = overlong, o.pack = pack;
  return o;
}

StreamLoader stream(const StreamFiles& f, const LoaderOptions& lo, DatasetType type = DatasetType::kText) {
  StreamOptions o;
  o.loader = lo;
  o.tokenizer_dir = test::tokenizer_folder("qwen3");
  o.train_on_inputs = true;
  o.bad_records = BadRecordPolicy::kSkip;
  o.vocab_size = 151936;
  return StreamLoader({{f.a, "", type, {}, {}}, {f.b, "", type, {}, {}}}, o);
}

// The same files tokenized ahead (soltrain tokenize) under the same loader options.
Loader ahead(const StreamFiles& f, const LoaderOptions& lo) {
  TokenizeOptions o;
  o.tokenizer = test::tokenizer_folder("qwen3");
  o.sources = {{f.a, DatasetType::kText}, {f.b, DatasetType::kText}};
  o.out = f.t.path / "shards";
  o.train_on_inputs = true;
  o.bad_records = BadRecordPolicy::kSkip;
  o.progress = false;
  std::ostringstream log;
  run_tokenize(o, log);
  return Loader(load_shards(o.out), lo);
}

void expect_same(const HostBatch& a, const HostBatch& b, int step) {
  EXPECT_EQ(a.input_ids, b.input_ids) << "batch " << step;
  EXPECT_EQ(a.targets, b.targets) << "batch " << step;
  EXPECT_EQ(a.positions, b.positions) << "batch " << step;
  EXPECT_EQ(a.cu_seqlens, b.cu_seqlens) << "batch " << step;
}

TEST(StreamLoader, BatchesEqualTheLoadersOverTheSameDataAcrossEpochs) {
  const uint32_t seed = test::test_seed(11);
  StreamFiles f(seed);
  for (OverlongPolicy p : {OverlongPolicy::kTruncate, OverlongPolicy::kDrop})
    for (bool pack : {true, false}) {
      const LoaderOptions lo = rows_of(3, 48, p, pack);
      Loader want = ahead(f, lo);
      StreamLoader got = stream(f, lo);
      int64_t epochs = 0;
      for (int step = 0; step < 70; ++step) {  // (several passes over the 60 documents)
        expect_same(got.next(), want.next(), step);
        EXPECT_EQ(got.state().epoch, want.state().epoch) << step << test::seed_message(seed);
        epochs = want.state().epoch;
      }
      EXPECT_GE(epochs, 2);
      EXPECT_GE(got.skipped(), 2 * epochs) << "the bad line and the bad record, once in every pass";
    }
}

TEST(StreamLoader, ResumesAtTheExactRecordFromAnySavedState) {
  StreamFiles f(test::test_seed(5));
  const LoaderOptions lo = rows_of(2, 40, OverlongPolicy::kTruncate);
  StreamLoader whole = stream(f, lo, DatasetType::kAuto);
  std::vector<LoaderState> states;
  std::vector<HostBatch> batches;
  for (int step = 0; step < 30; ++step) {
    states.push_back(whole.state());
    batches.push_back(whole.next());
  }
  for (size_t from : {size_t(1), size_t(7), size_t(13), size_t(22), size_t(29)}) {
    StreamLoader resumed = stream(f, lo, DatasetType::kAuto);  // (type auto: decided again after the resume)
    resumed.restore(states[from]);
    for (size_t s = from; s < batches.size(); ++s) expect_same(resumed.next(), batches[s], int(s));
  }
  // resumed after the last usable record of a pass whose tail is bad records: the next pass, not an error
  StreamFiles g(test::test_seed(9));
  test::write_text(g.b, "{not json\n{\"text\": 5}\n");  // the second file: bad records only
  StreamLoader tail = stream(g, lo);
  tail.restore(LoaderState{0, 38});  // past the first file's 37 rows and its bad line
  EXPECT_EQ(tail.next().rows, 2);
  EXPECT_EQ(tail.state().epoch, 1);
  StreamLoader past = stream(f, lo);
  EXPECT_EQ(test::user_error_text([&] {
              past.restore(LoaderState{0, 1000});
            }),
            "loader state: record 1000 is past the 62 records of the streamed datasets");
}

// A checkpoint's loader state says which reader it is a place in: resumed under the other (streaming toggled
// between save and resume) it would land on another row, so it is one line; a state saved before the field
// existed (no kind) is taken as before.
TEST(StreamLoader, AStateOfTheOtherReaderIsRefused) {
  StreamFiles f(test::test_seed(6));
  const LoaderOptions lo = rows_of(2, 40, OverlongPolicy::kTruncate);
  StreamLoader streamed = stream(f, lo);
  Loader tokenized = ahead(f, lo);
  streamed.next();
  tokenized.next();
  const LoaderState s = LoaderState::from_json(streamed.state().to_json()),
                    t = LoaderState::from_json(tokenized.state().to_json());
  EXPECT_EQ(s.kind, LoaderState::kStreamed);
  EXPECT_EQ(t.kind, LoaderState::kTokenized);
  Loader other_t = ahead(f, lo);
  EXPECT_EQ(test::user_error_text([&] { other_t.restore(s); }),
            "resume_from_checkpoint: the checkpoint read its datasets streamed as training goes (streaming: true or "
            "pretraining_dataset), this run reads them tokenized ahead (no streaming): its place in the data (" +
                std::to_string(s.index) + ") would be another row here; resume with the checkpoint's setting");
  StreamLoader other_s = stream(f, lo);
  EXPECT_NE(test::user_error_text([&] { other_s.restore(t); }).find("the checkpoint read its datasets tokenized ahead"),
            std::string::npos);
  // the same reader, and a state without a kind, resume
  StreamLoader same = stream(f, lo);
  same.restore(s);
  EXPECT_EQ(same.state(), streamed.state());
  Loader old = ahead(f, lo);
  old.restore(LoaderState::from_json(nlohmann::json{{"epoch", t.epoch}, {"index", t.index}}));
  EXPECT_EQ(old.state(), tokenized.state());
  EXPECT_EQ(old.state().kind, LoaderState::kTokenized);
}

TEST(StreamLoader, BadInputIsOneLine) {
  StreamFiles f(3);
  StreamOptions o;
  o.loader = rows_of(2, 40, OverlongPolicy::kRaise);
  o.tokenizer_dir = test::tokenizer_folder("qwen3");
  o.bad_records = BadRecordPolicy::kError;
  StreamLoader strict({{f.a, "", DatasetType::kText, {}, {}}}, o);
  const std::string e = test::user_error_text([&] {
    for (int i = 0; i < 100; ++i) strict.next();
  });
  // the first over-long document (raise), or the bad line if it comes first: named by file and line
  EXPECT_EQ(e.rfind(f.a.string() + ":", 0), 0u) << e;
  o.loader.overlong = OverlongPolicy::kTruncate;
  o.vocab_size = 100;  // a model whose vocabulary the tokenizer's ids exceed
  StreamLoader small({{f.b, "", DatasetType::kText, {}, {}}}, o);
  EXPECT_NE(test::user_error_text([&] { small.next(); }).find("but the model's vocab_size is 100"), std::string::npos);
  test::write_text(f.t.path / "bad.jsonl", "{not json\n{\"text\": 1}\n");
  o.bad_records = BadRecordPolicy::kSkip;
  o.vocab_size = 0;
  StreamLoader none({{f.t.path / "bad.jsonl", "", DatasetType::kText, {}, {}}}, o);
  EXPECT_EQ(test::user_error_text([&] { none.next(); }),
            "streaming: no usable document in the datasets (2 bad records skipped, 0 documents dropped)");
}

}  // namespace
}  // namespace soltrain
