// Typed errors that end a Kareus operation. Library code throws; only `main` maps them to exit
// codes (InvalidInput -> 2, everything else -> 1). Expected outcomes such as an infeasible
// deadline are return values, not exceptions.
#pragma once

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

/// A bug or a broken invariant inside Kareus. Exit code 1.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace kareus
