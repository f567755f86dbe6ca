// Checkpoints written in the background (issue 28): training goes on while a checkpoint's snapshot is
// written; a checkpoint counts only once whole on disk; a kill -9 in the middle of writing one leaves the
// previous checkpoint, and resuming from it finishes bitwise the model an uninterrupted run saves. The same for
// data-parallel ranks with sharded moments (each rank writes its shard, rank 0 gathers them and commits).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "dp_test_util.h"
#include "fault_test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The highest "step" of metrics.jsonl's training lines (0 when none yet).
int64_t last_logged_step(const fs::path& dir) {
  int64_t last = 0;
  std::istringstream rows(read_text(dir / "metrics.jsonl"));
  for (std::string row; std::getline(rows, row);) {
    const auto j = nlohmann::json::parse(row, nullptr, false);
    if (!j.is_discarded() && j.contains("loss")) last = std::max(last, j["step"].get<int64_t>());
  }
  return last;
}

// A staged folder of checkpoint-`step` (`what`: "partial" for the checkpoint, "shards.partial" for the ranks'
// optimizer shards) lies in `dir`.
bool staged_checkpoint(const fs::path& dir, int64_t step, const std::string& what = "partial") {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(".checkpoint-" + std::to_string(step) + "." + what + "-")) return true;
  return false;
}

// Starts `sft` into output_dir `out` with each checkpoint's write held 1.5 s, and kill -9s it (its whole process
// group: a launcher and its ranks) once checkpoint-4 is whole and checkpoint-8's `what` staged folder is there.
// Whether it was killed, and whether steps 5-6 were trained while checkpoint-4 was being written.
struct KillMidWrite {
  bool killed = false, trained_on = false;
};
KillMidWrite kill_mid_write(const DpSetup& s, const std::string& out, const std::string& run, const std::string& what) {
  const fs::path dir = s.t.path / out;
  ::setenv("SOLTRAIN_TEST_SLOW_SAVE_MS", "1500", 1);
  const pid_t pid = spawn_launcher(s, out, run, s.t.path / (out + ".log"));
  ::unsetenv("SOLTRAIN_TEST_SLOW_SAVE_MS");
  KillMidWrite k;
  for (const auto end = Clock::now() + std::chrono::seconds(60); Clock::now() < end && !k.killed;) {
    if (fs::exists(dir) && staged_checkpoint(dir, 4) && last_logged_step(dir) >= 6) k.trained_on = true;
    if (fs::exists(dir / "checkpoint-4") && staged_checkpoint(dir, 8, what)) k.killed = ::kill(-pid, SIGKILL) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return k;
}

TEST(BackgroundCheckpoints, TrainingGoesOnAndAKillMidWriteResumesBitwise) {
  DpSetup s;
  const std::string run = "--set max_steps=12 --set save_steps=4 --set logging_steps=1 ";
  ASSERT_EQ(s.sft(0, "ref", run).code, 0);
  const fs::path dir = s.t.path / "bg";
  // While checkpoint-4 is being written, the steps after it are trained; checkpoint-8 half written: kill -9.
  const KillMidWrite k = kill_mid_write(s, "bg", run, "partial");
  ASSERT_TRUE(k.killed) << read_text(s.t.path / "bg.log");
  EXPECT_TRUE(k.trained_on) << "steps 5-6 waited for checkpoint-4's write";
  EXPECT_FALSE(fs::exists(dir / "checkpoint-8")) << "a checkpoint counted before it was whole";
  EXPECT_TRUE(fs::exists(dir / "checkpoint-4" / "checksums.sha256"));
  const CliRun again = s.sft(0, "bg", run + "--set resume_from_checkpoint=true");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("checkpoint-4 at step 4"), std::string::npos) << again.err;
  EXPECT_EQ(read_text(dir / "model" / "model.safetensors"),
            read_text(s.t.path / "ref" / "model" / "model.safetensors"));
  EXPECT_FALSE(staged_checkpoint(dir, 8)) << "the killed run's staged folder was not cleaned up";
  // Written in the background or not, a checkpoint holds the same bytes.
  ASSERT_EQ(s.sft(0, "fg", run + "--set background_checkpoints=false").code, 0);
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "soltrain_state.json"})
    EXPECT_EQ(read_text(s.t.path / "fg" / "checkpoint-8" / f), read_text(s.t.path / "ref" / "checkpoint-8" / f)) << f;
}

// Two ranks, ZeRO-2: the steps go on while every rank writes its optimizer shard and rank 0 the rest; the
// checkpoint appears only once rank 0 has gathered both shards, with the bytes a direct save writes; a kill -9 of
// the whole job mid-write leaves checkpoint-4, from which two ranks finish the uninterrupted job's model.
TEST(BackgroundCheckpoints, DataParallelRanksWriteTheirShardsInTheBackground) {
  DpSetup s;
  const std::string run =
      "--gpus 2 --set zero_stage=2 --set gradient_accumulation_steps=1 --set max_steps=12 "
      "--set save_steps=4 --set logging_steps=1 ";
  ASSERT_EQ(s.sft(0, "ref", run).code, 0);
  ASSERT_EQ(s.sft(0, "fg", run + "--set background_checkpoints=false").code, 0);
  for (const char* f : {"model.safetensors", "optimizer-shard-0-of-2.safetensors", "optimizer-shard-1-of-2.safetensors",
                        "soltrain_state.json"})
    EXPECT_EQ(read_text(s.t.path / "fg" / "checkpoint-8" / f), read_text(s.t.path / "ref" / "checkpoint-8" / f)) << f;
  EXPECT_FALSE(staged_checkpoint(s.t.path / "ref", 8, "shards.partial"));
  const fs::path dir = s.t.path / "bg";
  const KillMidWrite k = kill_mid_write(s, "bg", run, "shards.partial");  // the launcher and both ranks
  ASSERT_TRUE(k.killed) << read_text(s.t.path / "bg.log");
  EXPECT_TRUE(k.trained_on) << "steps 5-6 waited for checkpoint-4's write";
  EXPECT_FALSE(fs::exists(dir / "checkpoint-8")) << "a checkpoint counted before it was whole";
  for (const char* f : {"optimizer-shard-0-of-2.safetensors", "optimizer-shard-1-of-2.safetensors"})
    EXPECT_EQ(read_text(dir / "checkpoint-4" / f), read_text(s.t.path / "ref" / "checkpoint-4" / f)) << f;
  const CliRun again = s.sft(0, "bg", run + "--set resume_from_checkpoint=true");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("checkpoint-4 at step 4"), std::string::npos) << again.err;
  EXPECT_EQ(read_text(dir / "model" / "model.safetensors"),
            read_text(s.t.path / "ref" / "model" / "model.safetensors"));
  EXPECT_FALSE(staged_checkpoint(dir, 8, "shards.partial")) << "the killed job's shards folder was not cleaned up";
  EXPECT_FALSE(staged_checkpoint(dir, 12, "shards.partial"));
}

}  // namespace
}  // namespace soltrain::test
