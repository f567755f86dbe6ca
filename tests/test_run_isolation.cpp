// Runs that share a machine, a folder or a job (issue 28): a second run on a busy output_dir is refused
// naming the first; workers die with a kill -9'd launcher (and a rerun resumes); ranks started with
// different configs, or one that falls silent, end the job in bounded time naming the cause; SIGHUP saves as
// SIGTERM does; a file-size limit or a closed pipe is one line, not a signal death.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <thread>

#include "cli/launch_workers.h"
#include "core/process_state.h"
#include "dp_test_util.h"
#include "fault_test_util.h"
#include "io/output_lock.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Waits (up to 60 s) until the run writing `dir` has logged a training step.
bool wait_for_a_step(const fs::path& dir) {
  for (const auto end = Clock::now() + std::chrono::seconds(60); Clock::now() < end;) {
    if (read_text(dir / "metrics.jsonl").find("\"loss\"") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The children of `parent`, from /proc.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(e.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      out.push_back(std::stoi(name));
  }
  return out;
}

// Gone, or a zombie nobody has reaped yet (the container's init may not): no longer running.
bool ended(pid_t pid) {
  const char state = process_state(pid);
  return state == 0 || state == 'Z' || state == 'X';
}

int lines_of(const std::string& s) {
  return int(std::count(s.begin(), s.end(), '\n'));
}

int exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(RunIsolation, ASecondRunOnABusyOutputDirIsRefusedNamingTheFirst) {
  DpSetup s;
  const fs::path dir = s.t.path / "out";
  const pid_t a = spawn_launcher(s, "out", "--set max_steps=100000 --set logging_steps=1", s.t.path / "a.log");
  ASSERT_TRUE(wait_for_a_step(dir)) << read_text(s.t.path / "a.log");
  const CliRun b = s.sft(0, "out", "--set max_steps=2");
  expect_refused(b, "is in use by another soltrain run (PID " + std::to_string(a) + ")");
  ASSERT_EQ(::kill(a, SIGTERM), 0);
  EXPECT_EQ(exit_code(a), 130) << read_text(s.t.path / "a.log");
  // Run A's log is its own: steps 1, 2, 3, ... with nothing of B's.
  int64_t expect = 1;
  std::istringstream rows(read_text(dir / "metrics.jsonl"));
  for (std::string row; std::getline(rows, row);) {
    const auto j = nlohmann::json::parse(row);
    if (j.contains("loss")) {
      EXPECT_EQ(j["step"].get<int64_t>(), expect++) << row;
    }
  }
  EXPECT_GT(expect, 1);
  // Once A has ended, the folder is free again (the kernel dropped the lock with the process).
  EXPECT_EQ(s.sft(0, "out", "--set max_steps=1 --set overwrite_output_dir=true").code, 0);
}

// dataset_prepared_path is shared on purpose (Axolotl's examples all say last_run_prepared): runs take it in turn.
// One that finds it being written says whom it waits for and waits; two started together both finish, the
// same losses, one having reused the other's shards.
TEST(RunIsolation, RunsSharingDatasetPreparedPathTakeItInTurn) {
  DpSetup s;
  const fs::path shared = s.t.path / "shared";
  const std::string prepared = "--set max_steps=2 --set dataset_prepared_path=" + shared.string();
  ASSERT_EQ(s.sft(0, "first", prepared).code, 0);
  const int fd = ::open((shared / kShardsLockFile).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as a run writing shards holds it
  const std::string me = std::to_string(::getpid()) + "\n";
  ASSERT_EQ(::pwrite(fd, me.data(), me.size(), 0), ssize_t(me.size()));
  const fs::path log = s.t.path / "waiting.log";
  const pid_t a = spawn_launcher(s, "waiting", prepared, log);
  const std::string says = "dataset_prepared_path " + shared.string() +
                           " is being written by another soltrain run (PID " + std::to_string(::getpid()) +
                           "): waiting for it";
  for (const auto end = Clock::now() + std::chrono::seconds(30);
       Clock::now() < end && read_text(log).find(says) == std::string::npos;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_NE(read_text(log).find(says), std::string::npos) << read_text(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  EXPECT_EQ(::waitpid(a, &status, WNOHANG), 0) << "it went on while the shards were being written";
  ::close(fd);
  EXPECT_EQ(exit_code(a), 0) << read_text(log);
  const pid_t b = spawn_launcher(s, "b", prepared + " --set overwrite_output_dir=true", s.t.path / "b.log");
  const pid_t c = spawn_launcher(s, "c", prepared + " --set overwrite_output_dir=true", s.t.path / "c.log");
  EXPECT_EQ(exit_code(b), 0) << read_text(s.t.path / "b.log");
  EXPECT_EQ(exit_code(c), 0) << read_text(s.t.path / "c.log");
  EXPECT_EQ(s.losses("b"), s.losses("first"));
  EXPECT_EQ(s.losses("c"), s.losses("first"));
}

TEST(RunIsolation, WorkersDieWithAKilledLauncherAndTheRerunResumes) {
  DpSetup s;
  const fs::path dir = s.t.path / "k9";
  const std::string run = "--gpus 2 --set gradient_accumulation_steps=1 --set logging_steps=1 ";
  const pid_t launcher = spawn_launcher(s, "k9", run + "--set max_steps=100000", s.t.path / "k9.log");
  ASSERT_TRUE(wait_for_a_step(dir)) << read_text(s.t.path / "k9.log");
  const std::vector<pid_t> workers = children_of(launcher);
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_EQ(::kill(launcher, SIGKILL), 0);
  exit_code(launcher);
  // They stop as for SIGTERM: a checkpoint, then exit.
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < end && !(ended(workers[0]) && ended(workers[1])))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(ended(workers[0]) && ended(workers[1])) << "a worker outlived its launcher";
  int64_t last = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("checkpoint-"))
      last = std::max<int64_t>(last, std::stoll(e.path().filename().string().substr(11)));
  ASSERT_GT(last, 0) << read_text(s.t.path / "k9.log");
  const CliRun again =
      s.sft(0, "k9", run + "--set resume_from_checkpoint=true --set max_steps=" + std::to_string(last + 2));
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("resuming from"), std::string::npos) << again.err;
}

TEST(RunIsolation, RanksWithDifferentConfigsEndTheJobInOneLine) {
  DpSetup s;
  const std::string port = std::to_string(free_tcp_port());
  auto rank = [&](int r, const std::string& sets) {
    return "env RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " timeout -k 5 60 " SOLTRAIN_BIN " sft " +
           (s.t.path / "base.yaml").string() + " --set output_dir=" + (s.t.path / "mixed").string() +
           " --set dataset_prepared_path=" + (s.t.path / "prep").string() + " " + sets + " 2>" +
           (s.t.path / ("r" + std::to_string(r) + ".err")).string();
  };
  for (const std::string& diff : {std::string("save_steps=1"), std::string("lora_r=8 --set adapter=lora"),
                                  std::string("zero_stage=2"), std::string("learning_rate=0.1")}) {
    SCOPED_TRACE(diff);
    const std::string cmd = "(" + rank(0, "") + "; echo $? > " + (s.t.path / "c0").string() + ") & (" +
                            rank(1, "--set " + diff) + "; echo $? > " + (s.t.path / "c1").string() + "); wait";
    const auto t0 = Clock::now();
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
    for (int r = 0; r < 2; ++r) {
      const std::string err = read_text(s.t.path / ("r" + std::to_string(r) + ".err"));
      EXPECT_EQ(std::stoi(read_text(s.t.path / ("c" + std::to_string(r)))), 2) << err;
      EXPECT_NE(err.find("the ranks were started with different configs"), std::string::npos) << err;
    }
  }
}

TEST(RunIsolation, ASilentRankEndsTheJobNamingIt) {
  DpSetup s;
  const auto t0 = Clock::now();
  const CliRun r =
      run_bounded("sft " + (s.t.path / "base.yaml").string() + " --set output_dir=" + (s.t.path / "stopped").string() +
                      " --gpus 2 --set gradient_accumulation_steps=1 --set ddp_timeout=2",
                  s.t, 60, "SOLTRAIN_TEST_RANK_FAULT=1:1:stop");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("rank 0: error: rank 1 sent nothing for 2 s (ddp_timeout)"), std::string::npos) << r.err;
  // The launcher names it too (as it does when NCCL's watchdog, which cannot tell who is silent, ends rank 0).
  EXPECT_NE(r.err.find("error: rank 1 did not stop within"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("of the failure (it is stopped: SIGSTOP): killed"), std::string::npos) << r.err;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
}

// Ranks started as torchrun starts them (no soltrain launcher): when rank 1 is killed, rank 0 says so in one
// line and exits 2 (RankFailure), as for any failure that is not its own.
TEST(RunIsolation, ASurvivingRankExits2NamingTheOneThatDied) {
  DpSetup s;
  const std::string port = std::to_string(free_tcp_port());
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    const std::string cmd = "cd '" + s.t.path.string() + "' && exec env RANK=" + std::to_string(r) +
                            " LOCAL_RANK=" + std::to_string(r) +
                            " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
                            " SOLTRAIN_TEST_RANK_FAULT=1:1:kill " SOLTRAIN_BIN " sft " +
                            (s.t.path / "base.yaml").string() + " --set output_dir=" + (s.t.path / "out").string() +
                            " --set gradient_accumulation_steps=1 --set ddp_timeout=30 2>" +
                            (s.t.path / ("rank" + std::to_string(r) + ".log")).string();
    pids[r] = fork();
    if (pids[r] == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  const int survivor = exit_code(pids[0]), killed = exit_code(pids[1]);
  EXPECT_EQ(killed, 128 + SIGKILL);
  EXPECT_EQ(survivor, 2) << read_text(s.t.path / "rank0.log");
  const std::string log = read_text(s.t.path / "rank0.log");
  EXPECT_NE(log.find("rank 0: error: rank 1 stopped"), std::string::npos) << log;
  size_t errors = 0;
  for (size_t at = log.find("error:"); at != std::string::npos; at = log.find("error:", at + 1)) ++errors;
  EXPECT_EQ(errors, 1u) << log;
}

// auto_resume: a job whose rank died restarts by itself from its last complete checkpoint and finishes the
// model an uninterrupted run saves (2 ranks, and 1 under the launcher).
TEST(RunIsolation, AutoResumeFinishesAJobWhoseRankDied) {
  DpSetup s;
  for (const int gpus : {2, 1}) {
    SCOPED_TRACE(gpus);
    const std::string run = "--gpus " + std::to_string(gpus) +
                            " --set gradient_accumulation_steps=1 --set max_steps=12 --set save_steps=2 ";
    const std::string ref = "ref" + std::to_string(gpus), out = "auto" + std::to_string(gpus);
    ASSERT_EQ(s.sft(0, ref, run).code, 0);
    const fs::path marker = s.t.path / ("fired" + std::to_string(gpus));
    const CliRun r = run_bounded(
        "sft " + (s.t.path / "base.yaml").string() + " --set output_dir=" + (s.t.path / out).string() + " " + run +
            "--set auto_resume=true",
        s.t, 120,
        "SOLTRAIN_TEST_RANK_FAULT=" + std::to_string(gpus - 1) + ":7:kill SOLTRAIN_TEST_FAULT_ONCE=" + marker.string());
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(fs::exists(marker)) << "the fault never fired";
    EXPECT_NE(r.err.find("auto_resume: rank " + std::to_string(gpus - 1) + " was killed by signal 9"),
              std::string::npos)
        << r.err;
    // From checkpoint-6, or -4 when the kill came before -6's background write was whole.
    EXPECT_TRUE(r.err.find("checkpoint-6 (restart 1 of 3)") != std::string::npos ||
                r.err.find("checkpoint-4 (restart 1 of 3)") != std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
    EXPECT_EQ(read_text(s.t.path / out / "model" / "model.safetensors"),
              read_text(s.t.path / ref / "model" / "model.safetensors"));
  }
  // Bad input is not restarted: it would fail the same way again.
  const CliRun bad = s.sft(0, "bad", "--gpus 2 --set auto_resume=true --set learning_rate=-1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err.find("restarting"), std::string::npos) << bad.err;
}

// skip_bad_batches over ranks: a NaN seen by rank 1 alone after update 7 stops neither rank apart from the other;
// both restore checkpoint-4, replay to find update 7, and train on without its batches, finishing all 10 updates
// with the uninterrupted job's losses before it (with skip_bad_batches: 0 the job stops in one line, exit 2).
TEST(RunIsolation, RanksRecoverFromANanTogether) {
  DpSetup s;
  const std::string run =
      "--gpus 2 --set zero_stage=2 --set gradient_accumulation_steps=1 --set max_steps=10 "
      "--set save_steps=4 --set logging_steps=5 ";
  ASSERT_EQ(s.sft(0, "ref", run + "--set logging_steps=1").code, 0);
  const CliRun r = run_bounded(
      "sft " + (s.t.path / "base.yaml").string() + " --set output_dir=" + (s.t.path / "nan").string() + " " + run, s.t,
      120, "SOLTRAIN_TEST_NAN_STEP=1:7");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("step 8: training diverged at step 8 (loss nan)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checkpoint-4 to find the update that diverged"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step 7: skipped"), std::string::npos) << r.err;
  const auto ref = s.losses("ref"), got = s.losses("nan");
  EXPECT_TRUE(got.count(10)) << "the job trained to the end";
  for (const auto& [step, loss] : got) {
    EXPECT_TRUE(std::isfinite(loss)) << step;
    EXPECT_NE(step, 7) << "update 7 was skipped";
    if (step < 7) {
      EXPECT_EQ(loss, ref.at(step)) << step;
    }
  }
  const CliRun stop =
      run_bounded("sft " + (s.t.path / "base.yaml").string() + " --set output_dir=" + (s.t.path / "stop").string() +
                      " " + run + "--set skip_bad_batches=0",
                  s.t, 120, "SOLTRAIN_TEST_NAN_STEP=1:7");
  EXPECT_EQ(stop.code, 2) << stop.err;
  EXPECT_NE(stop.err.find("training diverged at step 8"), std::string::npos) << stop.err;
}

TEST(RunIsolation, ImpossibleWorkerCountsAreOneLine) {
  DpSetup s;
  expect_refused(s.sft(0, "many", "--gpus 1000"), "CPU ranks (device: cpu)");
  EXPECT_FALSE(fs::exists(s.t.path / "many"));
}

TEST(RunIsolation, HangupSavesACheckpointAsTermDoes) {
  DpSetup s;
  const fs::path dir = s.t.path / "hup";
  const pid_t a = spawn_launcher(s, "hup", "--set max_steps=100000 --set logging_steps=1", s.t.path / "hup.log");
  ASSERT_TRUE(wait_for_a_step(dir)) << read_text(s.t.path / "hup.log");
  ASSERT_EQ(::kill(a, SIGHUP), 0);
  EXPECT_EQ(exit_code(a), 130) << read_text(s.t.path / "hup.log");
  bool saved = false;
  for (const auto& e : fs::directory_iterator(dir))
    saved = saved || e.path().filename().string().starts_with("checkpoint-");
  EXPECT_TRUE(saved) << read_text(s.t.path / "hup.log");
}

TEST(RunIsolation, AFileSizeLimitIsOneLineNotASignal) {
  DpSetup s;
  const std::string cmd = "ulimit -f 64; exec " SOLTRAIN_BIN " sft " + (s.t.path / "base.yaml").string() +
                          " --set output_dir=" + (s.t.path / "fsz").string() + " --set save_steps=1 >" +
                          (s.t.path / "o").string() + " 2>" + (s.t.path / "e").string();
  const int status = std::system(("bash -c '" + cmd + "'").c_str());
  const CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_text(s.t.path / "o"),
                 read_text(s.t.path / "e")};
  expect_refused(r, "File too large");
  EXPECT_EQ(leftovers(s.t.path), "");
}

TEST(RunIsolation, GenerateIntoAFullDiskOrAClosedPipeIsOneLine) {
  DpSetup s;
  const std::string gen = SOLTRAIN_BIN " generate --model " + (s.t.path / "model").string() +
                          " --prompt abc --max-new-tokens 64 --print-ids --device cpu";
  const int f = std::system(("bash -c '" + gen + " >/dev/full 2>" + (s.t.path / "e1").string() + "'").c_str());
  EXPECT_EQ(WIFEXITED(f) ? WEXITSTATUS(f) : -1, 2);
  EXPECT_EQ(read_text(s.t.path / "e1").rfind("error: stdout: write failed", 0), 0u) << read_text(s.t.path / "e1");
  EXPECT_EQ(lines_of(read_text(s.t.path / "e1")), 1) << read_text(s.t.path / "e1");
  // A reader that went away (| head -c1 after its byte): a pipe whose read end is closed before the start.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::execl("/bin/sh", "sh", "-c", (gen + " 2>" + (s.t.path / "e2").string()).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  EXPECT_EQ(exit_code(pid), 2) << read_text(s.t.path / "e2");
  EXPECT_EQ(read_text(s.t.path / "e2").rfind("error: stdout: write failed (Broken pipe)", 0), 0u)
      << read_text(s.t.path / "e2");
  EXPECT_EQ(lines_of(read_text(s.t.path / "e2")), 1) << read_text(s.t.path / "e2");
}

}  // namespace
}  // namespace soltrain::test
