#include "cli/device_option.h"

#include "core/error.h"

namespace soltrain {

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
}

std::unique_ptr<Ops> make_ops(const std::string& device) {
  if (device == "cpu") return make_cpu_ops();
  if (device == "cuda") return make_cuda_ops();
  user_error("--device ", device, ": expected cpu or cuda");
}

}  // namespace soltrain

namespace soltrain {

std::unique_ptr<Ops> make_ops(Device device) {
  return device == Device::CUDA ? make_cuda_ops() : make_cpu_ops();
}

}  // namespace soltrain
