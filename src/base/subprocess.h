// Runs a shell command with bytes on its stdin and collects its stdout, with a time limit
// (GRPO's `command` reward). posix_spawn (safe in a process with threads); the child gets
// `/bin/sh -c COMMAND`, our stderr, and is killed (SIGKILL) when the limit passes.
#pragma once

#include <string>

namespace astrai {

struct SubprocessResult {
  int exit_code = -1;      // when the child exited normally
  int term_signal = 0;     // when a signal ended it (SIGKILL after a timeout)
  bool timed_out = false;
  std::string out;         // everything it wrote to stdout
};

// Throws astrai::Error when the command cannot be started. SIGPIPE is ignored process-wide
// from the first call (a child that exits without reading its input must not kill us).
SubprocessResult run_shell(const std::string& command, const std::string& input, double timeout_seconds);

}  // namespace astrai
