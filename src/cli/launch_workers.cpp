#include "cli/launch_workers.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/process_state.h"
#include "dist/launch.h"
#include "train/train_checkpoint.h"

namespace soltrain {

namespace {

std::vector<pid_t> g_workers;

extern "C" void forward_signal(int sig) {
  for (pid_t p : g_workers)
    if (p > 0) ::kill(p, sig);
}

std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  return args;
}

}  // namespace

// A port the kernel says is free now (the workers' rendezvous binds it a moment later).
int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error(cat("cannot find a free TCP port: ", std::strerror(errno)));
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

void check_worker_count(int n, Device device) {
  if (device != Device::CUDA) {
    // CPU ranks past the cores only contend for them; a typo of gpus: 1000 must not fork 1000 trainers.
    const int most = std::max(8, int(std::thread::hardware_concurrency()));
    if (n > most)
      user_error("gpus: ", n, " CPU ranks (device: cpu) on a machine of ", std::thread::hardware_concurrency(),
                 " cores: use gpus: ", most, " or fewer");
    return;
  }
  const int seen = visible_gpus();
  if (seen == 0) user_error("gpus: ", n, " with device: cuda, but no CUDA GPU is visible: use device: cpu");
  if (n > seen)
    user_error("gpus: ", n, " but this machine shows ", seen, " GPU(s) (CUDA_VISIBLE_DEVICES): use gpus: ", seen,
               " or fewer");
}

namespace {

struct WorkersOutcome {
  int code = 0;
  bool restartable = false;  // a worker died by a signal or crashed (not only bad input, exit 2)
  std::string why;           // the first failure, for the restart's note
};

WorkersOutcome run_workers(int n, Device device, int grace_s, const std::vector<std::string>& extra_args) {
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string port = port_env && *port_env ? port_env : std::to_string(free_tcp_port());
  std::vector<std::string> args = own_arguments();
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cerr << "launching " << n << " workers (" << device_name(device) << " ranks, rendezvous 127.0.0.1:" << port
            << ")" << std::endl;
  g_workers.assign(size_t(n), 0);
  // Ctrl-C reaches the workers from the terminal (one process group); a SIGTERM to this process is passed on.
  struct sigaction sa = {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGINT, SIG_IGN);
  const pid_t launcher = ::getpid();
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(cat("fork failed: ", std::strerror(errno)));
    if (pid == 0) {
      // A worker ends with its launcher: a kill -9 of the launcher sends it SIGTERM, so it stops as for
      // Ctrl-C (saving a checkpoint) instead of training on beside a rerun. Checked once more after the
      // call, in case the launcher died before it.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) _exit(130);
      signal(SIGINT, SIG_DFL);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    g_workers[size_t(r)] = pid;
  }
  WorkersOutcome out;
  int& code = out.code;
  int running = n;
  bool failed = false;
  int why_weight = 0;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, failed ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {  // a worker failed: the others get grace_s to stop on their own
      if (std::chrono::steady_clock::now() > deadline) {
        for (int r = 0; r < n; ++r)
          if (g_workers[size_t(r)] > 0) {
            print_error_line(
                cat("error: rank ", r, " did not stop within ", grace_s, " s of the failure",
                    std::tolower(process_state(g_workers[size_t(r)])) == 't' ? " (it is stopped: SIGSTOP)" : "",
                    ": killed"));
            ::kill(g_workers[size_t(r)], SIGKILL);
          }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < n; ++r)
      if (g_workers[size_t(r)] == pid) rank = r, g_workers[size_t(r)] = 0;
    --running;
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    // Why the job failed: the root cause over its echoes. A rank that another's death stopped exits with 2
    // (RankFailure), and may be reaped first; a killed or crashed rank is the cause.
    auto because = [&](int weight, std::string why) {
      if (weight > why_weight) out.why = std::move(why), why_weight = weight;
    };
    if (WIFSIGNALED(status)) {
      const std::string line =
          cat("rank ", rank, " was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
      print_error_line("error: " + line);
      because(3, line);
    }
    if (rc != 0 && rc != 130 && rc != 2) out.restartable = true;
    if (rc != 0 && rc != 130) because(rc == 2 ? 1 : 2, cat("rank ", rank, " exited with code ", rc));
    if (rc != 0 && rc != 130 && !failed) {
      failed = true;
      code = rc;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
    } else if (rc == 130 && code == 0) {
      code = 130;
    }
  }
  g_workers.clear();
  return out;
}

}  // namespace

int launch_workers(int n, Device device, int grace_s, const std::optional<AutoResume>& auto_resume) {
  check_worker_count(n, device);
  std::vector<std::string> extra;
  for (int restart = 1;; ++restart) {
    const WorkersOutcome o = run_workers(n, device, grace_s, extra);
    if (o.code == 0 || o.code == 130 || !auto_resume || !o.restartable) return o.code;
    if (restart > auto_resume->max_restarts) {
      print_error_line(cat("error: auto_resume: ", o.why, "; not restarting again after ", auto_resume->max_restarts,
                           " restarts (max_restarts)"));
      return o.code;
    }
    if (device == Device::CUDA) n = std::min(n, visible_gpus());  // a GPU that fell off the bus is not waited for
    if (n == 0) return o.code;
    const auto done = list_checkpoints(auto_resume->output_dir);
    std::cerr << "auto_resume: " << o.why << "; restarting " << n << " workers from "
              << (done.empty() ? std::string("the start (no checkpoint yet)") : done.back().string()) << " (restart "
              << restart << " of " << auto_resume->max_restarts << ")" << std::endl;
    extra = {"--set", "resume_from_checkpoint=true"};
  }
}

}  // namespace soltrain
