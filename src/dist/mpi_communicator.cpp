// The MPI communicator: CPU ranks launched by mpirun (or srun with PMIx). Collectives run at once on host
// memory, as the CPU backend runs every op. A rank that dies or exits with an error has not called
// MPI_Finalize, so mpirun ends the others and names it.
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "core/error.h"
#include "dist/launch.h"

namespace soltrain {

namespace {

MPI_Datatype mpi_type(const Tensor& t) {
  SOLTRAIN_CHECK(t.device == Device::CPU, "MPI collectives take host tensors (CUDA ranks use NCCL)");
  SOLTRAIN_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, "MPI collectives sum F32 or F64");
  return t.dtype == DType::F32 ? MPI_FLOAT : MPI_DOUBLE;
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(cat(call, " failed: ", std::string(text, size_t(len))));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) check(MPI_Init(nullptr, nullptr), "MPI_Init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  // A sub-communicator (split): freed with it; the world's finalises MPI.
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    // Unwinding an error: leave without MPI_Finalize (it would wait for ranks still in a collective);
    // mpirun sees a rank end without finalising and stops the others.
    if (std::uncaught_exceptions() != 0) return;
    if (comm_ != MPI_COMM_WORLD)
      MPI_Comm_free(&comm_);
    else
      MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  void all_reduce_sum(Tensor t) override {
    check(MPI_Allreduce(MPI_IN_PLACE, t.data, int(t.numel()), mpi_type(t), MPI_SUM, comm_), "MPI_Allreduce");
  }
  void all_reduce_max(Tensor t) override {
    check(MPI_Allreduce(MPI_IN_PLACE, t.data, int(t.numel()), mpi_type(t), MPI_MAX, comm_), "MPI_Allreduce");
  }
  // In place as NCCL is (the rank's own slice of the full buffer at rank·n), so the CPU ranks run the
  // data-parallel path's in-place branches too: MPI_IN_PLACE, with reduce-scatter's result moved from the
  // buffer's start (where MPI leaves it) to the rank's slice. The rest of a reduced buffer is left undefined,
  // as with NCCL.
  bool shards_in_place() const override { return true; }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(in.numel() == out.numel() * size_ && in.dtype == out.dtype);
    const size_t bytes = size_t(out.numel()) * dtype_size(out.dtype);
    if (out.data != static_cast<char*>(in.data) + size_t(rank_) * bytes) {
      check(MPI_Reduce_scatter_block(in.data, out.data, int(out.numel()), mpi_type(in), MPI_SUM, comm_),
            "MPI_Reduce_scatter_block");
      return;
    }
    check(MPI_Reduce_scatter_block(MPI_IN_PLACE, in.data, int(out.numel()), mpi_type(in), MPI_SUM, comm_),
          "MPI_Reduce_scatter_block");
    if (rank_ != 0) std::memmove(out.data, in.data, bytes);
  }
  void all_gather(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(out.numel() == in.numel() * size_ && in.dtype == out.dtype);
    const size_t bytes = size_t(in.numel()) * dtype_size(in.dtype);
    const bool in_place = in.data == static_cast<const char*>(out.data) + size_t(rank_) * bytes;
    // Moved, not summed: any dtype as its bytes (a sharded frozen base's codes and scales are U8).
    const bool raw = in.dtype != DType::F32 && in.dtype != DType::F64;
    const int count = int(raw ? bytes : size_t(in.numel()));
    SOLTRAIN_CHECK(in.device == Device::CPU, "MPI collectives take host tensors (CUDA ranks use NCCL)");
    const MPI_Datatype type = raw ? MPI_BYTE : mpi_type(in);
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data, in_place ? 0 : count, in_place ? MPI_DATATYPE_NULL : type,
                        out.data, count, type, comm_),
          "MPI_Allgather");
  }
  void broadcast(Tensor t, int root) override {
    check(MPI_Bcast(t.data, int(t.numel()), mpi_type(t), root, comm_), "MPI_Bcast");
  }
  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }
  int64_t all_max_host(int64_t v) override {
    long long x = v, out = 0;
    check(MPI_Allreduce(&x, &out, 1, MPI_LONG_LONG, MPI_MAX, comm_), "MPI_Allreduce");
    return out;
  }

  void all_to_all(Tensor out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                  const std::vector<int64_t>& send_rows) override {
    SOLTRAIN_CHECK(in.device == Device::CPU && out.device == Device::CPU, "MPI collectives take host tensors");
    SOLTRAIN_CHECK(int(send_rows.size()) == size_ && int(recv_rows.size()) == size_, "all_to_all: a count per rank");
    const int64_t rows_in = in.shape.empty() ? 0 : in.dim(0), rows_out = out.shape.empty() ? 0 : out.dim(0);
    const size_t row = rows_in ? in.bytes() / size_t(rows_in) : rows_out ? out.bytes() / size_t(rows_out) : 0;
    std::vector<int> sc(static_cast<size_t>(size_)), sd(static_cast<size_t>(size_)), rc(static_cast<size_t>(size_)),
        rd(static_cast<size_t>(size_));
    int64_t s_at = 0, r_at = 0;
    for (size_t q = 0; q < size_t(size_); ++q) {
      SOLTRAIN_CHECK((s_at + send_rows[q]) * int64_t(row) < (int64_t(1) << 31) &&
                         (r_at + recv_rows[q]) * int64_t(row) < (int64_t(1) << 31),
                     "all_to_all over MPI: at most 2 GiB a call");
      sc[q] = int(send_rows[q] * int64_t(row)), sd[q] = int(s_at * int64_t(row));
      rc[q] = int(recv_rows[q] * int64_t(row)), rd[q] = int(r_at * int64_t(row));
      s_at += send_rows[q], r_at += recv_rows[q];
    }
    SOLTRAIN_CHECK(s_at == rows_in && r_at == rows_out, "all_to_all: counts and tensors disagree");
    check(MPI_Alltoallv(in.data, sc.data(), sd.data(), MPI_BYTE, out.data, rc.data(), rd.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
  }
  std::unique_ptr<Communicator> split(int color) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, rank_, &sub), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace soltrain
