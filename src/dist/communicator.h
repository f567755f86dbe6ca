// The ranks of a data-parallel job and the collectives between them. One process per rank (per GPU);
// every rank calls the same collectives in the same order with the same sizes. Implementations: a single
// process (world size 1, no library), MPI (CPU ranks; mpirun / srun launch), TCP (CPU ranks started with
// torchrun-style variables or `gpus: N`), and NCCL (CUDA ranks, built with SOLTRAIN_CUDA).
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace soltrain {

// Another rank failed or went away: this one stops too (the CLI prints it and exits 1).
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "single", "mpi", "tcp", "nccl"

  // Collectives on tensors of the training device (F32 or F64; sums). Ordering: they are queued on
  // Ops::Stream::Side (NCCL: on that stream's cudaStream_t; the CPU implementations run them at once,
  // as the CPU backend runs every op). The caller orders them against compute with Ops events: before,
  // ops.wait(Side, Main) so they read finished gradients; after, ops.wait(Main, Side) before anything
  // on Main reads what they wrote. A failure of any rank ends every rank with an error naming it.
  virtual void all_reduce_sum(Tensor t) = 0;  // in place, Σ over ranks
  virtual void all_reduce_max(Tensor t) = 0;  // in place, the largest over ranks, element by element (F32)
  virtual void reduce_scatter_sum(Tensor out,
                                  const Tensor& in) = 0;  // in [size·n] → out [n]: Σ of every rank's in[rank·n ..]
  virtual void all_gather(Tensor out, const Tensor& in) = 0;  // in [n] → out [size·n], rank r's at r·n
  virtual void broadcast(Tensor t, int root) = 0;             // in place, from `root`
  // Whether reduce_scatter_sum and all_gather may work in place on one full buffer: out (or in) being the
  // rank's own slice of in (or out), at rank·n, as NCCL allows. Saves the staging copies around them.
  virtual bool shards_in_place() const { return false; }
  // Host side (a sync): returns once every rank has called it.
  virtual void barrier() = 0;
  // Host side (a sync): the largest of every rank's `v` (fault and stop flags, counts).
  virtual int64_t all_max_host(int64_t v) = 0;

  // Rows to and from every rank: `in` [Σ send_rows, width] holds send_rows[q] rows for rank q, in rank order;
  // `out` [Σ recv_rows, width] receives recv_rows[q] rows from each q, in rank order (what q sends this rank:
  // checked). Host tensors of any dtype (Mixture-of-Experts tokens to their experts' ranks and back). This
  // default gathers every rank's send buffer (padded to the largest) and keeps its own rows: correct on every
  // backend, O(ranks × data); MPI overrides it with MPI_Alltoallv.
  virtual void all_to_all(Tensor out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                          const std::vector<int64_t>& send_rows);
  // The ranks that pass the same `color` as a communicator of their own, ranked as here (expert-parallel groups
  // and their data-parallel replicas). Every rank calls it, in the same order. This default runs each of the
  // group's collectives as one of this communicator's (every rank at once, each within its own group, equal
  // sizes in every group), so this one must outlive it; MPI overrides it with MPI_Comm_split.
  virtual std::unique_ptr<Communicator> split(int color);
};

// World size 1: every collective is the identity (all_gather / reduce_scatter copy).
std::unique_ptr<Communicator> make_single_communicator();

}  // namespace soltrain
