// posix_spawnp with an argument vector: the library never hands a string to a shell.
#include "kareus/process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace kareus {

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& log_path) {
  ProcessResult r;
  if (argv.empty()) {
    r.error = "no program given";
    return r;
  }
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  const char* out = log_path.empty() ? "/dev/null" : log_path.c_str();
  posix_spawn_file_actions_addopen(&actions, 1, out, O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    r.error = fmt::format("could not start {}: {}", argv[0], std::strerror(rc));
    return r;
  }
  r.started = true;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      r.error = fmt::format("waiting for {}: {}", argv[0], std::strerror(errno));
      return r;
    }
  }
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    // posix_spawnp reports a program that exec could not run as exit code 127.
    if (r.exit_code != 0) r.error = fmt::format("{} exited with code {}", argv[0], r.exit_code);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
    r.error = fmt::format("{} was ended by signal {}", argv[0], r.signal);
  }
  return r;
}

}  // namespace kareus
