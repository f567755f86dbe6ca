// Which folders soltrain may write over: its own outputs (marked by a small file it writes into every folder
// it creates) and empty or missing ones. Anything else is the user's, and is refused unless they say so.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace soltrain {

// The marker soltrain writes into every folder it stages (models, adapters, checkpoints, shard folders)
// and into a run's output_dir. A folder holding it was written by soltrain and may be replaced by it.
inline constexpr const char* kOutputMarker = ".soltrain-output";

// Writes the marker into `dir` (which must exist); `what` says what kind of folder it is.
void mark_output_dir(const std::filesystem::path& dir, const std::string& what);

// True when `dir` is missing, empty, or holds the marker.
bool is_replaceable_output(const std::filesystem::path& dir);

// Before any work: `dir` may be written (created, or replaced as a whole) only if it is a soltrain output or
// empty, or if `overwrite` is set. A file there is never replaced by a folder. `flag` names the switch that
// allows it ("--overwrite", "overwrite_output_dir: true"; empty where there is none) in the message.
// UserError otherwise.
void check_output_dir(const std::filesystem::path& dir, bool overwrite, const std::string& flag,
                      const std::string& what);

// True when `inner` is `outer` or lies inside it (paths resolved through symlinks where they exist).
bool path_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

// An output folder that soltrain replaces and the inputs the run reads: refused (UserError) when an input
// lies inside the output or the output inside or equal to an input folder, so a run cannot write over
// what it reads. `output_key` names the setting in the message.
void check_output_apart_from_inputs(const std::filesystem::path& output, const std::string& output_key,
                                    const std::vector<std::pair<std::filesystem::path, std::string>>& inputs);

}  // namespace soltrain
