#include "io/json_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/input_file.h"

namespace soltrain {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  return parse_json_text(read_input_file(path, "a JSON file"), path.string());
}

}  // namespace soltrain
