// Ctrl-C, SIGTERM and SIGHUP during training: the first one asks the loop to stop after the current step (it then
// saves a checkpoint and exits 130); a second one ends the process at once.
#pragma once

namespace soltrain {

class StopSignal {
 public:
  StopSignal();   // installs the SIGINT / SIGTERM / SIGHUP handlers
  ~StopSignal();  // restores the previous ones
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;
  static bool requested();
  static int signal_number();  // the signal that asked, 0 if none
};

}  // namespace soltrain
