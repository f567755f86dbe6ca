#include "train/optimizer_settings.h"

#include "core/format.h"

namespace soltrain {

std::vector<SettingRefusal> optimizer_setting_refusals(const TrainConfig& c) {
  std::vector<SettingRefusal> r;
  if (c.bf16_stochastic_round) {  // what keeps or updates an fp32 master is not built over bf16 ones
    auto no = [&](const std::string& what) {
      r.push_back({"bf16_stochastic_round", cat("bf16_stochastic_round with ", what, " is not built yet")});
    };
    if (c.muon) no(c.normuon ? "optimizer: normuon" : "optimizer: muon");
    if (c.moments == Moments::Torchao4) no("optimizer: adamw_torch_4bit");
    if (c.offload.master) no("offload_master (the bf16 masters are the compute weights, kept on the device)");
    if (c.zero_stage >= 1) no(cat("zero_stage ", c.zero_stage, " (its sharded update keeps fp32 masters)"));
  }
  if (c.optimizer_in_backward) {  // (torchtune refuses the same: its optimizer_in_bwd neither clips nor accumulates)
    auto no = [&](const std::string& why) {
      r.push_back({"optimizer_in_backward", cat("optimizer_in_backward ", why)});
    };
    if (c.max_grad_norm > 0)
      no(
          cat("updates each layer before the global gradient norm is known, so it cannot clip: set max_grad_norm: 0 "
              "(got ",
              c.max_grad_norm, ")"));
    if (c.gradient_accumulation_steps > 1)
      no(
          cat("changes the weights during backward, so each update is one micro-batch: set "
              "gradient_accumulation_steps: 1 (got ",
              c.gradient_accumulation_steps, ")"));
    if (c.gpus > 1 || c.zero_stage >= 1)
      no("with data parallel is not built yet (each layer's gradients would be reduced over the ranks before its "
         "update): run one process");
    if (c.offload.grads) no("keeps no layer gradients to offload: drop offload_grads");
    if (c.grpo.generation_overlap)
      no("changes the weights the overlapped generation reads before it ends: drop generation_overlap");
  }
  const bool offloaded_state = c.offload.optimizer || c.offload.master || c.offload.grads;
  if (c.moments == Moments::Torchao4 && offloaded_state)
    r.push_back({"optimizer", "optimizer: adamw_torch_4bit with offloaded optimizer state is not built yet"});
  if (c.muon && offloaded_state)
    r.push_back({"optimizer", cat("optimizer: ", c.normuon ? "normuon" : "muon",
                                  " with offloaded optimizer state is not built yet")});
  return r;
}

}  // namespace soltrain
