// Shard files: raw little-endian arrays (x86 and ARM hosts alike), listed by manifest.json.
#include "data/shards.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "io/json_file.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

template <typename T>
void write_array(const fs::path& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
  f.close();
  if (!f) user_error(path.string(), ": write failed (disk full?)");
}

template <typename T>
void append_array(const fs::path& path, int64_t count, std::vector<T>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) user_error(path.string(), ": shard file missing (re-run soltrain tokenize)");
  if (fs::file_size(path) != uint64_t(count) * sizeof(T))
    user_error(path.string(), ": has ", fs::file_size(path), " bytes, the manifest says ", count * sizeof(T));
  const size_t at = out.size();
  out.resize(at + size_t(count));
  if (!f.read(reinterpret_cast<char*>(out.data() + at), std::streamsize(count * sizeof(T))))
    user_error(path.string(), ": read failed");
}

}  // namespace

ShardWriter::ShardWriter(fs::path dir, int64_t max_tokens) : dir_(std::move(dir)), max_tokens_(max_tokens) {}

void ShardWriter::add(const Document& d) {
  SOLTRAIN_CHECK(d.ids.size() == d.mask.size());
  if (!tokens_.empty() && int64_t(tokens_.size() + d.ids.size()) > max_tokens_) flush();
  tokens_.insert(tokens_.end(), d.ids.begin(), d.ids.end());
  mask_.insert(mask_.end(), d.mask.begin(), d.mask.end());
  docs_.push_back(int64_t(tokens_.size()));
}

void ShardWriter::flush() {
  if (docs_.size() == 1) return;
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05zu", shards_.size());
  const ShardInfo s{name, int64_t(tokens_.size()), int64_t(docs_.size()) - 1};
  write_array(dir_ / (s.name + ".tokens"), tokens_);
  write_array(dir_ / (s.name + ".mask"), mask_);
  write_array(dir_ / (s.name + ".docs"), docs_);
  shards_.push_back(s);
  tokens_.clear();
  mask_.clear();
  docs_.assign(1, 0);
}

std::vector<ShardInfo> ShardWriter::finish() {
  flush();
  return shards_;
}

namespace {

std::vector<ShardInfo> manifest_shards(const fs::path& dir, const nlohmann::json& m) {
  const std::string where = (dir / "manifest.json").string();
  if (m.value("version", 0) != kShardFormatVersion)
    user_error(where, ": shard format version ", m.value("version", 0), ", expected ", kShardFormatVersion,
               " (re-run soltrain tokenize)");
  std::vector<ShardInfo> out;
  try {
    for (const auto& s : m.at("shards"))
      out.push_back({s.at("name").get<std::string>(), s.at("tokens").get<int64_t>(), s.at("documents").get<int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    user_error(where, ": bad \"shards\" entry (", e.what(), ")");
  }
  return out;
}

}  // namespace

ShardSet load_shards(const fs::path& dir) {
  const nlohmann::json m = read_json_file(dir / "manifest.json");
  ShardSet set;
  set.token_labels = m.value("token_labels", false);
  for (const ShardInfo& s : manifest_shards(dir, m)) {
    const int64_t base = int64_t(set.tokens.size());
    append_array(dir / (s.name + ".tokens"), s.tokens, set.tokens);
    append_array(dir / (s.name + ".mask"), s.tokens, set.mask);
    std::vector<int64_t> docs;
    append_array(dir / (s.name + ".docs"), s.documents + 1, docs);
    if (docs.front() != 0 || docs.back() != s.tokens || !std::is_sorted(docs.begin(), docs.end()))
      user_error((dir / (s.name + ".docs")).string(), ": document offsets are not 0..", s.tokens, " ascending");
    for (size_t d = 1; d < docs.size(); ++d) set.doc_offsets.push_back(base + docs[d]);
  }
  return set;
}

bool shards_match(const fs::path& dir, const nlohmann::json& key) {
  if (!fs::exists(dir / "manifest.json")) return false;
  nlohmann::json m;
  try {
    m = read_json_file(dir / "manifest.json");
    if (m.value("key", nlohmann::json()) != key) return false;
    for (const ShardInfo& s : manifest_shards(dir, m)) {
      auto size_is = [&](const char* ext, uint64_t bytes) {
        const fs::path p = dir / (s.name + ext);
        return fs::exists(p) && fs::file_size(p) == bytes;
      };
      if (!size_is(".tokens", uint64_t(s.tokens) * 4) || !size_is(".mask", uint64_t(s.tokens)) ||
          !size_is(".docs", uint64_t(s.documents + 1) * 8))
        return false;
    }
  } catch (const UserError&) {
    return false;  // an unreadable old manifest is simply rebuilt
  }
  return true;
}

int max_token_label(const ShardSet& s) {
  uint8_t top = 0;
  if (s.token_labels)
    for (uint8_t m : s.mask) top = std::max(top, m);
  return int(top) - 1;
}

nlohmann::json shard_manifest(const nlohmann::json& key, const std::vector<ShardInfo>& shards) {
  nlohmann::json list = nlohmann::json::array();
  for (const ShardInfo& s : shards)
    list.push_back({{"name", s.name}, {"tokens", s.tokens}, {"documents", s.documents}});
  return {{"format", "soltrain-shards"}, {"version", kShardFormatVersion}, {"key", key}, {"shards", list}};
}

}  // namespace soltrain
