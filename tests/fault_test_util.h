// Fault-case helpers: what the user had (hashes of every file under a path) before and after a command,
// and the shape of a refusal (exit 2, exactly one `error:` line, in bounded time).
#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "data_test_util.h"
#include "inputs_guard.h"
#include "io/sha256.h"

namespace soltrain::test {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Relative path → content hash (folders as "dir"), for every entry under `root` (or `root` itself, a file).
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> out;
  if (fs::is_regular_file(root)) return {{".", sha256_file(root)}};
  for (const auto& e : fs::recursive_directory_iterator(root))
    out[fs::relative(e.path(), root).string()] = e.is_regular_file() ? sha256_file(e.path()) : "dir";
  return out;
}

// Leftovers of an interrupted write (".NAME.partial-PID", ".NAME.tmp-PID") anywhere under `root`.
inline std::string leftovers(const std::filesystem::path& root) {
  std::string found;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (n.find(".partial-") != std::string::npos || n.find(".tmp-") != std::string::npos)
      found += e.path().string() + " ";
  }
  return found;
}

// Runs a command that must finish within `max_seconds` (a hang is a failure, not a stuck CI job: the
// command runs under `timeout`).
// `env` ("NAME=value ...") is set for the command only.
inline CliRun run_bounded(const std::string& args, const TempDir& t, int max_seconds = 60,
                          const std::string& env = "") {
  const auto out = t.path / "stdout", err = t.path / "stderr";
  const std::string cmd = "cd '" + t.path.string() + "' && " + (env.empty() ? "" : "env " + env + " ") +
                          "timeout -k 5 " + std::to_string(max_seconds) + " " + std::string(SOLTRAIN_BIN) + " " + args +
                          " >" + out.string() + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  auto read = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  EXPECT_NE(code, 124) << "timed out after " << max_seconds << " s: " << args;
  return {code, read(out), read(err)};
}

// A refusal of bad input: exit 2 and exactly one line starting with "error: " that contains `needle`
// (progress lines before it are allowed), no internal error.
inline void expect_refused(const CliRun& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.err;
  int errors = 0;
  std::string line, error_line;
  for (size_t b = 0; b < r.err.size();) {
    size_t e = r.err.find('\n', b);
    if (e == std::string::npos) e = r.err.size();
    line = r.err.substr(b, e - b);
    if (line.find("error") != std::string::npos) ++errors, error_line = line;
    b = e + 1;
  }
  EXPECT_EQ(errors, 1) << r.err;
  EXPECT_EQ(error_line.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(error_line.find(needle), std::string::npos) << "expected '" << needle << "' in: " << error_line;
}

// A tiny model (byte tokenizer) and a small conversation dataset in a temporary folder, for sft/pt runs.
struct TinyRun {
  TempDir t;
  TinyRun() {
    DemoModelShape s;
    s.hidden = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.head_dim = 16, s.intermediate = 64;
    write_random_model(t.path / "model", s, 7);
    write_reversal_dataset(t.path / "train.jsonl", 20, 8);
    guard.arm({t.path / "model", t.path / "train.jsonl"});  // whatever the test runs, they stay as they are
  }
  InputsGuard guard;
  void inputs_changed() { guard.changed_on_purpose(); }
  // c.yaml: the dataset, sequence_len 64, one step, plus `body`; returns its path.
  std::string config(const std::string& body) const {
    write_text(
        t.path / "c.yaml",
        yaml_with("datasets: [{path: train.jsonl, type: conversation}]\nsequence_len: 64\nmax_steps: 1\n", body));
    return (t.path / "c.yaml").string();
  }
};

}  // namespace soltrain::test
