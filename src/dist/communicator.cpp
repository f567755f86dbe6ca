#include "dist/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "dist/launch.h"

namespace soltrain {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "single"; }
  void all_reduce_sum(Tensor) override {}
  void all_reduce_max(Tensor) override {}
  void reduce_scatter_sum(Tensor out, const Tensor& in) override { same(out, in); }
  void all_gather(Tensor out, const Tensor& in) override { same(out, in); }
  void broadcast(Tensor, int root) override { SOLTRAIN_CHECK(root == 0); }
  void barrier() override {}
  int64_t all_max_host(int64_t v) override { return v; }

 private:
  static void same(Tensor out, const Tensor& in) {
    SOLTRAIN_CHECK(out.numel() == in.numel() && out.dtype == in.dtype);
    if (out.data == in.data) return;
    SOLTRAIN_CHECK(out.device == Device::CPU, "the single-process communicator copies host tensors only");
    std::memcpy(out.data, in.data, size_t(in.numel()) * dtype_size(in.dtype));
  }
};

}  // namespace

namespace {
std::string& prefix() {
  static std::string p;
  return p;
}
}  // namespace

const std::string& error_prefix() {
  return prefix();
}
void set_error_prefix(const std::string& p) {
  prefix() = p;
}
void print_error_line(const std::string& line) {
  const std::string all = prefix() + line + "\n";
  for (size_t done = 0; done < all.size();) {
    const ssize_t n = ::write(STDERR_FILENO, all.data() + done, all.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing else can report it
    done += size_t(n);
  }
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

namespace {
void check_rows(const Tensor& t, const std::vector<int64_t>& rows, int ranks, const char* what) {
  SOLTRAIN_CHECK(t.device == Device::CPU, "all_to_all takes host tensors");
  SOLTRAIN_CHECK(int(rows.size()) == ranks, "all_to_all: ", what, " has ", rows.size(), " counts for ", ranks,
                 " ranks");
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  SOLTRAIN_CHECK(!t.shape.empty() && t.dim(0) == total, "all_to_all: ", what, " counts ", total, " rows, the tensor ",
                 t.shape.empty() ? 0 : t.dim(0));
}

// A sub-group of a parent communicator (the default split): each collective is one of the parent's, every
// parent rank taking part at once. all_gather brings every parent rank's contribution; each rank keeps its
// members' (in their order, so sums repeat bit for bit).
class GroupCommunicator final : public Communicator {
 public:
  GroupCommunicator(Communicator& parent, std::vector<int> members, int rank)
      : parent_(parent), members_(std::move(members)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  const char* backend() const override { return parent_.backend(); }

  void all_reduce_sum(Tensor t) override { reduce(t, false); }
  void all_reduce_max(Tensor t) override { reduce(t, true); }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override {  // Σ of each member's in[rank·n ..]
    SOLTRAIN_CHECK(in.numel() == out.numel() * size() && in.dtype == out.dtype);
    const std::vector<char> all = gather(in);
    const size_t item = dtype_size(in.dtype), n = size_t(out.numel());
    std::vector<char> acc(n * item);  // (out may alias in)
    for (size_t i = 0; i < members_.size(); ++i)
      add(acc.data(), all.data() + (size_t(members_[i]) * size_t(in.numel()) + size_t(rank_) * n) * item, out.numel(),
          in.dtype, i == 0, false);
    std::memcpy(out.data, acc.data(), acc.size());
  }
  void all_gather(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(out.numel() == in.numel() * size() && in.dtype == out.dtype);
    const std::vector<char> all = gather(in);
    const size_t n = size_t(in.numel()) * dtype_size(in.dtype);
    for (size_t i = 0; i < members_.size(); ++i)
      std::memcpy(static_cast<char*>(out.data) + i * n, all.data() + size_t(members_[i]) * n, n);
  }
  void broadcast(Tensor t, int root) override {
    SOLTRAIN_CHECK(root >= 0 && root < size());
    const std::vector<char> all = gather(t);
    const size_t n = size_t(t.numel()) * dtype_size(t.dtype);
    std::memcpy(t.data, all.data() + size_t(members_[size_t(root)]) * n, n);
  }
  void barrier() override { parent_.barrier(); }
  int64_t all_max_host(int64_t v) override {
    double x = double(v);
    const std::vector<char> all = gather(Tensor{&x, DType::F64, {1}});
    const auto* vals = reinterpret_cast<const double*>(all.data());
    double m = vals[members_[0]];
    for (int r : members_) m = std::max(m, vals[r]);
    return int64_t(m);
  }

 private:
  // Every parent rank's t, in parent rank order.
  std::vector<char> gather(const Tensor& t) {
    SOLTRAIN_CHECK(t.device == Device::CPU, "a split communicator's collectives take host tensors");
    SOLTRAIN_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, "collectives take F32 or F64");
    std::vector<char> all(static_cast<size_t>(parent_.size()) * size_t(t.numel()) * dtype_size(t.dtype));
    Tensor out{all.data(), t.dtype, {int64_t(parent_.size()) * t.numel()}};
    parent_.all_gather(out, Tensor{t.data, t.dtype, {t.numel()}});
    return all;
  }
  static void add(char* dst, const char* src, int64_t n, DType dt, bool first, bool max) {
    auto run = [&](auto* d, const auto* s) {
      for (int64_t i = 0; i < n; ++i) d[i] = first ? s[i] : max ? std::max(d[i], s[i]) : d[i] + s[i];
    };
    if (dt == DType::F32)
      run(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src));
    else
      run(reinterpret_cast<double*>(dst), reinterpret_cast<const double*>(src));
  }
  void reduce(Tensor t, bool max) {
    const std::vector<char> all = gather(t);
    const size_t n = size_t(t.numel()) * dtype_size(t.dtype);
    for (size_t i = 0; i < members_.size(); ++i)
      add(static_cast<char*>(t.data), all.data() + size_t(members_[i]) * n, t.numel(), t.dtype, i == 0, max);
  }

  Communicator& parent_;
  std::vector<int> members_;  // parent ranks, in order
  int rank_;
};
}  // namespace

void Communicator::all_to_all(Tensor out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                              const std::vector<int64_t>& send_rows) {
  const int W = size();
  check_rows(in, send_rows, W, "send");
  check_rows(out, recv_rows, W, "receive");
  const size_t row = in.dim(0) ? in.bytes() / size_t(in.dim(0)) : out.dim(0) ? out.bytes() / size_t(out.dim(0)) : 0;
  SOLTRAIN_CHECK((in.dim(0) == 0 || in.bytes() / size_t(in.dim(0)) == row) &&
                     (out.dim(0) == 0 || out.bytes() / size_t(out.dim(0)) == row),
                 "all_to_all: rows of different widths");
  // Each rank's block: its W counts (as doubles, exact), then its rows; blocks padded to the largest, in F64
  // units so any dtype travels.
  const int64_t most = all_max_host(int64_t(in.bytes()));
  const size_t block = size_t(W) + (size_t(most) + 7) / 8;
  std::vector<double> mine(block, 0.0), all(block * size_t(W));
  for (int q = 0; q < W; ++q) mine[size_t(q)] = double(send_rows[size_t(q)]);
  if (in.bytes()) std::memcpy(mine.data() + W, in.data, in.bytes());
  all_gather(Tensor{all.data(), DType::F64, {int64_t(all.size())}}, Tensor{mine.data(), DType::F64, {int64_t(block)}});
  char* dst = static_cast<char*>(out.data);
  for (int q = 0; q < W; ++q) {
    const double* theirs = all.data() + size_t(q) * block;
    int64_t before = 0;
    for (int d = 0; d < rank(); ++d) before += int64_t(theirs[d]);
    const int64_t n = int64_t(theirs[rank()]);
    SOLTRAIN_CHECK(n == recv_rows[size_t(q)], "all_to_all: rank ", q, " sends ", n, " rows here, ",
                   recv_rows[size_t(q)], " expected");
    if (n) std::memcpy(dst, reinterpret_cast<const char*>(theirs + W) + size_t(before) * row, size_t(n) * row);
    dst += size_t(n) * row;
  }
}

std::unique_ptr<Communicator> Communicator::split(int color) {
  std::vector<double> colors(static_cast<size_t>(size()));
  double mine = color;
  all_gather(Tensor{colors.data(), DType::F64, {size()}}, Tensor{&mine, DType::F64, {1}});
  std::vector<int> members;
  int me = -1;
  for (int r = 0; r < size(); ++r)
    if (colors[size_t(r)] == mine) {
      if (r == rank()) me = int(members.size());
      members.push_back(r);
    }
  return std::make_unique<GroupCommunicator>(*this, std::move(members), me);
}

}  // namespace soltrain
