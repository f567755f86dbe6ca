// Data-parallel runs from tests: a tiny model and dataset, `soltrain sft` under N MPI ranks or `--gpus N`
// workers, and a launcher started in a process group of its own (as a terminal runs it) for signal tests.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "data_test_util.h"
#include "inputs_guard.h"

namespace soltrain::test {

struct DpSetup {
  TempDir t;
  // experts > 0: the model is a Qwen3-MoE of that many experts (DemoModelShape)
  explicit DpSetup(int experts = 0) : DpSetup(tiny_shape(experts)) {}
  explicit DpSetup(const DemoModelShape& shape) {
    write_random_model(t.path / "model", shape, 7);
    write_reversal_dataset(t.path / "train.jsonl", 200, 8);
    write_text(t.path / "base.yaml",
               "model: model\ndatasets:\n  - path: train.jsonl\n    type: conversation\n"
               "sequence_len: 48\nper_device_train_batch_size: 2\nmax_steps: 3\nlearning_rate: 5.0e-3\n"
               "lr_scheduler_type: cosine\nwarmup_steps: 1\nweight_decay: 0.01\nmax_grad_norm: 0.5\nseed: 3\n"
               "logging_steps: 1\ndevice: cpu\n");
    guard.arm({t.path / "model", t.path / "train.jsonl"});
  }
  InputsGuard guard;
  static DemoModelShape tiny_shape(int experts) {
    DemoModelShape s;
    s.hidden = 32, s.layers = 3, s.heads = 2, s.kv_heads = 1, s.head_dim = 16, s.intermediate = 64;
    s.experts = experts;
    return s;
  }
  // `soltrain sft base.yaml` into output_dir `out` with these --set overrides, under `ranks` MPI ranks (0: no
  // mpirun at all).
  CliRun sft(int ranks, const std::string& out, const std::string& sets) const {
    std::string args = "sft " + (t.path / "base.yaml").string() + " --set output_dir=" + (t.path / out).string() +
                       " --set dataset_prepared_path=" + (t.path / ("prepared-" + out)).string() + " " + sets;
    if (ranks == 0) return run(args, t);
    const auto o = t.path / "stdout", e = t.path / "stderr";
    const std::string cmd =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " SOLTRAIN_MPIEXEC " --oversubscribe -np " +
        std::to_string(ranks) + " " SOLTRAIN_BIN " " + args + " >" + o.string() + " 2>" + e.string();
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(o), read(e)};
  }
  static std::string read(const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // step → loss (or another metric) of a run's metrics.jsonl
  std::map<int64_t, double> losses(const std::string& out, const std::string& key = "loss") const {
    std::map<int64_t, double> m;
    std::ifstream in(t.path / out / "metrics.jsonl");
    for (std::string l; std::getline(in, l);) {
      const auto j = nlohmann::json::parse(l);
      if (j.contains(key)) m[j["step"].get<int64_t>()] = j[key].get<double>();
    }
    return m;
  }
};

// `soltrain sft --gpus 2` in a process group of its own, as a terminal runs it, stderr to `log`.
inline pid_t spawn_launcher(const DpSetup& s, const std::string& out, const std::string& sets,
                            const std::filesystem::path& log) {
  const std::string cmd = std::string("exec " SOLTRAIN_BIN " sft ") + (s.t.path / "base.yaml").string() +
                          " --set output_dir=" + (s.t.path / out).string() +
                          " --set dataset_prepared_path=" + (s.t.path / ("prepared-" + out)).string() + " " + sets +
                          " 2>" + log.string();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // (both sides: whichever runs first)
  return pid;
}

}  // namespace soltrain::test
