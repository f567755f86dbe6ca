// `gpus: N` (or --gpus N): this process starts N workers, copies of itself with torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT), and waits for them. Their output
// is its output; when one fails the others stop within `grace_s` (or are killed), and the exit code is the
// failed worker's. A worker ends with its launcher (a kill -9 of it included).
#pragma once
#include <filesystem>
#include <optional>

#include "kernels/ops.h"

namespace soltrain {

// A TCP port on 127.0.0.1 the kernel says is free now (a rendezvous binds it a moment later).
int free_tcp_port();

// UserError when `n` workers need more GPUs than this process sees (device: cuda).
void check_worker_count(int n, Device device);
// The exit code of the job (0, 130 when stopped by a signal after a checkpoint, else the first failure's).
// `grace_s`: how long the others get to stop after a failure (a stopped or hung worker never does).
// With `auto_resume`, a job whose worker died (a signal, a crash; not bad input, exit 2) starts again from the
// newest complete checkpoint in output_dir, up to max_restarts times, saying why.
struct AutoResume {
  int max_restarts = 3;
  std::filesystem::path output_dir;
};
int launch_workers(int n, Device device, int grace_s = 60, const std::optional<AutoResume>& auto_resume = {});

}  // namespace soltrain
