#include "hub/hub_listing.h"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "data/record_reader.h"
#include "io/json_file.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {

bool ends_with_any(const std::string& s, std::initializer_list<const char*> ends) {
  for (const char* e : ends)
    if (s.ends_with(e)) return true;
  return false;
}

}  // namespace

std::string normalize_etag(std::string etag) {
  if (etag.rfind("W/", 0) == 0) etag.erase(0, 2);
  etag.erase(std::remove(etag.begin(), etag.end(), '"'), etag.end());
  return etag;
}

RepoListing parse_repo_listing(const std::string& body, const RepoRef& r, const std::string& endpoint) {
  RepoListing l;
  try {
    const nlohmann::json j = parse_json_text(body, cat(repo_kind(r.type), " ", r.id, ": the hub's file list"));
    l.commit = j.at("sha").get<std::string>();
    for (const auto& s : j.at("siblings")) l.files.push_back(s.at("rfilename").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    user_error(repo_kind(r.type), " ", r.id, ": the hub's file list is not what huggingface_hub reads (", e.what(),
               "); is HF_ENDPOINT (", endpoint, ") a Hugging Face hub?");
  }
  if (!is_commit_hash(l.commit))
    user_error(repo_kind(r.type), " ", r.id, ": the hub's file list names no commit (\"", l.commit, "\")");
  return l;
}

std::vector<std::string> parse_shard_index(const std::string& text, const std::string& where) {
  std::set<std::string> shards;
  try {
    const nlohmann::json j = parse_json_text(text, where);
    for (const auto& [name, shard] : j.at("weight_map").items()) shards.insert(shard.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    user_error(where, ": not a safetensors index (", e.what(), ")");
  }
  for (const std::string& s : shards)
    if (!is_safe_repo_path(s)) user_error(where, ": a shard name leaves the folder: \"", s, "\"");
  return {shards.begin(), shards.end()};
}

std::vector<std::string> pick_dataset_files(const std::vector<std::string>& repo_files, const std::string& split) {
  std::vector<std::string> data;
  static const std::set<std::string> metadata = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json",
                                                 "state.json"};
  bool parquet = false;
  for (const std::string& f : repo_files) {
    const std::string base = fs::path(f).filename().string();
    if (base.empty() || base[0] == '.' || f[0] == '.' || metadata.count(base)) continue;
    const std::string plain = ends_with_any(f, {".gz", ".zst"}) ? fs::path(f).replace_extension().string() : f;
    if (!ends_with_any(plain, {".parquet", ".jsonl", ".json", ".csv", ".tsv"})) continue;
    data.push_back(f);
    parquet = parquet || plain.ends_with(".parquet");
  }
  // One copy of the data: repositories that also hold the hub's parquet conversion train from that.
  if (parquet) std::erase_if(data, [](const std::string& f) { return !f.ends_with(".parquet"); });
  // A split in a file or folder name (data/train-00000-of-00001.parquet, train.jsonl, en/c4-validation.0.json.gz):
  // that split's files only, as datasets.load_dataset(split=...) would read.
  const std::string want = split.empty() ? "train" : split;
  auto names = [](const std::string& f, const std::string& s) { return names_split(fs::path(f), s); };
  if (std::any_of(data.begin(), data.end(), [&](const std::string& f) { return names(f, want); })) {
    std::erase_if(data, [&](const std::string& f) { return !names(f, want); });
  } else {
    const bool any_split = std::any_of(data.begin(), data.end(), [&](const std::string& f) {
      return names(f, "train") || names(f, "validation") || names(f, "test");
    });
    if (want != "train" || any_split) data.clear();  // (no file of that split)
  }
  std::sort(data.begin(), data.end());
  return data;
}

std::vector<std::string> pick_data_files(const std::vector<std::string>& files,
                                         const std::vector<std::string>& patterns, const std::string& where) {
  std::vector<std::string> out;
  std::set<std::string> taken;
  for (std::string p : patterns) {
    while (p.rfind("./", 0) == 0) p.erase(0, 2);
    // ("**" crosses folders: matched without FNM_PATHNAME, where * crosses them too)
    const int flags = p.find("**") == std::string::npos ? FNM_PATHNAME : 0;
    std::vector<std::string> hits;
    for (const std::string& f : files)
      if (f == p || ::fnmatch(p.c_str(), f.c_str(), flags) == 0) hits.push_back(f);
    if (hits.empty()) user_error(where, ": data_files: \"", p, "\" matches no file");
    std::sort(hits.begin(), hits.end());
    for (const std::string& f : hits)
      if (taken.insert(f).second) out.push_back(f);
  }
  return out;
}

}  // namespace soltrain
