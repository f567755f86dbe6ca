// Issue 28's "nothing the user had is changed": the sha256 of every file under the given paths, taken when the
// guard is armed and compared when it goes (a test's setup arms it over the model and data it gives a run).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/sha256.h"

namespace soltrain::test {

class InputsGuard {
 public:
  InputsGuard() = default;
  InputsGuard(const InputsGuard&) = delete;
  InputsGuard& operator=(const InputsGuard&) = delete;
  ~InputsGuard() {
    if (paths_.empty()) return;
    const auto now = hashes();
    if (!allow_new_ && now != taken_)
      ADD_FAILURE() << "a run changed a file it was given under " << paths_.front().parent_path();
    if (allow_new_)  // a cache: files may be added, none that was there changed or gone
      for (const auto& [path, hash] : taken_)
        if (const auto it = now.find(path); it == now.end() || it->second != hash)
          ADD_FAILURE() << "a run changed or removed " << path;
  }
  // `allow_new`: the run may add files (a download into a cache), but every file there now stays as it is.
  void arm(std::vector<std::filesystem::path> paths, bool allow_new = false) {
    paths_ = std::move(paths);
    allow_new_ = allow_new;
    taken_ = hashes();
  }
  void changed_on_purpose() { taken_ = hashes(); }  // the test itself changed them (a bad record, a NaN)

 private:
  std::map<std::string, std::string> hashes() const {
    namespace fs = std::filesystem;
    std::map<std::string, std::string> out;
    for (const fs::path& p : paths_) {
      if (fs::is_regular_file(p)) out[p.string()] = sha256_file(p);
      if (!fs::is_directory(p)) continue;
      for (const auto& e : fs::recursive_directory_iterator(p))  // (a link to /dev/zero is no regular file)
        out[e.path().string()] = e.is_regular_file() ? sha256_file(e.path()) : "-";
    }
    return out;
  }
  std::vector<std::filesystem::path> paths_;
  bool allow_new_ = false;
  std::map<std::string, std::string> taken_;
};

}  // namespace soltrain::test
