// One run per output folder. Two runs writing one output_dir corrupt each other (one's metrics.jsonl holds
// the other's rows, checkpoints of the same name are replaced under a reader), so a run holds an exclusive
// flock on <dir>/.soltrain-lock for its whole life. The kernel drops it when the process ends, kill -9
// included, so a stale lock never needs cleaning. A second run is refused in one line naming the holder.
#pragma once
#include <filesystem>
#include <ostream>
#include <string>

namespace soltrain {

inline constexpr const char* kOutputLockFile = ".soltrain-lock";
inline constexpr const char* kShardsLockFile = ".soltrain-shards-lock";  // dataset_prepared_path, while written

class OutputLock {
 public:
  OutputLock() = default;  // holds nothing
  // Locks `dir` (which must exist) or throws UserError "<what> <dir> is in use by another soltrain run (PID
  // N) ...". A worker started by `gpus: N` finds the lock its launcher took (the descriptor it inherited, named
  // by SOLTRAIN_OUTPUT_LOCK_FD) and holds nothing of its own.
  static OutputLock acquire(const std::filesystem::path& dir, const std::string& what);
  ~OutputLock();
  OutputLock(OutputLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  OutputLock& operator=(OutputLock&& o) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  // Waits for an exclusive lock on `dir`/`file` (`dir` must exist), saying on `log` whom it waits for: for a
  // folder runs share on purpose and take in turn, as tokenized shards (Axolotl's examples all name
  // dataset_prepared_path: last_run_prepared, so a sweep's runs meet there). Released with the object.
  static OutputLock wait_for(const std::filesystem::path& dir, const char* file, const std::string& what,
                             std::ostream& log);

  // Lets the workers this process starts inherit the lock (so it outlives a killed launcher only while a
  // worker still writes there): clears close-on-exec and sets SOLTRAIN_OUTPUT_LOCK_FD for them.
  void share_with_children() const;

 private:
  explicit OutputLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace soltrain
