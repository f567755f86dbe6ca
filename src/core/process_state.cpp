#include "core/process_state.h"

#include <fstream>
#include <iterator>
#include <string>

namespace soltrain {

char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(f)), {});
  const size_t close = stat.rfind(')');  // the name in parentheses may hold spaces and ')' itself
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

}  // namespace soltrain
