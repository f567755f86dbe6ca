// A download's progress on stderr: redrawn in place on a terminal, a line every few seconds in a log file,
// and always a last line with the size, the time and whether the hash was checked.
#pragma once
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace soltrain {

class ProgressBar {
 public:
  ProgressBar(std::ostream* out, bool tty, std::string name, int64_t total, int64_t initial);
  void add(int64_t bytes);
  void finish(const std::string& note);  // the last line, e.g. "sha256 ok"

 private:
  void draw(bool last, const std::string& note);
  std::ostream* out_;
  bool tty_;
  std::string name_;
  int64_t total_, done_, initial_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace soltrain
