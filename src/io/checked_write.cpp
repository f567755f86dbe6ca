#include "io/checked_write.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace soltrain {

namespace {

// Bytes left before the simulated disk is full; negative: no simulation.
int64_t& simulated_space() {
  static int64_t left = [] {
    const char* v = std::getenv("SOLTRAIN_TEST_DISK_FULL_AFTER");
    return v ? std::atoll(v) : int64_t(-1);
  }();
  return left;
}

}  // namespace

void append_checked(std::ofstream& out, std::string_view bytes, const std::filesystem::path& path, const char* what) {
  int64_t& left = simulated_space();
  errno = 0;
  if (left >= 0 && int64_t(bytes.size()) > left) {
    left = 0;
    errno = ENOSPC;
    out.setstate(std::ios::badbit);
  } else {
    if (left >= 0) left -= int64_t(bytes.size());
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
  }
  if (!out)
    user_error(path.string(), ": cannot write ", what, " (", errno ? std::strerror(errno) : "write failed",
               "; is the disk full?)");
}

}  // namespace soltrain
