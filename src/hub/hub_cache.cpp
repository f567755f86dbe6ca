#include "hub/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "io/atomic_file.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// os.path.expanduser, as constants.py applies to every cache variable.
fs::path expand_home(const std::string& p) {
  if (p.rfind("~", 0) == 0 && (p.size() == 1 || p[1] == '/'))
    return fs::path(env("HOME")) / p.substr(p.size() > 1 ? 2 : 1);
  return p;
}

bool is_true(std::string v) {  // constants.py ENV_VARS_TRUE_VALUES
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

}  // namespace

const char* repo_kind(RepoType t) {
  return t == RepoType::kModel ? "model" : "dataset";
}

fs::path hub_cache_dir() {
  for (const char* v : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})
    if (!env(v).empty()) return expand_home(env(v));
  return hf_home() / "hub";
}

fs::path hf_home() {
  if (!env("HF_HOME").empty()) return expand_home(env("HF_HOME"));
  const fs::path cache =
      env("XDG_CACHE_HOME").empty() ? fs::path(env("HOME")) / ".cache" : expand_home(env("XDG_CACHE_HOME"));
  return cache / "huggingface";
}

bool hub_offline() {
  return is_true(env("HF_HUB_OFFLINE")) || is_true(env("TRANSFORMERS_OFFLINE"));
}

std::string repo_folder_name(const RepoRef& r) {
  std::string name = std::string(repo_kind(r.type)) + "s--" + r.id;
  for (size_t i = 0; (i = name.find('/', i)) != std::string::npos;) name.replace(i, 1, "--");
  return name;
}

fs::path repo_cache_dir(const RepoRef& r) {
  return hub_cache_dir() / repo_folder_name(r);
}

bool is_commit_hash(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c); });
}

std::optional<std::string> cached_commit(const RepoRef& r) {
  if (is_commit_hash(r.revision)) return r.revision;
  std::ifstream in(repo_cache_dir(r) / "refs" / r.revision);
  std::string commit;
  if (!(in >> commit) || commit.empty()) return std::nullopt;
  return commit;
}

void write_ref(const RepoRef& r, const std::string& commit) {
  if (r.revision == commit) return;
  const fs::path ref = repo_cache_dir(r) / "refs" / r.revision;
  std::error_code ec;
  fs::create_directories(ref.parent_path(), ec);
  write_file_atomic(ref, commit);  // huggingface_hub writes the bare hash, no newline
}

bool looks_like_hub_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() || s.find('/', slash + 1) != std::string::npos)
    return false;
  if (s.find("--") != std::string::npos || s.find("..") != std::string::npos) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (i != slash && !std::isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  if (s[0] == '.' || s[slash + 1] == '.') return false;  // ./x and ../x are local paths
  for (const char* ext :
       {".jsonl", ".json", ".parquet", ".csv", ".tsv", ".gz", ".zst", ".txt", ".yaml", ".yml", ".safetensors"})
    if (s.ends_with(ext)) return false;
  return true;
}

}  // namespace soltrain
