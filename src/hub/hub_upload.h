// Uploading to the hub as huggingface_hub's create_repo and upload_folder do (hf_api.py create_commit,
// _commit_api.py): the repository created (or found), each file's upload mode asked of the hub (preupload),
// LFS files sent to the storage the LFS batch API names (basic PUT, or the parts of a multipart upload, then
// the verify call), and one commit of NDJSON lines naming regular files by their base64 bytes and LFS files by
// sha256 and size. Files are read from disk as they are sent, never held whole.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "hub/hub_client.h"
#include "io/base64.h"

namespace soltrain {

struct UploadFile {
  std::string path_in_repo;
  std::filesystem::path local;
};

// Every regular file under `dir` (recursively, names starting with "." left out), as `prefix` + its relative
// path, sorted.
std::vector<UploadFile> folder_files(const std::filesystem::path& dir, const std::string& prefix = "");

// POST /api/repos/create; an existing repository (409) is fine. UserError naming the repository otherwise
// (no token, a token without write access, a malformed id).
void create_repo(const HubClient& c, const RepoRef& r, bool private_repo);

// One commit of `files` on r.revision with `message`; returns the commit's id. UserError naming the file or
// the step that failed.
std::string upload_files(const HubClient& c, const RepoRef& r, const std::vector<UploadFile>& files,
                         const std::string& message);

}  // namespace soltrain
