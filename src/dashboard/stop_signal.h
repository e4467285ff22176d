// SIGINT / SIGTERM for the dashboard's commands: while a StopSignal lives, either signal is
// recorded instead of ending the process, and wait() returns once one arrived. The trainer
// installs its own handlers for the run and restores these after it.
#pragma once

namespace astrai::dashboard {

class StopSignal {
 public:
  StopSignal();
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  int wait();            // blocks until SIGINT or SIGTERM arrives; returns its number
  int received() const;  // the signal that arrived, 0 while none
};

}  // namespace astrai::dashboard
