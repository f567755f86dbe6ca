// The --device flag shared by subcommands, and the backend it selects.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace soltrain {

void add_device_option(CLI::App* cmd, std::string& device);
// "cpu" (this build) or "cuda" (when built with SOLTRAIN_CUDA); anything else is a UserError.
std::unique_ptr<Ops> make_ops(const std::string& device);
std::unique_ptr<Ops> make_ops(Device device);

}  // namespace soltrain
