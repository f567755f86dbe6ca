// What the hub's answers say, parsed without the network (so the fuzz job can feed it anything): a
// repository's file list for a revision (hf_api.py model_info / dataset_info: "sha" and
// "siblings[].rfilename"), a safetensors index's shard names, and which of a dataset's files are its data.
#pragma once
#include <string>
#include <vector>

#include "hub/hub_cache.h"

namespace soltrain {

// The etag as huggingface_hub stores it (_normalize_etag): without a weak "W/" prefix and quotes.
std::string normalize_etag(std::string etag);

struct RepoListing {
  std::string commit;              // 40 hex
  std::vector<std::string> files;  // as listed; each name is checked where a file is downloaded
};

// The body of GET /api/{models|datasets}/{id}/revision/{rev}. UserError (naming `r` and `endpoint`) when it
// is not JSON of that shape or names no commit hash.
RepoListing parse_repo_listing(const std::string& body, const RepoRef& r, const std::string& endpoint);

// The shard files a model.safetensors.index.json names (its weight_map's values), sorted, each checked to
// stay inside the folder. UserError naming `where` otherwise.
std::vector<std::string> parse_shard_index(const std::string& text, const std::string& where);

// Which of a dataset repository's files hold `split` (parquet, else JSONL / JSON / CSV / TSV, plain or
// .gz/.zst; those whose names say the split, data/names_split; with no split in any name, every file is the
// train split), sorted; empty when none holds it.
std::vector<std::string> pick_dataset_files(const std::vector<std::string>& repo_files,
                                            const std::string& split = "train");

// datasets' data_files patterns over a repository's (or folder's) files: each pattern's files, a path equal to it
// or matching it as a glob (* and ? within a folder, ** across folders), sorted, in the patterns' order, each file
// once. A pattern that matches nothing is a UserError naming it and `where`, as datasets' FileNotFoundError.
std::vector<std::string> pick_data_files(const std::vector<std::string>& files,
                                         const std::vector<std::string>& patterns, const std::string& where);

}  // namespace soltrain
