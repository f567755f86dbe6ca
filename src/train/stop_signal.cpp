#include "train/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>

namespace soltrain {

namespace {

std::atomic<int> g_signal{0};
struct sigaction g_old_int, g_old_term, g_old_hup;

extern "C" void on_stop_signal(int sig) {
  if (g_signal.exchange(sig) != 0) std::_Exit(128 + sig);  // the second request: no more waiting
  const char msg[] = "\nstopping after this step (saving a checkpoint); press Ctrl-C again to quit at once\n";
  [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);  // async-signal-safe, unlike iostreams
}

}  // namespace

StopSignal::StopSignal() {
  g_signal = 0;
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGHUP, &sa, &g_old_hup);  // the terminal or SSH session closed: save as for SIGTERM
}

StopSignal::~StopSignal() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGHUP, &g_old_hup, nullptr);
}

bool StopSignal::requested() {
  return g_signal.load() != 0;
}

int StopSignal::signal_number() {
  return g_signal.load();
}

}  // namespace soltrain
