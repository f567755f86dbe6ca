#include "io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "core/error.h"
#include "io/deferred_writes.h"
#include "io/output_dir.h"
#include "io/stale_partials.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {
fs::path temp_sibling(const fs::path& p, const char* tag) {
  return p.parent_path() / cat(".", p.filename().string(), ".", tag, "-", getpid());
}
}  // namespace

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  AtomicFileWriter out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

StagedDir::StagedDir(fs::path final_path) : final_(std::move(final_path)) {
  if (final_.filename().empty()) final_ = final_.parent_path();  // "out/" -> "out"
  staging_ = temp_sibling(final_, "partial");
  std::error_code ec;
  if (!final_.parent_path().empty()) fs::create_directories(final_.parent_path(), ec);
  clean_stale_partials(final_.parent_path().empty() ? fs::path(".") : final_.parent_path(), std::cerr);
  fs::remove_all(staging_, ec);
  if (!fs::create_directories(staging_, ec))
    user_error(final_.string(), ": cannot create output folder (", ec.message(), ")");
  // Marks the folder as ours, so a later run may replace it (output_dir.h); a user's folder never has it.
  mark_output_dir(staging_, final_.filename().string());
}

StagedDir::~StagedDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

void StagedDir::commit() {
  std::error_code ec;
  const fs::path old = temp_sibling(final_, "old");
  const bool had_old = fs::exists(final_);
  if (had_old) {
    fs::remove_all(old, ec);
    fs::rename(final_, old, ec);
    if (ec) user_error(final_.string(), ": cannot replace existing folder (", ec.message(), ")");
  }
  fs::rename(staging_, final_, ec);
  if (!ec)
    if (DeferredWrites* d = DeferredWrites::active()) d->moved(staging_, final_);  // its queued files follow
  if (ec) {
    if (had_old) fs::rename(old, final_, ec);
    user_error(final_.string(), ": cannot move output into place (", ec.message(), ")");
  }
  committed_ = true;
  if (had_old) fs::remove_all(old, ec);
}

AtomicFileWriter::AtomicFileWriter(fs::path path) : path_(std::move(path)), tmp_(temp_sibling(path_, "tmp")) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) user_error(path_.string(), ": cannot write (", std::strerror(errno), ")");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!f_) return;
  std::fclose(f_);
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  SOLTRAIN_CHECK(f_, "write after commit: ", path_.string());
  if (bytes && std::fwrite(data, 1, bytes, f_) != bytes)
    user_error(path_.string(), ": write failed (", std::strerror(errno), "; disk full?)");
}

void AtomicFileWriter::commit() {
  SOLTRAIN_CHECK(f_, "commit twice: ", path_.string());
  const bool flushed = std::fflush(f_) == 0;
  const int err = errno;
  std::fclose(f_);
  f_ = nullptr;
  std::error_code ec;
  if (!flushed) {
    fs::remove(tmp_, ec);
    user_error(path_.string(), ": write failed (", std::strerror(err), "; disk full?)");
  }
  fs::rename(tmp_, path_, ec);
  if (ec) {
    fs::remove(tmp_, ec);
    user_error(path_.string(), ": cannot rename into place (", ec.message(), ")");
  }
}

}  // namespace soltrain
