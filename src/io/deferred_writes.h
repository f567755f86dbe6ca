// Background checkpoints' snapshot. While a DeferredWrites::Capture is active on a thread, every
// write_safetensors_streamed call on it runs its tensors' fills at once into host memory (the snapshot of
// that moment's state) and queues the file instead of writing it; a staged folder committed meanwhile
// (StagedDir::commit) takes its queued files along to its final name. write_all() later writes the queued
// files from the snapshot, on any thread: the training thread goes on while the bytes reach the disk.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors_writer.h"

namespace soltrain {

class DeferredWrites {
 public:
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
    std::vector<std::vector<char>> data;
    std::map<std::string, std::string> metadata;
  };
  std::vector<File> files_;
  uint64_t bytes_ = 0;
};

}  // namespace soltrain
