#include "cli/device_option.h"

#include "core/error.h"

namespace soltrain {

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
}

std::unique_ptr<Ops> make_ops(const std::string& device) {
  if (device == "cpu") return make_cpu_ops();
  user_error("--device ", device, ": this build of soltrain has no CUDA backend (rebuild with -DSOLTRAIN_CUDA=ON)");
}

}  // namespace soltrain
