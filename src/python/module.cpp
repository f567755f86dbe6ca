// soltrain's native Python module: the config reader and the one run (cli/run_job.h) behind a thin binding.
// The Python package (python/soltrain) builds its configs and datasets into a config's text and calls run();
// the GIL is released while the run computes and taken back only for the caller's hooks. A UserError arrives
// as soltrain.ConfigError (the config), soltrain.DataError (the data) or soltrain.SoltrainError (the rest),
// each with the CLI's one line.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <iostream>

#include "cli/config.h"
#include "cli/run_job.h"
#include "core/error.h"

namespace nb = nanobind;
using namespace soltrain;

namespace {

TrainMode mode_of(const std::string& m) {
  if (m == "sft") return TrainMode::kSft;
  if (m == "pt") return TrainMode::kPretrain;
  if (m == "dpo") return TrainMode::kDpo;
  throw UserError(cat("mode \"", m, "\": expected sft, pt or dpo"));
}

// A config read and checked, held for run(): the Python side sees only its text's verdict.
struct ParsedConfig {
  TrainConfig config;
  TrainMode mode;
};

nb::dict metrics_dict(const StepMetrics& m) {
  nb::dict d;
  d["step"] = m.step;
  d["total_steps"] = m.total_steps;
  d["loss"] = m.loss;
  d["learning_rate"] = m.lr;
  d["grad_norm"] = m.grad_norm;
  d["epoch"] = m.epoch;
  d["tokens"] = m.tokens;
  d["tokens_per_second"] = m.tokens_per_s;
  if (m.mfu > 0) d["mfu"] = m.mfu;
  if (m.gpu_memory_gib > 0) d["gpu_memory_gib"] = m.gpu_memory_gib;
  for (const auto& [k, v] : m.extra) d[k.c_str()] = v;
  return d;
}

nb::dict run(ParsedConfig& p, nb::object on_log, nb::object on_evaluate, nb::object should_stop) {
  LoopHooks hooks;
  // Each hook takes the GIL for the call only; a Python exception in one ends the run and is raised as itself.
  if (!on_log.is_none())
    hooks.on_log = [on_log](const StepMetrics& m) {
      nb::gil_scoped_acquire gil;
      on_log(metrics_dict(m));
    };
  if (!on_evaluate.is_none())
    hooks.on_evaluate = [on_evaluate](int64_t step, const RunDriver::Evaluation& e) {
      nb::gil_scoped_acquire gil;
      nb::dict d;
      d["step"] = step;
      d["eval_loss"] = e.loss;
      d["eval_tokens"] = e.tokens;
      for (const auto& [k, v] : e.extra) d[("eval_" + k).c_str()] = v;
      on_evaluate(d);
    };
  if (!should_stop.is_none())
    hooks.should_stop = [should_stop]() {
      nb::gil_scoped_acquire gil;
      return nb::cast<bool>(should_stop());
    };
  RunResult r;
  {
    nb::gil_scoped_release release;
    r = run_job(p.config, p.mode, std::cerr, std::move(hooks));
  }
  nb::dict out;
  out["steps"] = r.steps;
  out["total_steps"] = r.total_steps;
  out["first_eval_loss"] = r.first_eval_loss;
  out["last_eval_loss"] = r.last_eval_loss;
  out["interrupted"] = r.interrupted;
  return out;
}

}  // namespace

NB_MODULE(_soltrain, m) {
  m.doc() = "soltrain's native engine (use the soltrain package, not this module)";
  static nb::exception<UserError> soltrain_error(m, "SoltrainError", PyExc_ValueError);
  static nb::exception<ConfigError> config_error(m, "ConfigError", soltrain_error.ptr());
  static nb::exception<DataError> data_error(m, "DataError", soltrain_error.ptr());
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      PyErr_SetString(config_error.ptr(), e.what());
    } catch (const DataError& e) {
      PyErr_SetString(data_error.ptr(), e.what());
    } catch (const UserError& e) {
      PyErr_SetString(soltrain_error.ptr(), e.what());
    } catch (const std::filesystem::filesystem_error& e) {  // a path the user gave (as the CLI's exit 2)
      PyErr_SetString(soltrain_error.ptr(), e.what());
    }
  });
  nb::class_<ParsedConfig>(m, "ParsedConfig");
  m.def(
      "parse_config",
      [](const std::string& yaml, const std::string& where, const std::vector<std::string>& overrides,
         const std::string& mode) {
        try {
          return ParsedConfig{parse_train_config(yaml, where, overrides, mode_of(mode)), mode_of(mode)};
        } catch (const UserError& e) {
          throw ConfigError(e.what());
        }
      },
      nb::arg("yaml"), nb::arg("where"), nb::arg("overrides"), nb::arg("mode"),
      "Reads a config's YAML text (paths relative to where's folder); ConfigError with the CLI's line.");
  m.def("run", &run, nb::arg("config"), nb::arg("on_log").none(), nb::arg("on_evaluate").none(),
        nb::arg("should_stop").none(),
        "Runs the job in this process (resumable, checkpointed on a stop); returns its result.");
}
