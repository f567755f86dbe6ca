// A hub id → local files: the model folder (snapshot) with the files soltrain reads, or a dataset's data
// files. From the cache alone with HF_HUB_OFFLINE=1; otherwise the repository's file list for the revision
// (GET {endpoint}/api/{models|datasets}/{id}/revision/{revision}, as hf_api.py model_info / dataset_info)
// names the commit, and missing files are downloaded (hub_download.h).
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hub/hub_client.h"
#include "hub/hub_listing.h"

namespace soltrain {

// The files of a model soltrain reads: config.json, generation_config.json, tokenizer.json,
// tokenizer_config.json, special_tokens_map.json (those the repository has) and the safetensors weights
// (model.safetensors, or model.safetensors.index.json and every shard it names).
std::filesystem::path resolve_hub_model(const HubClient& c, const std::string& id, const std::string& revision);

// A dataset's data files of `split` (parquet, else JSONL / JSON / CSV / TSV, plain or .gz/.zst; the files
// whose names say the split, hub_listing.h), sorted by path; UserError when none holds it.
std::vector<std::filesystem::path> resolve_hub_dataset(const HubClient& c, const std::string& id,
                                                       const std::string& revision, const std::string& split = "train");

// The same with the choice made by `pick` from the repository's file list (`read` gives one of its files' text,
// fetched when missing; "" for one neither cached nor fetchable offline): e.g. the dataset card's configs and
// data_files (cli/hub_inputs.cpp). `what` names the selection in the error when `pick` chooses nothing.
using RepoFileReader = std::function<std::string(const std::string& file)>;
using DataFilePicker =
    std::function<std::vector<std::string>(const std::vector<std::string>& repo_files, const RepoFileReader& read)>;
std::vector<std::filesystem::path> resolve_hub_dataset(const HubClient& c, const std::string& id,
                                                       const std::string& revision, const DataFilePicker& pick,
                                                       const std::string& what);

// The same choice, nothing downloaded but what `pick` reads: each chosen file's place in the cache and what
// hub_download_file needs to fetch it there (a streamed dataset's files are fetched as the stream reaches each).
// Offline, only files already in the cache are chosen from.
struct HubDataFile {
  std::filesystem::path path;  // snapshots/<commit>/<file> (present once fetched)
  RepoRef repo;                // revision = the commit
  std::string file;            // the repository path
};
std::vector<HubDataFile> list_hub_dataset(const HubClient& c, const std::string& id, const std::string& revision,
                                          const DataFilePicker& pick, const std::string& what);

}  // namespace soltrain
