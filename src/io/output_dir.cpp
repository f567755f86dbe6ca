#include "io/output_dir.h"

#include <system_error>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fs = std::filesystem;

namespace soltrain {

void mark_output_dir(const fs::path& dir, const std::string& what) {
  write_file_atomic(dir / kOutputMarker, cat("written by soltrain (", what,
                                             "); soltrain replaces this folder's contents when asked to write here\n"));
}

bool is_replaceable_output(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  if (fs::exists(dir / kOutputMarker, ec)) return true;
  return fs::is_empty(dir, ec) && !ec;
}

void check_output_dir(const fs::path& dir, bool overwrite, const std::string& flag, const std::string& what) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    user_error(dir.string(), ": is a file, not a folder; give a folder for the ", what);
  if (overwrite || is_replaceable_output(dir)) return;
  user_error(dir.string(), ": folder is not empty and was not written by soltrain (no ", kOutputMarker,
             "); choose another folder for the ", what,
             flag.empty() ? std::string(" or empty it") : cat(", or set ", flag, " to write over it"));
}

bool path_within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(fs::absolute(inner), ec).lexically_normal();
  const fs::path b = fs::weakly_canonical(fs::absolute(outer), ec).lexically_normal();
  auto ai = a.begin();
  for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai) {
    if (bi->empty()) continue;  // the empty name after a trailing slash
    if (ai == a.end() || *ai != *bi) return false;
  }
  return true;
}

void check_output_apart_from_inputs(const fs::path& output, const std::string& output_key,
                                    const std::vector<std::pair<fs::path, std::string>>& inputs) {
  for (const auto& [in, key] : inputs) {
    if (in.empty()) continue;
    if (path_within(output, in))
      user_error(output_key, " ", output.string(), " is ", path_within(in, output) ? "the same folder as" : "inside",
                 " ", key, " ", in.string(), ": writing there would overwrite the input; choose another output folder");
    if (path_within(in, output))
      user_error(key, " ", in.string(), " is inside ", output_key, " ", output.string(),
                 ", which is replaced; move it or choose another output folder");
  }
}

}  // namespace soltrain
