// Helpers for the data tests: the real tokenizers fetched by the build, small files written on the fly.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

}  // namespace soltrain::test
