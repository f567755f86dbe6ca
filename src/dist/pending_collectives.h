// The collectives a rank has queued on its GPU and not yet seen finish, for the NCCL watchdog's timeout: a
// peer that is stopped or hung never joins, its partners' kernels wait forever, and the host waits on them. The
// age of the oldest unfinished collective is counted from when it was queued (as torch's ProcessGroupNCCL
// watchdog counts a work item's), so ddp_timeout bounds the wait whatever the host thread is blocked in.
// Handle is the marker queued after each collective (a CUDA event); this file knows no CUDA, so the rule is
// tested on the CPU with stand-in handles.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace soltrain {

template <class Handle>
class PendingCollectives {
 public:
  using Clock = std::chrono::steady_clock;

  struct Overdue {
    std::string what;  // "all_reduce_sum of 1024 elements (collective 17)"
    double waited_s;   // since it was queued
  };

  // The main thread, after queueing collective `what` and then `marker` behind it on the same stream.
  void queued(Handle marker, std::string what, Clock::time_point now = Clock::now()) {
    std::lock_guard<std::mutex> g(m_);
    ++count_;
    pending_.push_back({marker, cat_count(std::move(what)), now});
  }

  // The watchdog: drops the finished collectives from the front (one stream finishes them in order), handing
  // their markers back in `finished` for reuse; returns the oldest unfinished one when it has waited longer
  // than `timeout`. `done(marker)` says whether the GPU has passed a marker.
  template <class Done>
  std::optional<Overdue> check(Done&& done, std::chrono::duration<double> timeout, std::vector<Handle>& finished,
                               Clock::time_point now = Clock::now()) {
    std::lock_guard<std::mutex> g(m_);
    while (!pending_.empty() && done(pending_.front().marker)) {
      finished.push_back(pending_.front().marker);
      pending_.pop_front();
    }
    if (pending_.empty()) return std::nullopt;
    const Op& oldest = pending_.front();
    const double waited = std::chrono::duration<double>(now - oldest.queued).count();
    if (waited <= timeout.count()) return std::nullopt;
    return Overdue{oldest.what, waited};
  }

  // Every marker still held (at shutdown, to be released).
  std::vector<Handle> drain() {
    std::lock_guard<std::mutex> g(m_);
    std::vector<Handle> out;
    for (const Op& o : pending_) out.push_back(o.marker);
    pending_.clear();
    return out;
  }

 private:
  struct Op {
    Handle marker;
    std::string what;
    Clock::time_point queued;
  };
  std::string cat_count(std::string what) const { return what + " (collective " + std::to_string(count_) + ")"; }
  std::mutex m_;
  std::deque<Op> pending_;
  int64_t count_ = 0;
};

}  // namespace soltrain
