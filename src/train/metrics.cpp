#include "train/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checked_write.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// JSON has no NaN or infinity: a diverged loss is written as null rather than as invalid JSON.
nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& output_dir, int64_t resume_step, bool tensorboard, TrackerBridge* trackers)
    : jsonl_(output_dir / "metrics.jsonl"), trackers_(trackers) {
  if (tensorboard) tb_.emplace(output_dir / "tensorboard");
  // A resumed run repeats the steps after its checkpoint: their old lines would be duplicates.
  if (resume_step == 0) fs::remove(jsonl_);  // a fresh run in a used folder starts a fresh log
  if (fs::exists(jsonl_)) {
    std::ifstream in(jsonl_);
    std::string kept, l;
    while (std::getline(in, l)) {
      try {
        if (nlohmann::json::parse(l).value("step", int64_t(0)) <= resume_step) kept += l + "\n";
      } catch (const nlohmann::json::exception&) {  // a line cut by a kill: dropped
      }
    }
    write_file_atomic(jsonl_, kept);
  }
  out_.open(jsonl_, std::ios::app);
  if (!out_) user_error(jsonl_.string(), ": cannot write metrics");
}

void MetricsLog::line(const std::string& json) {
  append_checked(out_, json + "\n", jsonl_, "the metrics log");
  if (trackers_) trackers_->row(json);
}

void MetricsLog::train(const StepMetrics& m) {
  nlohmann::json j{{"step", m.step},
                   {"epoch", number(m.epoch)},
                   {"loss", number(m.loss)},
                   {"learning_rate", number(m.lr)},
                   {"grad_norm", number(m.grad_norm)},
                   {"tokens", m.tokens},
                   {"tokens_per_s", number(m.tokens_per_s)},
                   {"mfu", number(m.mfu)}};
  for (const auto& [name, v] : m.extra) j[name] = number(v);
  line(j.dump());
  if (!tb_) return;
  tb_->scalar("train/loss", m.step, m.loss);
  tb_->scalar("train/learning_rate", m.step, m.lr);
  tb_->scalar("train/grad_norm", m.step, m.grad_norm);
  tb_->scalar("train/tokens_per_s", m.step, m.tokens_per_s);
  if (m.mfu > 0) tb_->scalar("train/mfu", m.step, m.mfu);
  for (const auto& [name, v] : m.extra) tb_->scalar("train/" + name, m.step, v);
}

void MetricsLog::eval(int64_t step, double loss, int64_t tokens) {
  line(nlohmann::json{{"step", step}, {"eval_loss", number(loss)}, {"eval_tokens", tokens}}.dump());
  if (tb_) tb_->scalar("eval/loss", step, loss);
}

void MetricsLog::eval_values(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  nlohmann::json j{{"step", step}};
  for (const auto& [name, v] : values) {
    j["eval_" + name] = number(v);
    if (tb_) tb_->scalar("eval/" + name, step, v);
  }
  line(j.dump());
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  char b[32];
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>(t / 60 % 60));
  else
    std::snprintf(b, sizeof b, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return b;
}

ProgressLine::ProgressLine(std::ostream& out) : out_(out), tty_(&out == &std::cerr && ::isatty(2)) {}

void ProgressLine::show(const StepMetrics& m) {
  char b[256];
  const double ktok = m.tokens_per_s / 1e3;
  int n = std::snprintf(b, sizeof b, "step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.1fk tok/s",
                        static_cast<long long>(m.step), static_cast<long long>(m.total_steps), m.loss, m.lr,
                        m.grad_norm, ktok);
  if (m.mfu > 0 && n > 0 && size_t(n) < sizeof b)
    n += std::snprintf(b + n, sizeof b - size_t(n), " | MFU %.1f%%", 100 * m.mfu);
  // DPO's two numbers that say whether it learns (TRL's names, shortened for the line)
  for (const auto& [name, v] : m.extra) {
    const char* shown = name == "rewards/accuracies" ? "acc" : name == "rewards/margins" ? "margin" : nullptr;
    if (shown && n > 0 && size_t(n) < sizeof b) n += std::snprintf(b + n, sizeof b - size_t(n), " | %s %.3f", shown, v);
  }
  if (m.gpu_memory_gib > 0 && n > 0 && size_t(n) < sizeof b)
    n += std::snprintf(b + n, sizeof b - size_t(n), " | mem %.1f GiB", m.gpu_memory_gib);
  if (n > 0 && size_t(n) < sizeof b)
    std::snprintf(b + n, sizeof b - size_t(n), " | ETA %s", format_duration(m.seconds_left).c_str());
  if (tty_) {
    out_ << "\r\033[K" << b << std::flush;  // clear to end of line: the new text may be shorter
    dirty_ = true;
  } else {
    out_ << b << "\n" << std::flush;
  }
}

ProgressLine::~ProgressLine() {
  if (dirty_) out_ << "\n" << std::flush;
}

void ProgressLine::message(const std::string& text) {
  if (dirty_) out_ << "\r\033[K";
  dirty_ = false;
  out_ << text << "\n" << std::flush;
}

std::string format_loss(double v) {
  return std::isfinite(v) ? cat(std::round(v * 1e4) / 1e4) : "n/a";
}

}  // namespace soltrain
