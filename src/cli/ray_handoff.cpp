#include "cli/ray_handoff.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace soltrain {

namespace {

// The exit code of `argv` run to the end (127: it could not start).
int run_to_end(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t quiet;  // (its import errors are ours to say, in one line)
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&quiet, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &quiet, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&quiet);
  if (err != 0) return 127;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace

void hand_to_ray(const std::string& config, const std::vector<std::string>& set, TrainMode mode) {
  if (mode != TrainMode::kSft && mode != TrainMode::kPretrain)
    user_error("a Ray job (use_ray, distributed) runs sft and pt for now");
  const char* given = std::getenv("SOLTRAIN_PYTHON");
  const std::string python = given && *given ? given : "python3";
  if (run_to_end({python, "-c", "import soltrain.ray, ray"}) != 0)
    user_error(
        "this config is a Ray job (use_ray, distributed), started by soltrain's Python package with Ray "
        "installed (pip install \".[ray]\"); ",
        python, " cannot import soltrain.ray and ray (SOLTRAIN_PYTHON names another interpreter)");
  std::vector<std::string> args = {python, "-m", "soltrain.ray", mode == TrainMode::kSft ? "sft" : "pt", config};
  for (const std::string& s : set) args.insert(args.end(), {"--set", s});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  user_error("a Ray job (use_ray, distributed): cannot start ", python, " (", std::strerror(errno), ")");
}

}  // namespace soltrain
