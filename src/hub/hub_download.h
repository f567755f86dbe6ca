// One file of a hub repository into the cache, as file_download.py hf_hub_download →
// _hf_hub_download_to_cache_dir does it: HEAD the resolve URL for the commit and the ETag, download the
// blob (following the LFS redirect, without the token) to blobs/<etag>.incomplete, resuming with Range,
// check it, rename it to blobs/<etag> and link snapshots/<commit>/<file> to it.
#pragma once
#include <filesystem>
#include <string>

#include "hub/hub_client.h"
#include "hub/hub_listing.h"

namespace soltrain {

// snapshots/<commit>/<file> of `r` (a symlink to its blob), downloaded when missing. Blobs whose etag is a
// sha256 (LFS files) are hashed as they arrive and refetched when the hash differs; an interrupted transfer
// resumes from the .incomplete file (here, up to 5 times, and in the next run). Concurrent processes
// (data-parallel ranks, a Python job) share the download through huggingface_hub's lock file,
// .locks/<repo folder>/<etag>.lock.
std::filesystem::path hub_download_file(const HubClient& c, const RepoRef& r, const std::string& commit,
                                        const std::string& file);

}  // namespace soltrain
