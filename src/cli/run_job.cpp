#include "cli/run_job.h"

#include <cstdlib>

#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "core/error.h"
#include "dist/launch.h"
#include "train/output_guard.h"
#include "train/run_checks.h"
#include "train/run_dpo.h"

namespace soltrain {

RunResult run_job(TrainConfig cfg, TrainMode mode, std::ostream& log, LoopHooks hooks) {
  resolve_hub_inputs(cfg, log);
  if (cfg.dpo.enabled) {  // `soltrain dpo`, or an sft config with Axolotl's `rl: dpo`
    if (cfg.gpus > 1)
      user_error("dpo: data parallel (gpus: ", cfg.gpus, ") is not built yet for preference training; use gpus: 1");
    if (!cfg.dump_batches.empty()) user_error("--dump-batches is not built yet for dpo");
    check_run_inputs(cfg);
    prepare_run_outputs(cfg, log);
    auto ops = make_ops(cfg.device);
    return run_dpo(cfg, *ops, log, std::move(hooks));
  }
  const LaunchEnv env = read_launch_env();
  select_local_device(env, cfg.device);
  auto ops = make_ops(cfg.device);
  // SOLTRAIN_COMMUNICATOR=nccl (or mpi) runs that communicator even alone, for checks that it trains
  // bitwise as a single process does.
  const char* force = std::getenv("SOLTRAIN_COMMUNICATOR");
  auto comm = make_communicator(env, *ops, force ? force : "");
  if (comm->size() > 1) set_error_prefix(cat("rank ", comm->rank(), ": "));
  check_run_inputs(cfg);
  if (comm->rank() == 0) prepare_run_outputs(cfg, log);  // before any work: nothing the user had is written over
  comm->barrier();
  return run_training(cfg, mode, *ops, log, comm.get(), std::move(hooks));
}

}  // namespace soltrain
