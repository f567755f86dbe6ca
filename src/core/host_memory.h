// How much host memory this process may really use: the cgroup's limit (a container's, which MemTotal does
// not show), /proc/meminfo and `ulimit -v`, whichever is smallest; and the check that refuses a host allocation that
// would not fit, with the figures, instead of the kernel's OOM killer ending the run without a word.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace soltrain {

// Where the figures are read from; tests point these at files of their own.
struct HostMemoryFiles {
  std::filesystem::path meminfo = "/proc/meminfo";
  // cgroup v2 keeps memory.max / memory.current / memory.stat here; v1 under memory/ (memory.limit_in_bytes,
  // memory.usage_in_bytes, memory.stat). Inside a container this is the container's own cgroup.
  std::filesystem::path cgroup_root = "/sys/fs/cgroup";
};

struct HostMemory {
  bool known = false;      // false: nothing could be read (no /proc, no cgroup files); checks let everything pass
  uint64_t limit = 0;      // bytes this process may use at most: min(cgroup limit, MemTotal)
  uint64_t available = 0;  // bytes it may still allocate now: min(MemAvailable, cgroup limit - working set)
  std::string limit_from;  // which figure set `limit`: "cgroup v2 memory.max", "cgroup v1 ...", "MemTotal"
};

HostMemory read_host_memory(const HostMemoryFiles& files = {});

// The one line refusing `bytes` more of host memory for `what` when they exceed `m.available`; empty when they
// fit (or nothing is known).
// `hint` says what the user can change.
inline constexpr std::string_view kTrainingMemoryHint =
    "lower per_device_train_batch_size or sequence_len, or use a smaller model or lora";
inline constexpr std::string_view kInputMemoryHint = "the input is too large for this machine, or corrupt";
std::string host_memory_refusal(uint64_t bytes, const HostMemory& m, std::string_view what,
                                std::string_view hint = kTrainingMemoryHint);

// Reads the figures now and throws UserError with host_memory_refusal's line when `bytes` do not fit.
void check_host_memory(uint64_t bytes, std::string_view what, std::string_view hint = kTrainingMemoryHint);

// "12.3 GiB limit (cgroup v2 memory.max), 10.1 GiB available" for the memory plan; "unknown" when unread.
std::string describe_host_memory(const HostMemory& m);

}  // namespace soltrain
