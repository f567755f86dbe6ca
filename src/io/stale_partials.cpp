#include "io/stale_partials.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <regex>
#include <string>
#include <vector>

#include "core/process_state.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {

// kill(pid, 0) fails with ESRCH only when no such process exists; EPERM means it exists (another user's). A
// zombie has ended too: the workers of a killed launcher are reparented to an init that may never reap them
// (containers), and kill(pid, 0) still finds them.
bool process_gone(long pid) {
  if (pid <= 0 || pid == long(getpid())) return false;
  if (::kill(pid_t(pid), 0) != 0) return errno == ESRCH;
  const char state = process_state(pid_t(pid));
  return state == 'Z' || state == 'X';
}

}  // namespace

int clean_stale_partials(const fs::path& dir, std::ostream& log) {
  static const std::regex kLeftover(R"(\.(.+)\.(partial|tmp|old)-([0-9]{1,9}))");
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  int handled = 0;
  for (const fs::path& p : entries) {
    std::smatch m;
    const std::string name = p.filename().string();
    if (!std::regex_match(name, m, kLeftover) || !process_gone(std::stol(m[3].str()))) continue;
    const fs::path original = dir / m[1].str();
    if (m[2] == "old" && !fs::exists(original, ec)) {
      fs::rename(p, original, ec);
      if (!ec)
        log << "note: restored " << original.string() << " from " << name
            << " (a replace was interrupted before the new version was in place)\n";
    } else {
      const auto n = fs::remove_all(p, ec);
      if (!ec)
        log << "note: removed " << p.string() << " (" << n << " files left by process " << m[3]
            << ", which was interrupted while writing and is no longer running)\n";
    }
    handled += !ec;
  }
  return handled;
}

}  // namespace soltrain
