// Running the soltrain binary from tests: exit code, stdout and stderr of one command line.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "test_util.h"

namespace soltrain::test {

struct CliRun {
  int code;
  std::string out, err;
};

// Runs `soltrain ARGS` in t's folder (where a user runs it from: a peer's config resolves relative paths from
// there, and nothing lands in the build tree), its output captured in files under t.
inline CliRun run(const std::string& args, const TempDir& t) {
  const auto out = t.path / "stdout", err = t.path / "stderr";
  const std::string cmd = "cd '" + t.path.string() + "' && " + std::string(SOLTRAIN_BIN) + " " + args + " >" +
                          out.string() + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  auto read = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(out), read(err)};
}

}  // namespace soltrain::test
