// Which launch this is and the communicator that follows (dist/launch.h).
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "dist/launch.h"
#ifdef SOLTRAIN_CUDA
#include <cuda_runtime.h>
#endif

namespace soltrain {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int lo, int hi, const std::string& expected) {
  const char* v = env(name);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < lo || x > hi) user_error(name, "=", v, ": expected ", expected);
  return int(x);
}

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv e;
  // mpirun (OpenMPI), srun --mpi=pmix, MPICH's hydra: MPI_Init learns rank and size itself.
  if (env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_SIZE")) {
    e.kind = LaunchEnv::Kind::Mpi;
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (env(v)) {
        e.local_rank = env_int(v, 0, 1 << 20, "a number");
        break;
      }
    return e;
  }
  if (!env("RANK") && !env("WORLD_SIZE")) return e;
  // torchrun's variables (and what `gpus: N` sets for its workers).
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    if (!env(v))
      user_error(env("RANK") ? "RANK" : "WORLD_SIZE", " is set (a torchrun-style launch) but ", v,
                 " is not: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0's host and a free port) "
                 "for every rank, or launch with mpirun or `gpus: N`");
  e.kind = LaunchEnv::Kind::Env;
  e.world_size = env_int("WORLD_SIZE", 1, 1 << 20, "the number of ranks (1 or more)");
  e.rank = env_int("RANK", 0, e.world_size - 1,
                   cat("a rank in [0, ", e.world_size - 1, "] (WORLD_SIZE is ", e.world_size, ")"));
  e.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", 0, 1 << 20, "a number") : e.rank;
  e.master_addr = env("MASTER_ADDR");
  e.master_port = env_int("MASTER_PORT", 1, 65535, "a TCP port in [1, 65535]");
  return e;
}

int visible_gpus() {
#ifdef SOLTRAIN_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

void select_local_device(const LaunchEnv& e, Device device) {
  if (device != Device::CUDA) return;
#ifdef SOLTRAIN_CUDA
  const int n = visible_gpus();
  if (n == 0) user_error("device: cuda, but no CUDA GPU is visible (CUDA_VISIBLE_DEVICES, drivers): use device: cpu");
  if (e.local_rank >= n)
    user_error("local rank ", e.local_rank, " needs GPU ", e.local_rank, " but this process sees ", n,
               " GPU(s) (CUDA_VISIBLE_DEVICES): start at most ", n, " ranks per machine");
  if (cudaSetDevice(e.local_rank) != cudaSuccess) user_error("cannot use GPU ", e.local_rank);
#else
  (void)e;
#endif
}

std::unique_ptr<Communicator> make_communicator(const LaunchEnv& e, Ops& ops, const std::string& force) {
  const bool cuda = ops.device() == Device::CUDA;
#ifdef SOLTRAIN_NCCL
  if (cuda && (e.world_size > 1 || e.kind == LaunchEnv::Kind::Mpi || force == "nccl"))
    return make_nccl_communicator(e, ops);
#else
  if (force == "nccl") user_error("this soltrain was built without CUDA, so without NCCL");
#endif
  if (e.kind == LaunchEnv::Kind::Mpi || force == "mpi") {
    if (cuda) user_error("CUDA ranks need NCCL, and this soltrain was built without it");
    return make_mpi_communicator();
  }
  if (e.kind == LaunchEnv::Kind::Env && e.world_size > 1) {
    if (cuda) user_error("CUDA ranks need NCCL, and this soltrain was built without it");
    return make_tcp_communicator(e);
  }
  if (!force.empty() && force != "nccl" && force != "mpi")
    user_error("SOLTRAIN_COMMUNICATOR=", force, ": expected nccl or mpi");
  return make_single_communicator();
}

}  // namespace soltrain
