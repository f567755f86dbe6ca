// A python3 process (SOLTRAIN_PYTHON, else python3 on PATH) running a script compiled into the binary, with its
// stdin and stdout piped to us: how the experiment trackers (train/trackers.h) and GRPO's Python reward
// functions (train/grpo_rewards.h) run the user's Python libraries beside a run of the `soltrain` binary.
#pragma once
#include <sys/types.h>

#include <cstdio>
#include <string>

namespace soltrain {

std::string python_command();

struct PythonProcess {
  pid_t pid = -1;
  std::FILE* in = nullptr;  // the script's stdin
  int out = -1;             // the script's stdout
};

// Starts `python -c script`; `what` names the caller in the error when the pipes cannot be made.
PythonProcess start_python(const char* script, const std::string& what);

}  // namespace soltrain
