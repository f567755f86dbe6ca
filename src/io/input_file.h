// Files soltrain reads as input (configs, JSON, tokenizer and template files, datasets, hub refs and tokens).
// Only regular files are opened: a FIFO would block the run forever and /dev/zero (or a symlink to it) would
// be read forever. A file read whole must fit in host memory. Every refusal is one line naming the file.
#pragma once
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

namespace soltrain {

// UserError "<path>: not a regular file (a FIFO|device|folder|socket); <what> must be a file" when `p`
// exists (links followed) and is not a regular file. A missing file passes: each caller words that itself.
void refuse_special_file(const std::filesystem::path& p, std::string_view what);

// The whole file, after refuse_special_file and a host-memory check of its size that names it; UserError
// "<path>: cannot open (missing or unreadable)" when it cannot be read.
std::string read_input_file(const std::filesystem::path& p, std::string_view what);

// An open stream on a regular file (refuse_special_file first); nullptr when it cannot be opened.
std::unique_ptr<std::ifstream> open_input_file(const std::filesystem::path& p, std::string_view what);

}  // namespace soltrain
