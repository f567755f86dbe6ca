#include "cli/hub_inputs.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <optional>

#include "cli/dataset_card.h"
#include "hub/hub_cache.h"
#include "hub/hub_resolve.h"

namespace soltrain {

namespace {

// One entry per file, each of the split already.
void push_files(std::vector<DatasetSpec>& out, const DatasetSpec& d, const std::vector<std::filesystem::path>& files) {
  for (const auto& f : files) {
    DatasetSpec one = d;
    one.path = f;
    one.hub_id.clear();
    one.split.clear();
    one.name.clear();
    one.data_files.clear();
    out.push_back(std::move(one));
  }
}

// datasets.load_dataset's choice of a repository's files: data_files when given (the train split, as a list is
// read), else the card's configs (README.md: `name`, or the default config), else the files whose names say the
// split (hub_listing.h).
std::vector<std::string> pick_for(const DatasetSpec& d, const std::string& split, const std::vector<std::string>& files,
                                  const RepoFileReader& read) {
  const std::string where = cat("dataset ", d.hub_id.empty() ? d.path.string() : d.hub_id);
  if (!d.data_files.empty()) {
    if (split != "train")
      user_error(where, ": split: ", split,
                 ": data_files are read as the train split (as datasets reads a list of "
                 "files); drop split or data_files");
    return pick_data_files(files, d.data_files, where);
  }
  const bool card = std::find(files.begin(), files.end(), "README.md") != files.end();
  if (const auto patterns = card ? card_data_files(read("README.md"), d.name, split, where) : std::nullopt)
    return pick_data_files(files, *patterns, where);
  if (!d.name.empty())
    user_error(where, ": name: \"", d.name,
               "\": the dataset card (README.md) defines no configs; drop name, or "
               "choose files with data_files");
  return pick_dataset_files(files, split);
}

// `lazy` (a streamed run's training datasets): a hub dataset's files are chosen, each fetched only when the stream
// reaches it.
std::vector<DatasetSpec> resolve_datasets(const HubClient* hub, const std::vector<DatasetSpec>& in, std::ostream& log,
                                          bool lazy = false) {
  std::vector<DatasetSpec> out;
  for (const DatasetSpec& d : in) {
    const std::string split = d.split.empty() ? "train" : d.split;
    if (d.hub_id.empty() && d.data_files.empty() && d.name.empty()) {
      out.push_back(d);
      continue;
    }
    if (d.hub_id.empty()) {  // a local folder's data_files, relative to it
      namespace fs = std::filesystem;
      std::error_code ec;
      if (!d.name.empty()) user_error("dataset ", d.path.string(), ": name: picks a config of a hub dataset's card");
      if (!fs::is_directory(d.path, ec))
        user_error("dataset ", d.path.string(), ": data_files names files inside a folder or hub dataset; this is ",
                   fs::exists(d.path, ec) ? "a file" : "no folder");
      std::vector<std::string> files;
      for (const auto& e : fs::recursive_directory_iterator(d.path))
        if (e.is_regular_file()) files.push_back(e.path().lexically_relative(d.path).generic_string());
      std::vector<fs::path> chosen;
      for (const std::string& f : pick_for(d, split, files, [](const std::string&) { return std::string(); }))
        chosen.push_back(d.path / f);
      push_files(out, d, chosen);
      continue;
    }
    // the split's files are chosen here, by their names or the card's configs, as the hub's loader chooses them
    const std::string what = !d.data_files.empty() ? "data_files"
                             : d.name.empty()      ? cat("split \"", split, "\"")
                                                   : cat("config \"", d.name, "\" split \"", split, "\"");
    const auto pick = [&](const std::vector<std::string>& listed, const RepoFileReader& read) {
      return pick_for(d, split, listed, read);
    };
    if (lazy) {
      const auto files = list_hub_dataset(*hub, d.hub_id, d.revision, pick, what);
      size_t cached = 0;
      for (const HubDataFile& f : files) {
        std::error_code ec;
        cached += std::filesystem::exists(f.path, ec);
        push_files(out, d, {f.path});
        out.back().fetch = DatasetSpec::HubFetch{f.repo.id, f.repo.revision, f.file};
      }
      log << "dataset " << d.hub_id << ": " << files.size() << " file" << (files.size() == 1 ? "" : "s") << " in "
          << files.front().path.parent_path().string() << " (" << cached
          << " cached), streamed: each downloaded when training reaches it\n";
      continue;
    }
    const auto files = resolve_hub_dataset(*hub, d.hub_id, d.revision, pick, what);
    log << "dataset " << d.hub_id << ": " << files.size() << " file" << (files.size() == 1 ? "" : "s") << " in "
        << files.front().parent_path().string() << "\n";
    push_files(out, d, files);
  }
  return out;
}

}  // namespace

void resolve_hub_inputs(TrainConfig& c, std::ostream& log) {
  bool any = !c.model_hub_id.empty(), files = false;
  for (const auto* list : {&c.datasets, &c.validation_datasets})
    for (const DatasetSpec& d : *list) {
      any = any || !d.hub_id.empty();
      files = files || !d.data_files.empty() || !d.name.empty();
    }
  if (!any && !files) return;
  std::optional<HubClient> hub;
  if (any) hub = hub_client_from_env(log, &log == &std::cerr && ::isatty(2));
  if (!c.model_hub_id.empty()) {
    c.model = resolve_hub_model(*hub, c.model_hub_id, c.revision);
    log << "model " << c.model_hub_id << ": " << c.model.string() << "\n";
  }
  c.datasets = resolve_datasets(hub ? &*hub : nullptr, c.datasets, log, c.streaming);
  c.validation_datasets = resolve_datasets(hub ? &*hub : nullptr, c.validation_datasets, log);
}

std::filesystem::path local_or_hub_model(const std::string& arg, std::ostream& log) {
  std::error_code ec;
  if (std::filesystem::exists(arg, ec) || !looks_like_hub_id(arg)) return arg;
  return resolve_hub_model(hub_client_from_env(log, &log == &std::cerr && ::isatty(2)), arg, "main");
}

}  // namespace soltrain
