// The local Hugging Face cache in huggingface_hub's own layout, so that soltrain, transformers and
// `huggingface-cli download` share one copy of every file:
//   <cache>/models--Org--Name/{blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>, refs/<revision>}
// (datasets--Org--Name/... for datasets). Which folder is the cache, which ids are hub ids, offline mode.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

namespace soltrain {

enum class RepoType { kModel, kDataset };

struct RepoRef {
  RepoType type = RepoType::kModel;
  std::string id;                 // "Org/Name"
  std::string revision = "main";  // a branch, tag or commit hash
};

// "model" / "dataset", for messages.
const char* repo_kind(RepoType t);

// huggingface_hub constants.py: HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else HF_HOME/hub,
// else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
std::filesystem::path hub_cache_dir();
// HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface (where the login token lives).
std::filesystem::path hf_home();

// constants.py HF_HUB_OFFLINE: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to 1/ON/YES/TRUE.
bool hub_offline();

// file_download.py repo_folder_name: "models--Org--Name" ("--" cannot occur in a hub id).
std::string repo_folder_name(const RepoRef& r);
std::filesystem::path repo_cache_dir(const RepoRef& r);

// A full 40-hex commit id (REGEX_COMMIT_HASH in file_download.py): such a revision needs no refs/ file.
bool is_commit_hash(const std::string& s);

// Names that come from outside (a config's revision, the hub's file names and ETags) become paths in the
// cache, so each is checked as a name before it touches the file system: a revision or file name is relative
// ("/"-separated components of printable ASCII, none empty, "." or ".."), an ETag a single such component
// of letters, digits, '-', '_' and inner '.'. huggingface_hub joins them unchecked.
bool is_safe_revision(const std::string& s);
bool is_safe_repo_path(const std::string& s);
bool is_safe_blob_name(const std::string& s);
// UserError (one line) unless r.revision is a safe revision.
void check_revision(const RepoRef& r);

// The commit the cache holds for r.revision: the revision itself when it is a commit hash, else the
// content of refs/<revision> (written by the last online resolve); nullopt when neither is there.
// UserError when refs/<revision> holds something other than a commit hash (or is not a regular file).
std::optional<std::string> cached_commit(const RepoRef& r);

// refs/<revision> := commit (as _cache_commit_hash_for_specific_revision: only when they differ), atomically.
void write_ref(const RepoRef& r, const std::string& commit);

// "Org/Name" with the characters the hub allows in each half (letters, digits, '-', '_', '.'), no "--" or
// "..", and a name that does not end like a data file (so `data/train.jsonl` stays a local path).
bool looks_like_hub_id(const std::string& s);

}  // namespace soltrain
