// Issue 13's unclear messages, mended: each names the file, key or value, and the way out in the words of
// the interface the user is in (YAML keys for sft, flags for tokenize); error lines are always valid UTF-8.
#include "cli/error_text.h"
#include "fault_test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

TEST(Messages, SftDataErrorsNameTheYamlKeys) {
  TinyRun r;
  write_text(r.t.path / "train.jsonl", read_text(r.t.path / "train.jsonl") + "{\"messages\": 7}\n");
  r.inputs_changed();
  const CliRun run = run_bounded("sft " + r.config("model: model\noutput_dir: run\n"), r.t);
  expect_refused(run, "bad_records: skip in the config skips such records");
  EXPECT_EQ(run.err.find("--bad-records"), std::string::npos) << run.err;
  // the flag is named where flags are what the user typed
  const CliRun tok = run_bounded("tokenize --tokenizer " + (r.t.path / "model").string() + " --data " +
                                     (r.t.path / "train.jsonl").string() + " --out " + (r.t.path / "sh").string(),
                                 r.t);
  expect_refused(tok, "--bad-records skip");
}

TEST(Messages, AnEmptyDatasetIsNamed) {
  TinyRun r;
  write_text(r.t.path / "train.jsonl", "");
  r.inputs_changed();
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: run\n"), r.t),
                 "no usable records in " + (r.t.path / "train.jsonl").string());
}

TEST(Messages, AMissingTokenizerFolderIsNamed) {
  TinyRun r;
  expect_refused(run_bounded("tokenize --tokenizer " + (r.t.path / "nowhere").string() + " --data " +
                                 (r.t.path / "train.jsonl").string() + " --out " + (r.t.path / "sh").string(),
                             r.t),
                 (r.t.path / "nowhere").string() + ": no such folder");
}

TEST(Messages, ReusedShardsStillReportSkippedRecords) {
  TinyRun r;
  write_text(r.t.path / "train.jsonl", read_text(r.t.path / "train.jsonl") + "{\"messages\": 7}\n");
  r.inputs_changed();
  const std::string cfg = r.config("model: model\noutput_dir: run\nbad_records: skip\n");
  const CliRun first = run_bounded("sft " + cfg, r.t);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.err.find("skipped 1 bad records"), std::string::npos) << first.err;
  const CliRun again = run_bounded("sft " + cfg, r.t);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("is up to date"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("1 bad records were skipped when these shards were written"), std::string::npos)
      << again.err;
}

TEST(Messages, InvalidUtf8IsEscapedInTheErrorLine) {
  EXPECT_EQ(printable_line("a\xff"
                           "b\nc\x01 é ✓ \xc3\x28 \xed\xa0\x80"),
            "a\\xffb\\nc\\x01 é ✓ \\xc3( \\xed\\xa0\\x80");
  TinyRun r;
  const std::string bad_name = "bad\xff\xfe.jsonl";
  write_text(r.t.path / bad_name, "{\"messages\": \"\xff\xfe\"}\n");
  for (const fs::path& data : {r.t.path / bad_name, r.t.path / "missing\xff.jsonl"}) {
    const CliRun run = run_bounded("tokenize --tokenizer " + (r.t.path / "model").string() + " --data '" +
                                       data.string() + "' --out " + (r.t.path / "sh").string(),
                                   r.t);
    expect_refused(run, "\\xff");
    EXPECT_EQ(printable_line(run.err.substr(0, run.err.size() - 1)), run.err.substr(0, run.err.size() - 1))
        << "raw bytes in: " << run.err;
  }
}

}  // namespace
}  // namespace soltrain::test
