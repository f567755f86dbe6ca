// The TCP communicator (a star through rank 0) for CPU ranks launched with torchrun-style variables or
// `gpus: N`; also the rendezvous the NCCL communicator shares its unique id through.
#pragma once
#include <cstddef>
#include <vector>

#include "dist/communicator.h"

namespace soltrain {

struct LaunchEnv;

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(const LaunchEnv& env);  // the rendezvous: returns once every rank has joined
  ~TcpCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "tcp"; }
  void all_reduce_sum(Tensor t) override { all_reduce(t, false); }
  void all_reduce_max(Tensor t) override { all_reduce(t, true); }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override;
  void all_gather(Tensor out, const Tensor& in) override;
  void broadcast(Tensor t, int root) override;
  void barrier() override;
  int64_t all_max_host(int64_t v) override;
  // Rank 0's n bytes at p to every rank (the NCCL unique id).
  void send_bytes_from_root(void* p, size_t n);

 private:
  void all_reduce(Tensor t, bool max);  // Σ, or the largest, over ranks: through rank 0, in rank order
  // False when the peer closed; RankFailure naming `peer` when it sent nothing for timeout_s_.
  bool read_all(int fd, void* p, size_t n, int peer);
  void write_all(int fd, const void* p, size_t n, int peer);
  [[noreturn]] void lost(int peer);
  void recv_from(int peer, void* p, size_t n);
  void recv_from_master(void* p, size_t n);
  void send_to_all(const void* p, size_t n);

  int rank_, size_;
  int listen_fd_ = -1, master_fd_ = -1;
  std::vector<int> peers_;  // rank 0: a socket per rank (index 0 unused)
  int failed_rank_ = -1;
  int timeout_s_;  // LaunchEnv::timeout_s (ddp_timeout)
};

}  // namespace soltrain
