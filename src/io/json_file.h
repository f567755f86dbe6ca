// Reading JSON files with errors that name the file and the position.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>

namespace soltrain {

nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace soltrain
