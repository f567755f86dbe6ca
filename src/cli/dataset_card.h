// A Hugging Face dataset card's configs (README.md's YAML header, `configs:`), as datasets.load_dataset reads them
// to choose a repository's files: each config's data_files per split (a path or glob, or a list of them; a bare
// path or list is the train split).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace soltrain {

// The data_files patterns of config `name`'s split `split`; nullopt when the card has no configs. With `name`
// empty: the config marked `default: true`, else the one named "default", else the only one. A name the card
// lacks, a card with several configs and no default, or a split the config lacks: UserError naming `where`.
std::optional<std::vector<std::string>> card_data_files(const std::string& readme, const std::string& name,
                                                        const std::string& split, const std::string& where);

}  // namespace soltrain
