#include "run/stop_signals.h"

namespace nibble::train {

namespace {

volatile std::sig_atomic_t stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  stop_signal = sig;
}

}  // namespace

StopSignals::StopSignals() {
  stop_signal = 0;
  for (int i = 0; i < 2; ++i) {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    ::sigaction(kSignals[i], nullptr, &previous_[i]);
    installed_[i] = previous_[i].sa_handler != SIG_IGN && ::sigaction(kSignals[i], &action, nullptr) == 0;
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 2; ++i)
    if (installed_[i]) ::sigaction(kSignals[i], &previous_[i], nullptr);
}

int StopSignals::received() const { return stop_signal; }

}  // namespace nibble::train
