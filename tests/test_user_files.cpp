// Issue 13, "nothing the user had is lost": output folders that soltrain did not write are refused, outputs
// may not overlap inputs, and leftovers of killed runs are cleaned up. Every refusal leaves the user's files
// byte-identical.
#include <fstream>

#include "fault_test_util.h"
#include "io/output_dir.h"
#include "io/stale_partials.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

std::string fixture_model() {
  return (fixtures() / "models" / "qwen3-tiny").string();
}
std::string peft() {
  return (fixtures() / "peft" / "qwen3-tiny").string();
}

// A folder of the user's: notes and a run of another tool.
fs::path users_folder(const fs::path& p) {
  fs::create_directories(p / "checkpoint-7");
  write_text(p / "notes.txt", "my notes\n");
  write_text(p / "checkpoint-7" / "weights.bin", "weights\n");
  return p;
}

std::string merge_to(const fs::path& out) {
  return "merge --model " + fixture_model() + " --adapter " + peft() + "/adapter --out " + out.string();
}

TEST(UserFiles, MergeRefusesAFolderItDidNotWrite) {
  TempDir t;
  const fs::path out = users_folder(t.path / "out");
  const auto before = snapshot(out);
  expect_refused(run_bounded(merge_to(out), t), "not written by soltrain");
  EXPECT_EQ(snapshot(out), before);
  // --overwrite replaces it on purpose
  ASSERT_EQ(run_bounded(merge_to(out) + " --overwrite", t).code, 0);
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "notes.txt"));
  // its own output (marked) is replaced without asking
  EXPECT_TRUE(fs::exists(out / kOutputMarker));
  EXPECT_EQ(run_bounded(merge_to(out), t).code, 0);
  // an empty folder is fine too
  fs::create_directories(t.path / "empty");
  EXPECT_EQ(run_bounded(merge_to(t.path / "empty"), t).code, 0);
}

TEST(UserFiles, OutNeverReplacesAFileWithAFolder) {
  TempDir t;
  write_text(t.path / "file", "a file\n");
  const auto before = snapshot(t.path / "file");
  expect_refused(run_bounded(merge_to(t.path / "file"), t), "is a file, not a folder");
  expect_refused(run_bounded(merge_to(t.path / "file") + " --overwrite", t), "is a file, not a folder");
  EXPECT_EQ(snapshot(t.path / "file"), before);
}

TEST(UserFiles, TrainRefusesARunFolderItDidNotWrite) {
  TempDir t;
  const fs::path out = users_folder(t.path / "run");
  const auto before = snapshot(out);
  expect_refused(run_bounded("train --model " + fixture_model() + " --batch " + fixture_model() +
                                 "/batch.safetensors --steps 1 --out " + out.string(),
                             t),
                 "--overwrite");
  EXPECT_EQ(snapshot(out), before);
}

TEST(UserFiles, MergeIntoItsOwnInputIsRefused) {
  TempDir t;
  fs::copy(fixture_model(), t.path / "base");
  fs::copy(peft() + "/adapter", t.path / "adapter");
  const auto base = snapshot(t.path / "base"), adapter = snapshot(t.path / "adapter");
  for (const fs::path& out : {t.path / "base", t.path / "adapter", t.path})
    expect_refused(run_bounded("merge --model " + (t.path / "base").string() + " --adapter " +
                                   (t.path / "adapter").string() + " --out " + out.string() + " --overwrite",
                               t),
                   "--out");
  EXPECT_EQ(snapshot(t.path / "base"), base);
  EXPECT_EQ(snapshot(t.path / "adapter"), adapter);
}

TEST(UserFiles, DumpSaveAdapterAndDemoSetupRefuseAFolderTheyDidNotWrite) {
  TempDir t;
  const fs::path mine = users_folder(t.path / "mine");
  const auto before = snapshot(mine);
  expect_refused(run_bounded("dump --model " + fixture_model() + " --adapter " + peft() + "/adapter --batch " +
                                 fixture_model() + "/batch.safetensors --out " + (t.path / "d.safetensors").string() +
                                 " --save-adapter " + mine.string(),
                             t),
                 "or empty it");
  users_folder(t.path / "demo" / "model");
  const auto demo = snapshot(t.path / "demo");
  expect_refused(run_bounded("demo-setup --out " + (t.path / "demo").string(), t), "not written by soltrain");
  EXPECT_EQ(snapshot(mine), before);
  EXPECT_EQ(snapshot(t.path / "demo"), demo);
  EXPECT_FALSE(fs::exists(t.path / "d.safetensors"));
}

TEST(UserFiles, TokenizeRefusesAFolderItDidNotWrite) {
  TempDir t;
  write_reversal_dataset(t.path / "d.jsonl", 5, 1);
  const fs::path out = users_folder(t.path / "shards");
  const auto before = snapshot(out);
  expect_refused(run_bounded("tokenize --tokenizer " + fixture_model() + " --data " + (t.path / "d.jsonl").string() +
                                 " --out " + out.string(),
                             t),
                 "not written by soltrain");
  EXPECT_EQ(snapshot(out), before);
}

TEST(UserFiles, SftRefusesAnOutputDirItDidNotWrite) {
  TinyRun f;
  users_folder(f.t.path / "mine");
  const auto before = snapshot(f.t.path / "mine");
  expect_refused(run_bounded("sft " + f.config("model: model\noutput_dir: mine\n"), f.t), "overwrite_output_dir");
  EXPECT_EQ(snapshot(f.t.path / "mine"), before);
  const CliRun ok = run_bounded("sft " + f.config("model: model\noutput_dir: mine\noverwrite_output_dir: true\n"), f.t);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(read_text(f.t.path / "mine" / "notes.txt"), "my notes\n");  // written into, not wiped
  // a second run in the same (now marked) folder needs no flag
  EXPECT_EQ(run_bounded("sft " + f.config("model: model\noutput_dir: mine\n"), f.t).code, 0);
}

TEST(UserFiles, SftNeverWritesOverTheBaseModel) {
  TinyRun f;
  const auto base = snapshot(f.t.path / "model");
  // output_dir/model would be the base model's own folder
  expect_refused(run_bounded("sft " + f.config("model: model\noutput_dir: .\noverwrite_output_dir: true\n"), f.t),
                 "the same folder as model");
  // output_dir inside the base model folder
  expect_refused(run_bounded("sft " + f.config("model: model\noutput_dir: model/run\n"), f.t), "inside model");
  // the shard cache inside the model folder
  expect_refused(
      run_bounded("sft " + f.config("model: model\noutput_dir: run\ndataset_prepared_path: model/cache\n"), f.t),
      "dataset_prepared_path");
  // a dataset inside a folder that is replaced
  fs::create_directories(f.t.path / "run2" / "model");
  fs::copy(f.t.path / "train.jsonl", f.t.path / "run2" / "model" / "train.jsonl");
  write_text(f.t.path / "run2" / kOutputMarker, "");
  write_text(f.t.path / "c2.yaml",
             "model: model\noutput_dir: run2\ndatasets: [run2/model/train.jsonl]\nmax_steps: 1\nsequence_len: 64\n");
  expect_refused(run_bounded("sft " + (f.t.path / "c2.yaml").string(), f.t), "is inside output_dir");
  EXPECT_EQ(snapshot(f.t.path / "model"), base);
}

TEST(StalePartials, LeftoversOfDeadProcessesAreRemovedLiveOnesKept) {
  TempDir t;
  const std::string dead = "999999999";  // above any pid_max: no such process
  fs::create_directories(t.path / (".checkpoint-4.partial-" + dead) / "model");
  write_text(t.path / (".checkpoint-4.partial-" + dead) / "model" / "w", "x");
  write_text(t.path / (".metrics.jsonl.tmp-" + dead), "x");
  const std::string live = ".model.partial-" + std::to_string(getppid());  // the test runner's parent runs
  fs::create_directories(t.path / live);
  // a replace killed between its renames: the old folder is the only copy and goes back under its name
  fs::create_directories(t.path / (".model-old.old-" + dead));
  write_text(t.path / (".model-old.old-" + dead) / "config.json", "{}");
  write_text(t.path / "notes.partial-1", "not ours: no leading dot");
  std::ostringstream log;
  EXPECT_EQ(clean_stale_partials(t.path, log), 3);
  EXPECT_FALSE(fs::exists(t.path / (".checkpoint-4.partial-" + dead)));
  EXPECT_FALSE(fs::exists(t.path / (".metrics.jsonl.tmp-" + dead)));
  EXPECT_TRUE(fs::exists(t.path / live));
  EXPECT_EQ(read_text(t.path / "model-old" / "config.json"), "{}");
  EXPECT_TRUE(fs::exists(t.path / "notes.partial-1"));
  EXPECT_NE(log.str().find("removed " + (t.path / (".checkpoint-4.partial-" + dead)).string()), std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("restored"), std::string::npos) << log.str();
}

TEST(StalePartials, SftRemovesThemAtTheStartAndSaysSo) {
  TinyRun f;
  const std::string dead = "999999999";
  fs::create_directories(f.t.path / "run" / (".checkpoint-3.partial-" + dead));
  fs::create_directories(f.t.path / "run" / "prepared" / (".train-0-train.partial-" + dead));
  write_text(f.t.path / "run" / kOutputMarker, "");
  const CliRun r = run_bounded("sft " + f.config("model: model\noutput_dir: run\n"), f.t);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(f.t.path / "run" / (".checkpoint-3.partial-" + dead)));
  EXPECT_FALSE(fs::exists(f.t.path / "run" / "prepared" / (".train-0-train.partial-" + dead)));
  EXPECT_NE(r.err.find(".checkpoint-3.partial-" + dead), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(".train-0-train.partial-" + dead), std::string::npos) << r.err;
}

}  // namespace
}  // namespace soltrain::test
