// The NCCL watchdog's timeout rule (dist/pending_collectives.h) with stand-in markers: finished collectives
// leave the front in order and hand their markers back; the oldest unfinished one is overdue only once it has
// waited longer than the timeout since it was queued, and it is named with its place in the order. (The CUDA
// side, an event per collective and the stall seam, runs in tests/gpu/test_cuda_data_parallel.cpp.)
#include <gtest/gtest.h>

#include <set>

#include "dist/pending_collectives.h"

namespace soltrain {
namespace {

using Clock = PendingCollectives<int>::Clock;
using std::chrono::seconds;

TEST(PendingCollectives, TheOldestUnfinishedIsOverdueOnlyPastTheTimeout) {
  PendingCollectives<int> p;
  const Clock::time_point t0 = Clock::now();
  std::set<int> done;
  auto is_done = [&](int m) { return done.count(m) > 0; };
  std::vector<int> freed;
  EXPECT_FALSE(p.check(is_done, seconds(5), freed, t0 + seconds(100)));  // nothing queued
  p.queued(1, "all_reduce_sum of 8 elements", t0);
  p.queued(2, "all_gather of 16 elements", t0 + seconds(3));
  p.queued(3, "broadcast of 4 elements", t0 + seconds(4));
  EXPECT_FALSE(p.check(is_done, seconds(5), freed, t0 + seconds(5)));  // 5 s is not past 5 s
  auto late = p.check(is_done, seconds(5), freed, t0 + seconds(6));
  ASSERT_TRUE(late);
  EXPECT_EQ(late->what, "all_reduce_sum of 8 elements (collective 1)");
  EXPECT_DOUBLE_EQ(late->waited_s, 6.0);
  EXPECT_TRUE(freed.empty());
  // The first finished: its marker comes back, and the clock of the next is its own queue time.
  done = {1};
  EXPECT_FALSE(p.check(is_done, seconds(5), freed, t0 + seconds(8)));
  EXPECT_EQ(freed, std::vector<int>{1});
  late = p.check(is_done, seconds(5), freed, t0 + std::chrono::milliseconds(8500));
  ASSERT_TRUE(late);
  EXPECT_EQ(late->what, "all_gather of 16 elements (collective 2)");
  // One stream finishes in order: a later marker passed while an earlier one is not is not taken early.
  freed.clear();
  done = {3};
  EXPECT_TRUE(p.check(is_done, seconds(5), freed, t0 + seconds(9)));
  EXPECT_TRUE(freed.empty());
  done = {2, 3};
  EXPECT_FALSE(p.check(is_done, seconds(5), freed, t0 + seconds(100)));
  EXPECT_EQ(freed, (std::vector<int>{2, 3}));
  p.queued(4, "reduce_scatter_sum of 32 elements", t0 + seconds(100));
  EXPECT_EQ(p.drain(), std::vector<int>{4});
  EXPECT_FALSE(p.check(is_done, seconds(0), freed, t0 + seconds(1000)));
}

}  // namespace
}  // namespace soltrain
