#include "hub/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/input_file.h"

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

namespace {

bool safe_component(std::string_view c) {
  if (c.empty() || c == "." || c == "..") return false;
  return std::all_of(c.begin(), c.end(), [](unsigned char ch) { return ch >= 0x20 && ch != 0x7f && ch != '\\'; });
}

bool safe_relative_path(const std::string& s, size_t max_size) {
  if (s.empty() || s.size() > max_size) return false;
  for (size_t start = 0;;) {
    const size_t slash = s.find('/', start);
    if (!safe_component(std::string_view(s).substr(start, slash - start))) return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

}  // namespace

bool is_safe_revision(const std::string& s) {
  return safe_relative_path(s, 256);
}

bool is_safe_repo_path(const std::string& s) {
  return safe_relative_path(s, 1024);
}

bool is_safe_blob_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s.front() == '.' || s.back() == '.') return false;
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_' || c == '.'; });
}

void check_revision(const RepoRef& r) {
  if (!is_safe_revision(r.revision))
    user_error(repo_kind(r.type), " ", r.id, ": revision \"", r.revision,
               "\" is not a branch, tag or commit name (a relative name: no empty, \".\" or \"..\" part, no leading "
               "\"/\", printable characters only)");
}

std::optional<std::string> cached_commit(const RepoRef& r) {
  check_revision(r);
  if (is_commit_hash(r.revision)) return r.revision;
  const fs::path ref = repo_cache_dir(r) / "refs" / r.revision;
  std::error_code ec;
  if (!fs::exists(ref, ec)) return std::nullopt;
  refuse_special_file(ref, "a cache ref");
  std::ifstream in(ref, std::ios::binary);
  char buf[128] = {};
  in.read(buf, sizeof buf);
  std::string commit(buf, size_t(in.gcount()));
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  if (!is_commit_hash(commit))
    user_error(ref.string(), ": the Hugging Face cache's ref for revision \"", r.revision,
               "\" holds no commit hash (corrupt cache): delete the file and run again online");
  return commit;
}

void write_ref(const RepoRef& r, const std::string& commit) {
  check_revision(r);
  SOLTRAIN_CHECK(is_commit_hash(commit));
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
