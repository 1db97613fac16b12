// Typed errors that end a Kareus operation. Library code throws; only `main` maps them to exit
// codes (InvalidInput -> 2, Interrupted -> 128 + signal, everything else -> 1). Expected outcomes
// such as an infeasible deadline are return values, not exceptions.
#pragma once

#include <csignal>
#include <stdexcept>
#include <string>

namespace kareus {

/// Base of every error Kareus throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The user's input (a file, a flag, a database) is wrong. The message names the source, the
/// field and what is allowed. Exit code 2.
class InvalidInput : public Error {
 public:
  using Error::Error;
};

/// A requested feature exists in the interface but not in this build (e.g. the CUDA backend
/// without CUDA). Exit code 2, since the user asked for something this build cannot do.
class NotSupported : public Error {
 public:
  using Error::Error;
};

/// An object used in the wrong state or order: an energy monitor's end_iteration without a
/// begin_iteration, an instruction ended that is not the open one, a monitor used after close.
/// A programming error of the caller; the C API returns KAREUS_ERR_STATE. Exit code 1.
class StateError : public Error {
 public:
  using Error::Error;
};

/// The user asked the run to stop (SIGINT, SIGTERM; kareus/interrupt.h). Thrown between
/// measurements, never inside one, so every measurement finished before the request is
/// committed. Exit code 128 + signal (130 for SIGINT, 143 for SIGTERM).
class Interrupted : public Error {
 public:
  explicit Interrupted(int signal) : Error(text(signal)), signal_(signal) {}
  int signal() const { return signal_; }
  /// "interrupted (SIGINT)", "interrupted (SIGTERM)", "interrupted (signal N)".
  static std::string text(int signal) {
    if (signal == SIGINT) return "interrupted (SIGINT)";
    if (signal == SIGTERM) return "interrupted (SIGTERM)";
    return "interrupted (signal " + std::to_string(signal) + ")";
  }

 private:
  int signal_;
};

/// A bug or a broken invariant inside Kareus. Exit code 1.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace kareus
