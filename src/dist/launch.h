// How this process was launched and the communicator that follows from it: alone (world size 1), by
// mpirun / srun (MPI's environment), or with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT), which `gpus: N` also sets for the workers it starts.
#pragma once
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "kernels/ops.h"

namespace soltrain {

struct LaunchEnv {
  enum class Kind { Single, Mpi, Env } kind = Kind::Single;
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr;  // Env: where rank 0 listens for the rendezvous
  int master_port = 0;
  int timeout_s = 1800;  // ddp_timeout: the rendezvous and every host collective
};

// Reads the environment; UserError (one line) when torchrun's variables are incomplete or inconsistent.
LaunchEnv read_launch_env();

// CUDA ranks: selects GPU local_rank (before the backend is made); UserError when it is not visible.
void select_local_device(const LaunchEnv& env, Device device);
// The number of GPUs this process sees (0 in a CPU-only build).
int visible_gpus();

// The communicator for `env` on the backend `ops` (MPI or TCP for CPU ranks, NCCL for CUDA ranks; the
// single-process one at world size 1 unless `force` names one: "nccl" runs NCCL at world size 1 too).
std::unique_ptr<Communicator> make_communicator(const LaunchEnv& env, Ops& ops, const std::string& force = "");

// The prefix of every error line this process prints ("rank 3: " in a job of several ranks, else "").
const std::string& error_prefix();
void set_error_prefix(const std::string& p);
// Writes error_prefix() + `line` + "\n" to stderr in one write(2): the ranks of a job and their launcher share
// one stderr pipe, and a line streamed piece by piece interleaves with another process's line (seen in CI:
// "error: rank rank 2: 1 was killed by signal error: 9rank 1 stopped"). Writes up to PIPE_BUF are atomic.
void print_error_line(const std::string& line);

// Implementations (dist/*_communicator.cpp).
std::unique_ptr<Communicator> make_mpi_communicator();
std::unique_ptr<Communicator> make_tcp_communicator(const LaunchEnv& env);
#ifdef SOLTRAIN_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnv& env, Ops& ops);
#endif

}  // namespace soltrain
