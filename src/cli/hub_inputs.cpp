#include "cli/hub_inputs.h"

#include <unistd.h>

#include <iostream>

#include "hub/hub_cache.h"
#include "hub/hub_resolve.h"

namespace soltrain {

namespace {

std::vector<DatasetSpec> resolve_datasets(const HubClient& hub, const std::vector<DatasetSpec>& in, std::ostream& log) {
  std::vector<DatasetSpec> out;
  for (const DatasetSpec& d : in) {
    if (d.hub_id.empty()) {
      out.push_back(d);
      continue;
    }
    // the split's files are chosen here, by their names, as the hub's loader chooses them
    const auto files = resolve_hub_dataset(hub, d.hub_id, d.revision, d.split.empty() ? "train" : d.split);
    log << "dataset " << d.hub_id << ": " << files.size() << " file" << (files.size() == 1 ? "" : "s") << " in "
        << files.front().parent_path().string() << "\n";
    for (const auto& f : files) {
      DatasetSpec one = d;
      one.path = f;
      one.hub_id.clear();
      one.split.clear();  // (each file is of that split already)
      out.push_back(std::move(one));
    }
  }
  return out;
}

}  // namespace

void resolve_hub_inputs(TrainConfig& c, std::ostream& log) {
  bool any = !c.model_hub_id.empty();
  for (const auto* list : {&c.datasets, &c.validation_datasets})
    for (const DatasetSpec& d : *list) any = any || !d.hub_id.empty();
  if (!any) return;
  const HubClient hub = hub_client_from_env(log, &log == &std::cerr && ::isatty(2));
  if (!c.model_hub_id.empty()) {
    c.model = resolve_hub_model(hub, c.model_hub_id, c.revision);
    log << "model " << c.model_hub_id << ": " << c.model.string() << "\n";
  }
  c.datasets = resolve_datasets(hub, c.datasets, log);
  c.validation_datasets = resolve_datasets(hub, c.validation_datasets, log);
}

std::filesystem::path local_or_hub_model(const std::string& arg, std::ostream& log) {
  std::error_code ec;
  if (std::filesystem::exists(arg, ec) || !looks_like_hub_id(arg)) return arg;
  return resolve_hub_model(hub_client_from_env(log, &log == &std::cerr && ::isatty(2)), arg, "main");
}

}  // namespace soltrain
