// Background checkpoints' snapshot. While a DeferredWrites::Capture is active on a thread, every
// write_safetensors_streamed call on it runs its tensors' fills at once into host memory (the snapshot of
// that moment's state) and queues the file instead of writing it; a staged folder committed meanwhile
// (StagedDir::commit) takes its queued files along to its final name. write_all() later writes the queued
// files from the snapshot, on any thread: the training thread goes on while the bytes reach the disk.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "io/safetensors_writer.h"

namespace soltrain {

// Host buffers for snapshots, kept for the next checkpoint (the same sizes come back every time): from
// `alloc` (Ops::alloc_host: pinned on CUDA, so the device copies into them at full PCIe speed), allocated and
// page-faulted once rather than at every checkpoint. A new buffer is checked against host memory first.
class SnapshotPool {
 public:
  explicit SnapshotPool(std::function<Buffer(size_t)> alloc) : alloc_(std::move(alloc)) {}
  Buffer take(size_t bytes, const std::string& what);  // a kept buffer of that size, else a new one
  void give(Buffer b);                                 // from any thread

 private:
  std::function<Buffer(size_t)> alloc_;
  std::multimap<size_t, Buffer> free_;
  std::mutex mu_;
};

class DeferredWrites {
 public:
  // Snapshot buffers from `pool` (given back after write_all), else plain host memory.
  explicit DeferredWrites(SnapshotPool* pool = nullptr) : pool_(pool) {}
  ~DeferredWrites();
  // Makes `d` the active capture of this thread for the scope.
  class Capture {
   public:
    explicit Capture(DeferredWrites& d);
    ~Capture();
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;

   private:
    DeferredWrites* previous_;
  };
  static DeferredWrites* active();
  // True while a capture into pinned pool memory is active on this thread: its fills may queue their device
  // copies (Ops::copy_to_host(..., queued)); whoever took the snapshot fences them before write_all().
  static bool queueing() { return active() && active()->pool_; }

  // The snapshot of one file: its tensors' bytes now (UserError from the host-memory check when they do
  // not fit).
  void add(const std::filesystem::path& path, const std::vector<StreamedTensor>& tensors,
           const std::map<std::string, std::string>& metadata);
  // A folder `from` was renamed to `to`: queued files under it follow.
  void moved(const std::filesystem::path& from, const std::filesystem::path& to);
  // Writes every queued file (each through a temporary sibling and a rename), then forgets the snapshot.
  void write_all();
  uint64_t bytes() const { return bytes_; }

 private:
  struct File {
    std::filesystem::path path;
    std::vector<StreamedTensor> tensors;  // names, dtypes, shapes; fills read `data`
    std::vector<Buffer> data;
    std::map<std::string, std::string> metadata;
  };
  void release();  // the snapshot's buffers back to the pool
  SnapshotPool* pool_;
  std::vector<File> files_;
  uint64_t bytes_ = 0;
};

}  // namespace soltrain
