// Helpers for the data tests: the real tokenizers fetched by the build, small files written on the fly.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace soltrain::test {

// The folder holding qwen3/ and llama3/ (tokenizer.json + tokenizer_config.json).
inline std::filesystem::path tokenizer_folder(const std::string& name) {
  std::filesystem::path root = SOLTRAIN_TOKENIZERS;
  if (const char* env = std::getenv("SOLTRAIN_TOKENIZERS")) root = env;
  if (!std::filesystem::exists(root / name / "tokenizer_config.json"))
    throw std::runtime_error(cat((root / name).string(), " is missing: run tests/tools/fetch_tokenizers.sh ", root));
  return root / name;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
// A JSON-lines file (metrics.jsonl), one value per line.
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> out;
  for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

// YAML text: `base` with the top-level keys of `extra` replacing its own (a key's indented lines go with
// it) and the rest of `extra` appended. A config may not repeat a key, so tests override this way.
inline std::string yaml_with(const std::string& base, const std::string& extra) {
  auto key_of = [](const std::string& line) {
    const size_t colon = line.find(':');
    return line.empty() || line[0] == ' ' || line[0] == '-' || colon == std::string::npos ? std::string()
                                                                                          : line.substr(0, colon);
  };
  std::vector<std::string> replaced;
  for (size_t b = 0; b < extra.size();) {
    const size_t e = std::min(extra.find('\n', b), extra.size());
    if (const std::string k = key_of(extra.substr(b, e - b)); !k.empty()) replaced.push_back(k);
    b = e + 1;
  }
  std::string out;
  bool skipping = false;
  for (size_t b = 0; b < base.size();) {
    const size_t e = std::min(base.find('\n', b), base.size());
    const std::string line = base.substr(b, e - b);
    const std::string k = key_of(line);
    if (!k.empty()) skipping = std::find(replaced.begin(), replaced.end(), k) != replaced.end();
    if (!skipping) out += line + "\n";
    b = e + 1;
  }
  return out + extra;
}

}  // namespace soltrain::test
