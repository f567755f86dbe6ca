#include "cli/saved_config.h"

#include <yaml-cpp/yaml.h>

#include "cli/config_schema.h"
#include "core/version.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// `p` made absolute against `base` (the working folder when empty); nothing when it is absolute already.
std::optional<std::string> absolute_from(const std::string& p, const fs::path& base) {
  if (p.empty() || fs::path(p).is_absolute()) return std::nullopt;
  return fs::absolute(base.empty() ? fs::path(p) : base / p).lexically_normal().string();
}

}  // namespace

std::string saved_config_text(const std::string& yaml, const std::vector<std::pair<std::string, Entry>>& entries,
                              bool overridden, const fs::path& base, const std::string& model_hub_id) {
  bool changed = overridden;
  YAML::Node out(YAML::NodeType::Map);
  for (const auto& [key, entry] : entries) {
    YAML::Node v = YAML::Clone(entry.node);
    const fs::path from = entry.where.rfind("--set", 0) == 0 ? fs::path() : base;
    const KeySpec* spec = find_config_key(key);
    const bool hub_model = spec && spec->name == "model" && !model_hub_id.empty();
    if (spec && spec->type == "path" && v.IsScalar() && !hub_model) {
      if (const auto a = absolute_from(v.Scalar(), from)) v = *a, changed = true;
    } else if (spec && spec->type == "datasets" && v.IsSequence()) {
      // A dataset's local path (a hub id is no file here and stays as written).
      for (size_t i = 0; i < v.size(); ++i) {
        YAML::Node d = v[i];
        YAML::Node p = d.IsMap() ? d["path"] : d;
        if (p && p.IsScalar())
          if (const auto a = absolute_from(p.Scalar(), from); a && fs::exists(*a)) {
            if (d.IsMap())
              d["path"] = *a;
            else
              v[i] = *a;
            changed = true;
          }
      }
    }
    out[key] = v;
  }
  if (!changed) return yaml;
  YAML::Emitter e;
  e << out;
  return cat("# soltrain ", soltrain_version(),
             ": this run's config as read (--set overrides applied, relative paths made absolute); it runs again as "
             "it is\n",
             e.c_str(), "\n");
}

}  // namespace soltrain
