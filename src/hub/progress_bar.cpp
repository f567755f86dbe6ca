#include "hub/progress_bar.h"

#include <cstdio>

namespace soltrain {

namespace {

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / 1e6);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::ostream* out, bool tty, std::string name, int64_t total, int64_t initial)
    : out_(out),
      tty_(tty),
      name_(std::move(name)),
      total_(total),
      done_(initial),
      initial_(initial),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {
  draw(false, initial > 0 ? "resuming" : "");
}

void ProgressBar::add(int64_t bytes) {
  done_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  // 10 redraws a second on a terminal; in a log, a line every 5 s is enough to see it move.
  if (now - last_ < (tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000))) return;
  last_ = now;
  draw(false, "");
}

void ProgressBar::finish(const std::string& note) {
  draw(true, note);
}

void ProgressBar::draw(bool last, const std::string& note) {
  if (!out_) return;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = "download " + name_ + ": ";
  if (total_ > 0) line += std::to_string(int(100.0 * double(done_) / double(total_))) + "% ";
  line += mb(done_) + (total_ > 0 ? " of " + mb(total_) : "");
  if (secs > 0.05) line += ", " + mb(int64_t(double(done_ - initial_) / secs)) + "/s";
  if (!note.empty()) line += ", " + note;
  if (tty_)
    *out_ << "\r" << line << "\x1b[K" << (last ? "\n" : "") << std::flush;
  else
    *out_ << line << "\n" << std::flush;
}

}  // namespace soltrain
