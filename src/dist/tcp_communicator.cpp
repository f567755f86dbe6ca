// The TCP communicator: CPU ranks started with torchrun-style variables or by `gpus: N`, and the
// rendezvous NCCL ranks share their unique id through. Rank 0 listens on MASTER_PORT; every other rank
// connects to it and stays connected (a star). Collectives go through rank 0, which sums in rank order,
// so every rank gets the same bits. A rank that dies closes its socket: rank 0 sees it at its next
// collective and tells every other rank which rank failed before it stops itself.
#include "dist/tcp_communicator.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/launch.h"

namespace soltrain {

namespace {

// Every frame rank 0 sends starts with this: ok, or the rank that failed.
struct Header {
  int32_t failed_rank = -1;
};

}  // namespace

TcpCommunicator::TcpCommunicator(const LaunchEnv& env)
    : rank_(env.rank), size_(env.world_size), timeout_s_(env.timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s_);
  const std::string where = cat(env.master_addr, ":", env.master_port);
  if (rank_ == 0) {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
    const bool v6 = listen_fd_ >= 0;
    if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd_ < 0) throw std::runtime_error(cat("rendezvous: socket() failed: ", std::strerror(errno)));
    const int one = 1, zero = 0;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(uint16_t(env.master_port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(uint16_t(env.master_port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0 || ::listen(listen_fd_, size_) != 0)
      user_error("MASTER_PORT ", env.master_port, ": rank 0 cannot listen on it (", std::strerror(errno),
                 "): choose a free port");
    peers_.assign(size_t(size_), -1);
    for (int joined = 1; joined < size_;) {
      const int left = int(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      pollfd p{listen_fd_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, left) <= 0)
        throw RankFailure(cat("rendezvous: only ", joined, " of ", size_, " ranks reached ", where, " within ",
                              timeout_s_, " s (ddp_timeout)"));
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      int32_t hello[2] = {-1, -1};
      if (!read_all(fd, hello, sizeof hello, -1) || hello[0] <= 0 || hello[0] >= size_ || hello[1] != size_ ||
          peers_[size_t(hello[0])] >= 0) {
        ::close(fd);
        throw RankFailure(cat("rendezvous at ", where, ": a rank joined with rank ", hello[0], " of WORLD_SIZE ",
                              hello[1], " (this job: WORLD_SIZE ", size_, ", each rank once)"));
      }
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      peers_[size_t(hello[0])] = fd;
      ++joined;
    }
    return;
  }
  // Rank 0 may not listen yet: try until the deadline.
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(env.master_port);
  if (::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    user_error("MASTER_ADDR=", env.master_addr, ": cannot resolve this host name");
  while (master_fd_ < 0) {
    for (addrinfo* a = res; a && master_fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0)
        master_fd_ = fd;
      else
        ::close(fd);
    }
    if (master_fd_ >= 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::freeaddrinfo(res);
      throw RankFailure(
          cat("rendezvous: rank 0 did not answer at ", where, " within ", timeout_s_, " s (ddp_timeout)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(res);
  const int one = 1;
  ::setsockopt(master_fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int32_t hello[2] = {rank_, size_};
  write_all(master_fd_, hello, sizeof hello, 0);
}

TcpCommunicator::~TcpCommunicator() {
  // Rank 0 unwinding an error: tell the others (the failed rank, or itself) before the sockets close.
  if (rank_ == 0 && std::uncaught_exceptions() > 0) {
    const Header h{failed_rank_ >= 0 ? failed_rank_ : 0};
    for (int fd : peers_)
      if (fd >= 0) (void)!::send(fd, &h, sizeof h, MSG_NOSIGNAL);
  }
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
  if (master_fd_ >= 0) ::close(master_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool TcpCommunicator::read_all(int fd, void* p, size_t n, int peer) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    // A rank stopped (kill -STOP), hung or swapping sends nothing and closes nothing: without a bound the
    // whole job would wait forever with no word.
    // Rank 0 sees a silent rank first and tells the others which one it is: they wait on it 10 s longer.
    pollfd w{fd, POLLIN, 0};
    const int ready = ::poll(&w, 1, (timeout_s_ + (rank_ != 0 ? 10 : 0)) * 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (rank_ == 0 && peer > 0) failed_rank_ = peer;
      throw RankFailure(cat(peer < 0 ? std::string("a joining rank") : cat("rank ", peer), " sent nothing for ",
                            timeout_s_, " s (ddp_timeout): it is stopped, hung or far behind, and the job ends"));
    }
    const ssize_t got = ::recv(fd, b, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    b += got;
    n -= size_t(got);
  }
  return true;
}

void TcpCommunicator::write_all(int fd, const void* p, size_t n, int peer) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t put = ::send(fd, b, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) lost(peer);
    b += put;
    n -= size_t(put);
  }
}

void TcpCommunicator::lost(int peer) {
  if (rank_ == 0) failed_rank_ = peer;
  throw RankFailure(cat("rank ", peer, " stopped (its connection closed; its own error, if any, is above)"));
}

void TcpCommunicator::recv_from(int peer, void* p, size_t n) {
  if (!read_all(peers_[size_t(peer)], p, n, peer)) lost(peer);
}

void TcpCommunicator::recv_from_master(void* p, size_t n) {
  Header h;
  if (!read_all(master_fd_, &h, sizeof h, 0)) lost(0);
  if (h.failed_rank >= 0)
    throw RankFailure(h.failed_rank == 0 ? std::string("rank 0 failed (its error is above)")
                                         : cat("rank ", h.failed_rank, " stopped (its error, if any, is above)"));
  if (n > 0 && !read_all(master_fd_, p, n, 0)) lost(0);
}

void TcpCommunicator::send_to_all(const void* p, size_t n) {
  const Header h;
  for (int r = 1; r < size_; ++r) {
    write_all(peers_[size_t(r)], &h, sizeof h, r);
    write_all(peers_[size_t(r)], p, n, r);
  }
}

namespace {

void check_host(const Tensor& t, bool summed = true) {
  SOLTRAIN_CHECK(t.device == Device::CPU, "the TCP communicator takes host tensors (CUDA ranks use NCCL)");
  // (a gather moves bytes of any dtype: a sharded frozen base's codes and scales are U8)
  SOLTRAIN_CHECK(!summed || t.dtype == DType::F32 || t.dtype == DType::F64, "collectives sum F32 or F64");
}

template <typename T>
void reduce_into(void* acc, const std::vector<char>& x, int64_t n, bool max) {
  T* a = static_cast<T*>(acc);
  const T* b = reinterpret_cast<const T*>(x.data());
  for (int64_t i = 0; i < n; ++i) a[i] = max ? std::max(a[i], b[i]) : a[i] + b[i];
}

}  // namespace

void TcpCommunicator::all_reduce(Tensor t, bool max) {
  check_host(t);
  const size_t bytes = t.bytes();
  if (rank_ != 0) {
    write_all(master_fd_, t.data, bytes, 0);
    recv_from_master(t.data, bytes);
    return;
  }
  std::vector<char> x(bytes);
  for (int r = 1; r < size_; ++r) {  // in rank order: every run sums the same way
    recv_from(r, x.data(), bytes);
    if (t.dtype == DType::F32)
      reduce_into<float>(t.data, x, t.numel(), max);
    else
      reduce_into<double>(t.data, x, t.numel(), max);
  }
  send_to_all(t.data, bytes);
}

void TcpCommunicator::reduce_scatter_sum(Tensor out, const Tensor& in) {
  check_host(in);
  SOLTRAIN_CHECK(in.numel() == out.numel() * size_ && in.dtype == out.dtype);
  std::vector<char> all(in.bytes());
  std::memcpy(all.data(), in.data, in.bytes());
  all_reduce_sum(Tensor{all.data(), in.dtype, in.shape, Device::CPU});
  std::memcpy(out.data, all.data() + size_t(rank_) * out.bytes(), out.bytes());
}

void TcpCommunicator::all_gather(Tensor out, const Tensor& in) {
  check_host(in, /*summed=*/false);
  SOLTRAIN_CHECK(out.numel() == in.numel() * size_ && in.dtype == out.dtype);
  const size_t n = in.bytes();
  char* o = static_cast<char*>(out.data);
  if (rank_ != 0) {
    write_all(master_fd_, in.data, n, 0);
    recv_from_master(o, out.bytes());
    return;
  }
  std::memmove(o, in.data, n);
  for (int r = 1; r < size_; ++r) recv_from(r, o + size_t(r) * n, n);
  send_to_all(o, out.bytes());
}

void TcpCommunicator::broadcast(Tensor t, int root) {
  check_host(t);
  if (root != 0) {  // through rank 0
    if (rank_ == root) write_all(master_fd_, t.data, t.bytes(), 0);
    if (rank_ == 0) recv_from(root, t.data, t.bytes());
  }
  if (rank_ == 0)
    send_to_all(t.data, t.bytes());
  else
    recv_from_master(t.data, t.bytes());
}

void TcpCommunicator::barrier() {
  (void)all_max_host(0);
}

int64_t TcpCommunicator::all_max_host(int64_t v) {
  if (rank_ != 0) {
    write_all(master_fd_, &v, sizeof v, 0);
    recv_from_master(&v, sizeof v);
    return v;
  }
  for (int r = 1; r < size_; ++r) {
    int64_t x = 0;
    recv_from(r, &x, sizeof x);
    v = std::max(v, x);
  }
  send_to_all(&v, sizeof v);
  return v;
}

void TcpCommunicator::send_bytes_from_root(void* p, size_t n) {
  if (rank_ == 0)
    send_to_all(p, n);
  else
    recv_from_master(p, n);
}

std::unique_ptr<Communicator> make_tcp_communicator(const LaunchEnv& env) {
  return std::make_unique<TcpCommunicator>(env);
}

}  // namespace soltrain
