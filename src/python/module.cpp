// soltrain's native Python module: the config reader and the one run (cli/run_job.h) behind a thin binding.
// The Python package (python/soltrain) builds its configs and datasets into a config's text and calls run();
// the GIL is released while the run computes and taken back only for the caller's hooks. A UserError arrives
// as soltrain.ConfigError (the config), soltrain.DataError (the data) or soltrain.SoltrainError (the rest),
// each with the CLI's one line.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <iostream>
#include <optional>
#include <span>

#include "cli/config.h"
#include "cli/config_schema.h"
#include "cli/device_option.h"
#include "cli/peer_keys.h"
#include "cli/run_job.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/model_session.h"

namespace nb = nanobind;
using namespace soltrain;

namespace {

TrainMode mode_of(const std::string& m) {
  if (m == "sft") return TrainMode::kSft;
  if (m == "pt") return TrainMode::kPretrain;
  if (m == "dpo") return TrainMode::kDpo;
  if (m == "grpo") return TrainMode::kGrpo;
  throw UserError(cat("mode \"", m, "\": expected sft, pt, dpo or grpo"));
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

nb::dict run(ParsedConfig& p, nb::object on_log, nb::object on_evaluate, nb::object should_stop, nb::object rewards) {
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
  // GRPO's Python reward functions in this process: the request's JSON in, {"rewards"} or {"error"} out.
  InProcessRewards in_process;
  if (!rewards.is_none())
    in_process = [rewards](const std::string& request) {
      nb::gil_scoped_acquire gil;
      return nb::cast<std::string>(rewards(request));
    };
  RunResult r;
  {
    nb::gil_scoped_release release;
    r = run_job(p.config, p.mode, std::cerr, std::move(hooks), std::move(in_process));
  }
  nb::dict out;
  out["steps"] = r.steps;
  out["total_steps"] = r.total_steps;
  out["first_eval_loss"] = r.first_eval_loss;
  out["last_eval_loss"] = r.last_eval_loss;
  out["interrupted"] = r.interrupted;
  out["stopped_early"] = r.stopped_early;
  return out;
}

using Ids = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Weights = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A float32 [rows, seq] numpy array owning `v` (no copy: the vector moves into the array's owner).
nb::ndarray<nb::numpy, float, nb::ndim<2>> to_numpy(std::vector<float> v, size_t rows, size_t cols) {
  auto* owned = new std::vector<float>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::ndarray<nb::numpy, float, nb::ndim<2>>(owned->data(), {rows, cols}, owner);
}

// The model of a step-level session, its backend beside it (the Ops outlive the model they made).
struct Session {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<ModelSession> model;
};

HostBatch batch_of(const Session& s, const Ids& ids, const Ids& targets) {
  if (ids.shape(0) != targets.shape(0) || ids.shape(1) != targets.shape(1))
    throw UserError(cat("input_ids is ", ids.shape(0), " x ", ids.shape(1), " but targets is ", targets.shape(0), " x ",
                        targets.shape(1), ": give one target per token (-100 for none)"));
  const size_t n = ids.size();
  (void)s;
  return rows_batch(int(ids.shape(0)), int(ids.shape(1)), std::vector<int32_t>(ids.data(), ids.data() + n),
                    std::vector<int32_t>(targets.data(), targets.data() + n));
}

void bind_session(nb::module_& m) {
  nb::class_<Session>(m, "Session")
      .def(
          "__init__",
          [](Session* self, ParsedConfig& p, int rows) {
            auto ops = make_ops(p.config.device);
            std::unique_ptr<ModelSession> model;
            {
              nb::gil_scoped_release release;
              model = std::make_unique<ModelSession>(p.config, *ops, rows);
            }
            new (self) Session{std::move(ops), std::move(model)};
          },
          nb::arg("config"), nb::arg("rows"))
      .def_prop_ro("rows", [](const Session& s) { return s.model->rows(); })
      .def_prop_ro("seq_len", [](const Session& s) { return s.model->seq_len(); })
      .def_prop_ro("vocab_size", [](const Session& s) { return s.model->model_config().vocab_size; })
      .def("logprobs",
           [](Session& s, const Ids& ids, const Ids& targets) {
             HostBatch b = batch_of(s, ids, targets);
             std::vector<float> out;
             {
               nb::gil_scoped_release release;
               out = s.model->logprobs(b);
             }
             return to_numpy(std::move(out), ids.shape(0), ids.shape(1));
           })
      .def(
          "step",
          [](Session& s, const Ids& ids, const Ids& targets, std::optional<Weights> weights, float lr) {
            HostBatch b = batch_of(s, ids, targets);
            std::span<const float> w;
            if (weights) {
              if (weights->shape(0) != ids.shape(0) || weights->shape(1) != ids.shape(1))
                throw UserError(cat("weights is ", weights->shape(0), " x ", weights->shape(1), " but input_ids is ",
                                    ids.shape(0), " x ", ids.shape(1), ": give one weight per token"));
              w = {weights->data(), weights->size()};
            }
            nb::gil_scoped_release release;
            const double loss = s.model->step(b, w, lr);
            return std::make_pair(loss, s.model->grad_norm());
          },
          nb::arg("input_ids"), nb::arg("targets"), nb::arg("weights").none(), nb::arg("lr"))
      .def(
          "generate",
          [](Session& s, std::vector<std::vector<int32_t>> prompts, int max_new_tokens, float temperature, int top_k,
             float top_p, float min_p, float repetition_penalty, uint64_t seed, std::vector<int32_t> eos) {
            GenerationOptions o;
            o.max_new_tokens = max_new_tokens;
            o.sampling = {temperature, top_k, top_p, seed, min_p, repetition_penalty};
            o.eos_ids = std::move(eos);
            nb::gil_scoped_release release;
            return s.model->generate(prompts, o);
          },
          nb::arg("prompts"), nb::arg("max_new_tokens"), nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"),
          nb::arg("min_p"), nb::arg("repetition_penalty"), nb::arg("seed"), nb::arg("eos_ids"))
      .def("save", [](const Session& s, const std::string& out) {
        nb::gil_scoped_release release;
        s.model->save(out);
      });
}

// A model folder's tokenizer.json and chat template (tokenizer_config.json), as the engine tokenizes data.
struct TokenizerHandle {
  Tokenizer tok;
  std::filesystem::path folder;
};

void bind_tokenizer(nb::module_& m) {
  nb::class_<TokenizerHandle>(m, "Tokenizer")
      .def(
          "__init__",
          [](TokenizerHandle* self, const std::string& folder) {
            new (self) TokenizerHandle{Tokenizer::load(folder), std::filesystem::path(folder)};
          },
          nb::arg("folder"))
      .def("encode", [](TokenizerHandle& t, const std::string& text) { return t.tok.encode(text); })
      .def(
          "decode",
          [](const TokenizerHandle& t, const std::vector<int32_t>& ids, bool skip_special) {
            return t.tok.decode(ids, skip_special);
          },
          nb::arg("ids"), nb::arg("skip_special_tokens") = false)
      .def("token_to_id", [](const TokenizerHandle& t, const std::string& token) { return t.tok.token_to_id(token); })
      .def_prop_ro("vocab_size", [](const TokenizerHandle& t) { return t.tok.vocab_size(); })
      .def(
          "render_chat",
          [](const TokenizerHandle& t, const std::string& variables_json) {
            const ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(t.folder / "tokenizer_config.json");
            return tmpl.render(nlohmann::ordered_json::parse(variables_json));
          },
          nb::arg("variables_json"));
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
  m.def(
      "ray_settings",
      [](ParsedConfig& p) {
        const TrainConfig::RayJob& r = p.config.ray;
        nb::dict d, resources;
        for (const auto& [name, amount] : r.resources) resources[name.c_str()] = amount;
        d["enabled"] = r.enabled;
        d["address"] = r.address;
        d["num_workers"] = r.num_workers;
        d["resources"] = resources;
        return d;
      },
      nb::arg("config"),
      "A config's Ray job settings (use_ray, distributed) as the reader took them (soltrain/ray.py).");
  bind_session(m);
  bind_tokenizer(m);
  m.def(
      "evaluate",
      [](ParsedConfig& p) {
        JobEvaluation e;
        {
          nb::gil_scoped_release release;
          e = evaluate_job(p.config, std::cerr);
        }
        nb::dict d;
        d["eval_loss"] = e.loss;
        d["eval_tokens"] = e.tokens;
        d["model"] = e.model;
        return d;
      },
      nb::arg("config"), "The validation loss of what the job trained (cli/run_job.h evaluate_job).");
  m.def(
      "config_keys_json", [] { return config_keys_json().dump(); },
      "the config key table (soltrain config-keys --json)");
  m.def("peer_key_names", &peer_key_names, "the peers' keys soltrain reads (Axolotl, Surogate)");
  m.def("is_peer_key", &is_peer_key, nb::arg("key"),
        "whether soltrain reads this peer key (the named ones and the trackers' wandb_* / mlflow_* families)");
  m.def("run", &run, nb::arg("config"), nb::arg("on_log").none(), nb::arg("on_evaluate").none(),
        nb::arg("should_stop").none(), nb::arg("rewards").none() = nb::none(),
        "Runs the job in this process (resumable, checkpointed on a stop); returns its result. `rewards`: GRPO's "
        "Python reward functions, called with a request's JSON (soltrain/rewards.py).");
}
