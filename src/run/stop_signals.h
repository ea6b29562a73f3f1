// SIGINT / SIGTERM (Ctrl-C, a scheduler's warning before preemption) during training: the first
// asks the loop to finish its step, write a checkpoint and stop; a second ends the process at once.
#pragma once
#include <csignal>

namespace nibble::train {

// Installs the handler for the training loop and restores the previous handlers after it. A signal
// ignored at start stays ignored: a shell starts background jobs with SIGINT ignored so that Ctrl-C
// in the terminal does not reach them.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since construction, or 0.
  int received() const;

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction previous_[2] {};
  bool installed_[2] = {false, false};
};

}  // namespace nibble::train
