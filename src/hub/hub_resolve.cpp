#include "hub/hub_resolve.h"

#include <algorithm>
#include <fstream>
#include <set>

#include "core/error.h"
#include "hub/hub_download.h"
#include "hub/hub_listing.h"
#include "io/input_file.h"
#include "model/checkpoint.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {

// config.json and what a model folder carries besides its weights (model/checkpoint.h).
std::vector<std::string> model_files() {
  std::vector<std::string> f = {"config.json"};
  f.insert(f.end(), std::begin(kModelSideFiles), std::end(kModelSideFiles));
  return f;
}
constexpr const char* kWeights = "model.safetensors";                  // constants.py SAFETENSORS_SINGLE_FILE
constexpr const char* kWeightsIndex = "model.safetensors.index.json";  // SAFETENSORS_INDEX_FILE

// hf_api.py model_info / dataset_info: the commit ("sha") and the files ("siblings[].rfilename").
// nullopt when the hub cannot be reached (the caller may fall back to the cache).
std::optional<RepoListing> list_repo(const HubClient& c, const RepoRef& r, HttpResponse& resp) {
  const std::string url =
      c.endpoint + "/api/" + repo_kind(r.type) + "s/" + r.id + "/revision/" + url_quote(r.revision, "");
  resp = http_fetch({url, hub_headers(c), false, true});
  if (resp.status == 0) return std::nullopt;
  if (resp.status >= 300) hub_request_failed(c, r, "file list", resp);
  if (!resp.error.empty())  // a 200 whose body was cut (timeout, size cap): not a listing to parse
    user_error(repo_kind(r.type), " ", r.id, ": the hub's file list did not arrive whole (", resp.error,
               "); try again later");
  return parse_repo_listing(resp.body, r, url_for_messages(c.endpoint));
}

std::vector<std::string> shards_of_index(const fs::path& index) {
  return parse_shard_index(read_input_file(index, "a safetensors index"), index.string());
}

// Files present under a snapshot, relative to it (links followed: a dangling one is not there).
std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (fs::is_regular_file(it->path(), ec)) out.push_back(it->path().lexically_relative(dir).generic_string());
  std::sort(out.begin(), out.end());
  return out;
}

// The model's files in a cached snapshot, or why it is not complete.
std::string missing_model_file(const fs::path& snap) {
  std::error_code ec;
  if (!fs::exists(snap / "config.json", ec)) return "config.json";
  if (fs::exists(snap / kWeightsIndex, ec)) {
    for (const std::string& s : shards_of_index(snap / kWeightsIndex))
      if (!fs::exists(snap / s, ec)) return s;
    return "";
  }
  return fs::exists(snap / kWeights, ec) ? "" : kWeights;
}

[[noreturn]] void not_cached(const RepoRef& r, const std::string& why) {
  user_error(repo_kind(r.type), " ", r.id, ": ", why, " in the Hugging Face cache (", hub_cache_dir().string(),
             ") and HF_HUB_OFFLINE=1 forbids downloading: unset HF_HUB_OFFLINE to download it, or set HF_HUB_CACHE / "
             "HF_HOME to the cache that holds it");
}

fs::path cached_snapshot(const RepoRef& r) {
  const auto commit = cached_commit(r);
  if (!commit) not_cached(r, cat("revision \"", r.revision, "\" is not"));
  return repo_cache_dir(r) / "snapshots" / *commit;
}

}  // namespace

fs::path resolve_hub_model(const HubClient& c, const std::string& id, const std::string& revision) {
  const RepoRef r{RepoType::kModel, id, revision};
  check_revision(r);
  if (hub_offline()) {
    const fs::path snap = cached_snapshot(r);
    const std::string missing = missing_model_file(snap);
    if (!missing.empty()) not_cached(r, missing + " is not");
    return snap;
  }
  HttpResponse resp;
  const auto listing = list_repo(c, r, resp);
  if (!listing) {  // huggingface_hub falls back to the cache when the hub is unreachable; so do we
    const auto commit = cached_commit(r);
    if (commit && missing_model_file(repo_cache_dir(r) / "snapshots" / *commit).empty()) {
      if (c.log) *c.log << "model " << id << ": the hub is unreachable (" << resp.error << "); using the cached copy\n";
      return repo_cache_dir(r) / "snapshots" / *commit;
    }
    hub_request_failed(c, r, "file list", resp);
  }
  write_ref(r, listing->commit);
  const std::set<std::string> has(listing->files.begin(), listing->files.end());
  std::vector<std::string> want;
  for (const std::string& f : model_files())
    if (has.count(f)) want.push_back(f);
  if (!has.count("config.json"))
    user_error("model ", id, ": the repository has no config.json (not a transformers model)");
  if (has.count(kWeightsIndex)) {
    const fs::path index = hub_download_file(c, r, listing->commit, kWeightsIndex);
    for (const std::string& s : shards_of_index(index)) want.push_back(s);
  } else if (has.count(kWeights)) {
    want.push_back(kWeights);
  } else {
    user_error("model ", id,
               ": the repository has no model.safetensors or model.safetensors.index.json (soltrain "
               "reads safetensors weights only)");
  }
  for (const std::string& f : want) hub_download_file(c, r, listing->commit, f);
  return repo_cache_dir(r) / "snapshots" / listing->commit;
}

std::vector<fs::path> resolve_hub_dataset(const HubClient& c, const std::string& id, const std::string& revision,
                                          const std::string& split) {
  return resolve_hub_dataset(
      c, id, revision,
      [&](const std::vector<std::string>& files, const RepoFileReader&) { return pick_dataset_files(files, split); },
      cat("split \"", split, "\""));
}

std::vector<HubDataFile> list_hub_dataset(const HubClient& c, const std::string& id, const std::string& revision,
                                          const DataFilePicker& pick, const std::string& what) {
  const RepoRef r{RepoType::kDataset, id, revision};
  check_revision(r);
  fs::path snap;
  std::string commit;
  std::vector<std::string> files;
  auto read_at = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (hub_offline()) {
    snap = cached_snapshot(r);
    commit = snap.filename().string();
    files = pick(files_under(snap), [&](const std::string& f) {
      return is_safe_repo_path(f) && fs::is_regular_file(snap / f) ? read_at(snap / f) : std::string();
    });
    if (files.empty()) not_cached(r, cat("no data file of ", what, " is"));
  } else {
    HttpResponse resp;
    const auto listing = list_repo(c, r, resp);
    if (!listing) hub_request_failed(c, r, "file list", resp);
    write_ref(r, listing->commit);
    commit = listing->commit;
    files = pick(listing->files, [&](const std::string& f) {
      const auto& l = listing->files;
      if (std::find(l.begin(), l.end(), f) == l.end()) return std::string();
      return read_at(hub_download_file(c, r, listing->commit, f));
    });
    if (files.empty())
      user_error("dataset ", id, ": the repository has no parquet, JSONL, JSON or CSV files of ", what, " (",
                 listing->files.size(), " files listed)");
    snap = repo_cache_dir(r) / "snapshots" / listing->commit;
  }
  std::vector<HubDataFile> out;
  for (const std::string& f : files) out.push_back({snap / f, RepoRef{RepoType::kDataset, id, commit}, f});
  return out;
}

std::vector<fs::path> resolve_hub_dataset(const HubClient& c, const std::string& id, const std::string& revision,
                                          const DataFilePicker& pick, const std::string& what) {
  std::vector<fs::path> out;
  for (const HubDataFile& f : list_hub_dataset(c, id, revision, pick, what)) {
    if (!hub_offline()) hub_download_file(c, f.repo, f.repo.revision, f.file);
    out.push_back(f.path);
  }
  return out;
}

}  // namespace soltrain
