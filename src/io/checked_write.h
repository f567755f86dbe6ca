// Appending to a log file (metrics.jsonl, TensorBoard events) with every write checked: on a full disk a
// run stops with one line instead of training on while its logs silently end mid-line.
#pragma once
#include <filesystem>
#include <fstream>
#include <string_view>

namespace soltrain {

// Writes `bytes` to `out` and flushes; UserError "<path>: cannot write <what> (reason)" when that fails.
// Test seam: with the environment variable SOLTRAIN_TEST_DISK_FULL_AFTER=N, writes fail as on a full disk
// once N bytes have been appended in this process (how the CLI tests fill a disk without root).
void append_checked(std::ofstream& out, std::string_view bytes, const std::filesystem::path& path, const char* what);

}  // namespace soltrain
