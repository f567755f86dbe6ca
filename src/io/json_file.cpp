#include "io/json_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace soltrain {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) user_error(path.string(), ": cannot open (missing or unreadable)");
  std::stringstream s;
  s << f.rdbuf();
  return parse_json_text(s.str(), path.string());
}

}  // namespace soltrain
