// Atomic writes: files and folders appear under their final name complete, or not at all.
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>

namespace soltrain {

// Writes `bytes` to `path` through a temporary sibling and a rename.
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);

// A file written piece by piece through a temporary sibling; commit() renames it into place. Without
// commit() (an error on the way) the temporary file is removed. Every write is checked.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  std::FILE* f_ = nullptr;
};

// A folder built under a temporary sibling name; commit() swaps it into place (an existing folder of
// the same name is replaced only then, so a crash leaves the user's old folder untouched). Without
// commit() the temporary folder is removed. The folder gets output_dir.h's marker; leftovers of killed
// processes next to it are cleaned up first (stale_partials.h). Whether an existing folder may be replaced
// is the caller's check (check_output_dir), made before any work.
class StagedDir {
 public:
  explicit StagedDir(std::filesystem::path final_path);
  StagedDir(StagedDir&& o) noexcept
      : final_(std::move(o.final_)), staging_(std::move(o.staging_)), committed_(o.committed_) {
    o.committed_ = true;  // the moved-from one owns nothing
  }
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::filesystem::path& path() const { return staging_; }  // write files here
  void commit();

 private:
  std::filesystem::path final_, staging_;
  bool committed_ = false;
};

}  // namespace soltrain
