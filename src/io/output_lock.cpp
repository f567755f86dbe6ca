#include "io/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace soltrain {

namespace {

constexpr const char* kInheritedFdVar = "SOLTRAIN_OUTPUT_LOCK_FD";

// True when this process inherited an open descriptor of `path` from its launcher (same file, and the
// launcher's lock is what keeps it).
bool inherited(const std::filesystem::path& path) {
  const char* v = std::getenv(kInheritedFdVar);
  if (!v || !*v) return false;
  const int fd = std::atoi(v);
  struct stat a = {}, b = {};
  return fd >= 0 && ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

std::string holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid(buf, n > 0 ? size_t(n) : 0);
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "unknown" : pid;
}

int open_lock_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) user_error(path.string(), ": cannot open the lock file (", std::strerror(errno), ")");
  return fd;
}

// The PID is a note for a refused or waiting run's message; the lock holds without it.
void note_holder(int fd) {
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
}

}  // namespace

OutputLock OutputLock::acquire(const std::filesystem::path& dir, const std::string& what) {
  const std::filesystem::path path = dir / kOutputLockFile;
  if (inherited(path)) return OutputLock();
  const int fd = open_lock_file(path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const std::string pid = holder_pid(fd);
    ::close(fd);
    user_error(what, " ", dir.string(), " is in use by another soltrain run (PID ", pid,
               "): wait for it to finish, stop it, or choose another output_dir");
  }
  note_holder(fd);
  return OutputLock(fd);
}

OutputLock OutputLock::wait_for(const std::filesystem::path& dir, const char* file, const std::string& what,
                                std::ostream& log) {
  const std::filesystem::path path = dir / file;
  const int fd = open_lock_file(path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    log << what << " " << dir.string() << " is being written by another soltrain run (PID " << holder_pid(fd)
        << "): waiting for it" << std::endl;
    while (::flock(fd, LOCK_EX) != 0)
      if (errno != EINTR) {
        ::close(fd);
        user_error(path.string(), ": cannot lock (", std::strerror(errno), ")");
      }
  }
  note_holder(fd);
  return OutputLock(fd);
}

OutputLock::~OutputLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

OutputLock& OutputLock::operator=(OutputLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void OutputLock::share_with_children() const {
  if (fd_ < 0) return;
  ::fcntl(fd_, F_SETFD, 0);
  ::setenv(kInheritedFdVar, std::to_string(fd_).c_str(), 1);
}

}  // namespace soltrain
