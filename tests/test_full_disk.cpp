// Issue 13: a full disk during training. Every log write is checked; the run stops with one line after
// saving a checkpoint, instead of training on while metrics.jsonl and the TensorBoard file end mid-line.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fault_test_util.h"
#include "io/checked_write.h"
#include "train/train_checkpoint.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

TEST(FullDisk, AppendToAFullDeviceIsAUserError) {
  std::ofstream full("/dev/full", std::ios::binary);
  ASSERT_TRUE(full) << "/dev/full is missing";
  try {
    append_checked(full, std::string(8192, 'x'), "/dev/full", "the metrics log");
    ADD_FAILURE() << "a write to /dev/full succeeded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write the metrics log (No space left on device"),
              std::string::npos)
        << e.what();
  }
}

TEST(FullDisk, SftStopsWithOneLineAndKeepsACheckpoint) {
  TinyRun r;
  const auto data = snapshot(r.t.path / "train.jsonl");
  const CliRun run = run_bounded("sft " + r.config("model: model\noutput_dir: run\nmax_steps: 200\n"), r.t, 60,
                                 "SOLTRAIN_TEST_DISK_FULL_AFTER=3000");
  expect_refused(run, "cannot write");
  EXPECT_NE(run.err.find("is the disk full?"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("a checkpoint of the steps so far was saved"), std::string::npos) << run.err;
  const auto ckpts = list_checkpoints(r.t.path / "run");
  ASSERT_EQ(ckpts.size(), 1u) << run.err;
  const int64_t step = nlohmann::json::parse(read_text(ckpts[0] / "trainer_state.json"))["global_step"];
  EXPECT_GT(step, 0);
  EXPECT_LT(step, 200) << "the run went on to the end";
  EXPECT_FALSE(fs::exists(r.t.path / "run" / "model"));
  // what reached metrics.jsonl is whole lines
  const std::string metrics = read_text(r.t.path / "run" / "metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(metrics.back(), '\n');
  EXPECT_EQ(snapshot(r.t.path / "train.jsonl"), data);
}

// Data parallel: rank 0 alone writes the logs, so a full disk meets it alone; it cannot checkpoint without the
// others (they are in the next step's collectives): one line saying so, and the job ends in bounded time with
// the newest checkpoint whole.
TEST(FullDisk, DataParallelRanksStopInOneLineWithoutHanging) {
  TinyRun r;
  const CliRun run = run_bounded(
      "sft " +
          r.config("model: model\noutput_dir: run\nmax_steps: 200\nsave_steps: 2\nddp_timeout: 20\nzero_stage: 2\n") +
          " --gpus 2",
      r.t, 90, "SOLTRAIN_TEST_DISK_FULL_AFTER=3000");
  EXPECT_EQ(run.code, 2) << run.err;
  EXPECT_NE(run.err.find("is the disk full?"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("data-parallel ranks checkpoint together"), std::string::npos) << run.err;
  const auto ckpts = list_checkpoints(r.t.path / "run");
  ASSERT_FALSE(ckpts.empty()) << run.err;
  EXPECT_TRUE(fs::exists(ckpts.back() / "checksums.sha256"));
}

}  // namespace
}  // namespace soltrain::test
