// Sub-communicators (Communicator::split) and all_to_all on real CPU ranks: this test binary re-run as 4 MPI
// ranks (MPI_Comm_split, MPI_Alltoallv) and as 4 TCP ranks (the default split over the parent's collectives, the
// default all_to_all over its all_gather). Each rank checks every collective of two splits (interleaved and
// contiguous pairs, a split of a split) and all_to_all with uneven, empty and rank-dependent counts against
// values it computes itself, and expert parallelism's exchange over both kinds of group; the outer test sees every
// rank end with 0.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/launch_workers.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "kernels/ops.h"
#include "model/expert_parallel.h"

namespace soltrain::test {
namespace {

constexpr int kRanks = 4;

// Rows rank `from` sends rank `to`: uneven, some empty; row k of them holds from·1000 + to·100 + k (+0.5 in its
// second column), so a row in the wrong place is seen.
int64_t rows_between(int from, int to) {
  return (from * 3 + to * 2) % 4;
}

void check_all_to_all(Communicator& c, int width) {
  const int W = c.size(), me = c.rank();
  std::vector<int64_t> send(static_cast<size_t>(W)), recv(static_cast<size_t>(W));
  int64_t ns = 0, nr = 0;
  for (int q = 0; q < W; ++q) {
    ns += send[size_t(q)] = rows_between(me, q);
    nr += recv[size_t(q)] = rows_between(q, me);
  }
  std::vector<float> in(static_cast<size_t>(ns * width)), out(static_cast<size_t>(nr * width), -1.0f);
  float* p = in.data();
  for (int q = 0; q < W; ++q)
    for (int64_t k = 0; k < send[size_t(q)]; ++k)
      for (int w = 0; w < width; ++w) *p++ = float(me * 1000 + q * 100 + k) + (w == 1 ? 0.5f : 0.0f);
  c.all_to_all(Tensor{out.data(), DType::F32, {nr, width}}, recv, Tensor{in.data(), DType::F32, {ns, width}}, send);
  const float* o = out.data();
  for (int q = 0; q < W; ++q)
    for (int64_t k = 0; k < recv[size_t(q)]; ++k)
      for (int w = 0; w < width; ++w)
        ASSERT_EQ(*o++, float(q * 1000 + me * 100 + k) + (w == 1 ? 0.5f : 0.0f)) << "from " << q << " row " << k;
}

// Every collective of a group whose members are `members` (world ranks, in order).
void check_group(Communicator& g, const std::vector<int>& members, int world_rank) {
  const int n = int(members.size());
  ASSERT_EQ(g.size(), n);
  ASSERT_EQ(members[size_t(g.rank())], world_rank);
  std::vector<float> t = {float(world_rank), float(world_rank * 10 + 1)};
  g.all_reduce_sum(Tensor{t.data(), DType::F32, {2}});
  float s0 = 0, s1 = 0;
  for (int m : members) s0 += float(m), s1 += float(m * 10 + 1);
  EXPECT_EQ(t, (std::vector<float>{s0, s1}));
  std::vector<double> mx = {double(world_rank % 3)};
  g.all_reduce_max(Tensor{mx.data(), DType::F64, {1}});
  double want = 0;
  for (int m : members) want = std::max(want, double(m % 3));
  EXPECT_EQ(mx[0], want);
  std::vector<float> mine = {float(world_rank) + 0.25f}, all(static_cast<size_t>(n));
  g.all_gather(Tensor{all.data(), DType::F32, {n}}, Tensor{mine.data(), DType::F32, {1}});
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[size_t(i)], float(members[size_t(i)]) + 0.25f);
  std::vector<float> full(static_cast<size_t>(n * 2)), part(2);
  for (int i = 0; i < n * 2; ++i) full[size_t(i)] = float(world_rank * 100 + i);
  g.reduce_scatter_sum(Tensor{part.data(), DType::F32, {2}}, Tensor{full.data(), DType::F32, {n * 2}});
  for (int j = 0; j < 2; ++j) {
    float w = 0;
    for (int m : members) w += float(m * 100 + g.rank() * 2 + j);
    EXPECT_EQ(part[size_t(j)], w);
  }
  std::vector<double> b = {double(world_rank) * 7};
  g.broadcast(Tensor{b.data(), DType::F64, {1}}, n - 1);
  EXPECT_EQ(b[0], double(members.back()) * 7);
  int64_t most = 0;
  for (int m : members) most = std::max<int64_t>(most, 5 - m);
  EXPECT_EQ(g.all_max_host(5 - world_rank), most);
  g.barrier();
  check_all_to_all(g, 3);
}

// Expert parallelism's exchange (model/expert_parallel.h) over group `g` (world ranks `members`), 8 experts: each
// rank's pairs, sorted by expert, count pairs_of(rank, e) for expert e (uneven, some empty), row k of them holding
// rank·1000 + e·10 + k. Each rank must receive its experts' rows ordered by expert, then by sending rank, then as
// sent; send_back must return every row to its place; the load figure is max/mean of the rows received.
int64_t pairs_of(int rank, int e) {
  return (rank * 5 + e * 3) % 4;
}

void check_expert_parallel(std::unique_ptr<Communicator> g, const std::vector<int>& members, int world_rank) {
  constexpr int E = 8;
  const int P = g->size(), me = g->rank(), El = E / P;
  auto cpu = make_cpu_ops();
  Ops& ops = *cpu;
  ExpertParallel ep(std::move(g), E, /*num_layers=*/2);
  std::vector<int32_t> offsets = {0};
  std::vector<float> pairs;
  for (int e = 0; e < E; ++e) {
    for (int64_t k = 0; k < pairs_of(world_rank, e); ++k) pairs.push_back(float(world_rank * 1000 + e * 10 + k));
    offsets.push_back(int32_t(pairs.size()));
  }
  const int64_t M = int64_t(pairs.size());
  ep.plan(1, Tensor{offsets.data(), DType::I32, {E + 1}, Device::CPU});
  // what this rank must receive, by the definition above
  std::vector<float> want;
  std::vector<int32_t> want_offsets = {0};
  for (int e = me * El; e < (me + 1) * El; ++e) {
    for (int q : members)
      for (int64_t k = 0; k < pairs_of(q, e); ++k) want.push_back(float(q * 1000 + e * 10 + k));
    want_offsets.push_back(int32_t(want.size()));
  }
  ASSERT_EQ(ep.first_expert(), me * El);
  ASSERT_EQ(ep.received(1), int64_t(want.size()));
  const Tensor lo = ep.local_offsets(1);
  EXPECT_EQ(std::vector<int32_t>(lo.i32(), lo.i32() + lo.numel()), want_offsets);
  std::vector<float> got(want.size(), -1.0f);
  ep.dispatch(ops, 1, Tensor{got.data(), DType::F32, {int64_t(got.size()), 1}, Device::CPU},
              Tensor{pairs.data(), DType::F32, {M, 1}, Device::CPU});
  EXPECT_EQ(got, want);
  for (float& x : got) x = 2 * x + 1;  // "the experts' outputs"
  std::vector<float> back(pairs.size(), -1.0f);
  ep.send_back(ops, 1, Tensor{back.data(), DType::F32, {M, 1}, Device::CPU},
               Tensor{got.data(), DType::F32, {int64_t(got.size()), 1}, Device::CPU});
  for (size_t i = 0; i < pairs.size(); ++i) ASSERT_EQ(back[i], 2 * pairs[i] + 1) << "pair " << i;
  double most = 0, total = 0;
  for (int r = 0; r < P; ++r) {
    double rows = 0;
    for (int e = r * El; e < (r + 1) * El; ++e)
      for (int q : members) rows += double(pairs_of(q, e));
    most = std::max(most, rows);
    total += rows;
  }
  EXPECT_DOUBLE_EQ(ep.load().worst, most * P / total);
  EXPECT_DOUBLE_EQ(ep.load().mean, most * P / total) << "one layer planned";
}

// What each rank runs (SOLTRAIN_GROUPS_INNER set by the outer tests).
TEST(CommunicatorGroups, Inner) {
  if (!std::getenv("SOLTRAIN_GROUPS_INNER")) GTEST_SKIP() << "run by the MPI / TCP tests below, one per rank";
  auto ops = make_cpu_ops();
  auto world = make_communicator(read_launch_env(), *ops);
  ASSERT_EQ(world->size(), kRanks);
  const int r = world->rank();
  check_all_to_all(*world, 2);
  auto interleaved = world->split(r % 2);  // {0, 2}, {1, 3}
  check_group(*interleaved, r % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2}, r);
  auto pairs = world->split(r / 2);  // {0, 1}, {2, 3}
  check_group(*pairs, r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, r);
  auto alone = pairs->split(pairs->rank());  // a split of a split: each rank by itself
  check_group(*alone, {r}, r);
  check_expert_parallel(world->split(r / 2), r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, r);
  check_expert_parallel(world->split(0), {0, 1, 2, 3}, r);
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

// Runs `launch` (which starts the ranks, each writing its gtest output into the file it is given) and
// counts the ranks whose Inner test passed: a rank that skipped it (no SOLTRAIN_GROUPS_INNER) or failed counts not.
int passed_ranks(const std::string& launch, const std::string& out) {
  EXPECT_EQ(std::system(launch.c_str()), 0) << launch;
  FILE* f = std::fopen(out.c_str(), "r");
  if (!f) return 0;
  int ok = 0;
  for (char line[512]; std::fgets(line, sizeof line, f);)
    if (std::string(line).find("[       OK ] CommunicatorGroups.Inner") != std::string::npos) ++ok;
  std::fclose(f);
  std::remove(out.c_str());
  return ok;
}

const std::string kInner = " --gtest_filter=CommunicatorGroups.Inner --gtest_color=no";

TEST(CommunicatorGroups, MpiRanks) {
  const std::string out = "/tmp/soltrain-groups-mpi-" + std::to_string(::getpid());
  const std::string cmd =
      "SOLTRAIN_GROUPS_INNER=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " SOLTRAIN_MPIEXEC
      " --oversubscribe -np " +
      std::to_string(kRanks) + " " + self_exe() + kInner + " > " + out + " 2>&1";
  EXPECT_EQ(passed_ranks(cmd, out), kRanks);
}

TEST(CommunicatorGroups, TcpRanks) {
  const std::string port = std::to_string(free_tcp_port()),
                    out = "/tmp/soltrain-groups-tcp-" + std::to_string(::getpid());
  std::string cmd = "{ ";
  for (int r = 0; r < kRanks; ++r)
    cmd += "SOLTRAIN_GROUPS_INNER=1 RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(kRanks) +
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " timeout -k 5 60 " + self_exe() + kInner + " & ";
  cmd += "wait; } > " + out + " 2>&1";
  EXPECT_EQ(passed_ranks(cmd, out), kRanks);
}

}  // namespace
}  // namespace soltrain::test
