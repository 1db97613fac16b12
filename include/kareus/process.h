// Child processes without a shell: the program and its arguments are an argument vector, so no
// character in a path (quotes, `;`, `$()`, spaces) can ever be read as a command.
#pragma once

#include <string>
#include <vector>

namespace kareus {

struct ProcessResult {
  bool started = false;  ///< false: the program could not be executed (see `error`)
  int exit_code = -1;    ///< when it exited normally
  int signal = 0;        ///< when a signal ended it
  std::string error;     ///< why it failed to start, or how it ended, in words
  bool ok() const { return started && signal == 0 && exit_code == 0; }
};

/// Runs argv[0] (looked up in PATH when it has no '/') with its standard output and error
/// appended to `log_path` (or discarded when empty), standard input from /dev/null, and waits.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path);

}  // namespace kareus
