#include "train/python_process.h"

#include <unistd.h>

#include <cstdlib>

#include "core/error.h"

namespace soltrain {

std::string python_command() {
  const char* p = std::getenv("SOLTRAIN_PYTHON");
  return p && *p ? p : "python3";
}

PythonProcess start_python(const char* script, const std::string& what) {
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0)
    user_error(what, ": cannot start ", python_command(), " (pipe)");
  PythonProcess p;
  p.pid = ::fork();
  if (p.pid == 0) {
    ::dup2(to_child[0], 0), ::dup2(from_child[1], 1);
    ::close(to_child[1]), ::close(from_child[0]);
    const std::string py = python_command();
    ::execlp(py.c_str(), py.c_str(), "-c", script, nullptr);
    _exit(127);
  }
  ::close(to_child[0]), ::close(from_child[1]);
  p.in = ::fdopen(to_child[1], "w");
  p.out = from_child[0];
  return p;
}

}  // namespace soltrain
