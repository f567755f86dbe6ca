#include "train/trackers.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "trackers_script.h"
#include "train/python_process.h"

namespace soltrain {

namespace {

// True when `python -c code` exits 0 (its output dropped).
bool python_ok(const std::string& code) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1), ::dup2(null, 2);
    const std::string py = python_command();
    ::execlp(py.c_str(), py.c_str(), "-c", code.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The run's settings as the trackers show them (wandb's config, mlflow's params).
nlohmann::json run_config(const TrainConfig& c) {
  return {{"model", c.model_hub_id.empty() ? c.model.string() : c.model_hub_id},
          {"learning_rate", c.learning_rate},
          {"lr_scheduler_type", to_string(c.lr_scheduler_type)},
          {"num_train_epochs", c.num_epochs},
          {"max_steps", c.max_steps},
          {"per_device_train_batch_size", c.per_device_train_batch_size},
          {"gradient_accumulation_steps", c.gradient_accumulation_steps},
          {"sequence_len", c.sequence_len},
          {"warmup_steps", c.warmup_steps},
          {"weight_decay", c.weight_decay},
          {"seed", c.seed},
          {"lora", c.lora.enabled},
          {"lora_r", c.lora.rank},
          {"lora_alpha", c.lora.alpha},
          {"output_dir", c.output_dir.string()}};
}

}  // namespace

TrackerBridge::TrackerBridge(const TrainConfig& c, std::ostream& log) : log_(log) {
  const Trackers& t = c.trackers;
  // Each tracker: its name in messages, the module it imports, its pip package, how to turn it off.
  struct Entry {
    bool on;
    const char *name, *module, *package, *off;
  };
  const Entry trackers[] = {{t.wandb, "wandb", "wandb", "wandb", "drop it from report_to"},
                            {t.mlflow, "mlflow", "mlflow", "mlflow", "drop it from report_to"},
                            {t.swanlab, "swanlab", "swanlab", "swanlab", "drop it from report_to"},
                            {t.otel, "OpenTelemetry (Prometheus)", "opentelemetry.exporter.prometheus",
                             "opentelemetry-exporter-prometheus", "set use_otel_metrics: false"}};
  std::string names;  // "wandb", "wandb, mlflow", ...
  for (const Entry& e : trackers) {
    if (!e.on) continue;
    if (!python_ok(std::string("import ") + e.module))
      user_error("report_to: ", e.module, ": its Python package is not installed for ", python_command(),
                 " (pip install ", e.package, "); or ", e.off, " (metrics.jsonl and TensorBoard hold every metric)");
    names += (names.empty() ? "" : ", ") + std::string(e.name);
  }
  nlohmann::json init = {{"config", run_config(c)}, {"output_dir", c.output_dir.string()}, {"run_name", t.run_name}};
  if (t.wandb) init["wandb"] = t.wandb_settings;
  if (t.mlflow) init["mlflow"] = t.mlflow_settings;
  if (t.swanlab) init["swanlab"] = t.swanlab_settings;
  if (t.otel) init["otel"] = {{"host", t.otel_host}, {"port", t.otel_port}};
  const PythonProcess proc = start_python(kTrackersScript, "report_to");
  pid_ = proc.pid;
  in_ = proc.in;
  const int from_child = proc.out;
  const std::string first = nlohmann::json{{"init", init}}.dump() + "\n";
  std::fwrite(first.data(), 1, first.size(), in_);
  std::fflush(in_);
  // Ready, or gone: a tracker that cannot start (a bad key, no network for an online run) says why on stderr.
  char buf[64] = {};
  size_t got = 0;
  pollfd p{from_child, POLLIN, 0};
  while (got < 6 && ::poll(&p, 1, 300'000) > 0) {
    const ssize_t n = ::read(from_child, buf + got, sizeof buf - 1 - got);
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(from_child);
  if (std::strncmp(buf, "ready", 5) != 0) {
    std::fclose(in_), in_ = nullptr;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    user_error("report_to: the trackers (", names, ") did not start: their message is above");
  }
  log_ << "report_to: " << names << " receive" << (names.find(',') == std::string::npos ? "s" : "")
       << " every metrics.jsonl row\n";
}

void TrackerBridge::row(const std::string& json_line) {
  if (broken_ || !in_) return;
  if (std::fputs(json_line.c_str(), in_) < 0 || std::fputc('\n', in_) < 0 || std::fflush(in_) != 0) {
    broken_ = true;  // (SIGPIPE is ignored: EPIPE here)
    log_ << "warning: report_to: the trackers' process ended; metrics.jsonl goes on holding every row\n";
  }
}

TrackerBridge::~TrackerBridge() {
  if (in_) std::fclose(in_);
  if (pid_ > 0) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      log_ << "warning: report_to: the trackers' process ended with an error (see above)\n";
  }
}

}  // namespace soltrain
