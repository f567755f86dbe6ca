#include "io/input_file.h"

#include <sys/stat.h>

#include <sstream>

#include "core/error.h"
#include "core/host_memory.h"

namespace soltrain {

void refuse_special_file(const std::filesystem::path& p, std::string_view what) {
  struct stat st{};
  if (::stat(p.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
  const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO"
                     : S_ISDIR(st.st_mode)                        ? "a folder"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                     : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                  : "not a plain file";
  user_error(p.string(), ": not a regular file (", kind, "); ", what, " must be a file");
}

std::unique_ptr<std::ifstream> open_input_file(const std::filesystem::path& p, std::string_view what) {
  refuse_special_file(p, what);
  auto in = std::make_unique<std::ifstream>(p, std::ios::binary);
  if (!*in) return nullptr;
  return in;
}

std::string read_input_file(const std::filesystem::path& p, std::string_view what) {
  auto in = open_input_file(p, what);
  if (!in) user_error(p.string(), ": cannot open (missing or unreadable)");
  std::error_code ec;
  const auto size = std::filesystem::file_size(p, ec);
  if (!ec) check_host_memory(uint64_t(size), cat(p.string(), " (", what, ", read whole)"), kInputMemoryHint);
  std::stringstream s;
  s << in->rdbuf();
  return s.str();
}

}  // namespace soltrain
