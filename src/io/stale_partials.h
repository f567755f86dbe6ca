// Leftovers of a process killed mid-write: `.NAME.partial-PID` / `.NAME.tmp-PID` (staged folders and
// files, see atomic_file.h) and `.NAME.old-PID` (a replaced folder not yet removed). Once their process
// is gone they are cleaned up at the start of the next run that writes in the same folder.
#pragma once
#include <filesystem>
#include <ostream>

namespace soltrain {

// In `dir` (not recursive): removes partial/tmp leftovers whose PID no longer runs, and puts an `.old-PID`
// folder back under its name when that name is missing (the kill came between the two renames of a
// replace, so it is the only copy). Says what it did on `log`. Returns how many entries it handled.
int clean_stale_partials(const std::filesystem::path& dir, std::ostream& log);

}  // namespace soltrain
