// Shared by the fuzz targets: a scratch file per process for parsers that read files, and the rule that
// bad input may only end in a UserError (what the CLI prints as one line with exit code 2). Anything else
// escaping a target is an internal error the user would see as a crash: abort so libFuzzer reports it.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "data/record_reader.h"

namespace soltrain::fuzz {

inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    const auto d = base / ("soltrain-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::filesystem::path write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const auto p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return p;
}

template <typename F>
void expect_only_user_errors(F&& f) {
  try {
    f();
  } catch (const UserError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error escaped (would exit 1, not 2): %s\n", e.what());
    std::abort();
  }
}

// Reads every record of a dataset file (bad ones come back as null with their error).
inline void read_every_record(const std::filesystem::path& path) {
  RecordReader r(path);
  nlohmann::ordered_json rec;
  std::string where, error;
  while (r.next(rec, where, error)) {
  }
}

}  // namespace soltrain::fuzz
