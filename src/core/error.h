// Errors: UserError is bad input or config (one clear line, exit code 2); anything else is our bug.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace soltrain {

// A mistake in what the user gave us (file, config, flag). The CLI prints its message and exits 2.
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The two kinds of UserError the Python API names apart (soltrain.ConfigError, soltrain.DataError); the CLI
// treats them as any UserError.
struct ConfigError : UserError {
  using UserError::UserError;
};
struct DataError : UserError {
  using UserError::UserError;
};

// Concatenates anything streamable; keeps error sites short without <format> (not in g++ 12).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

template <typename... Args>
[[noreturn]] void user_error(const Args&... args) {
  throw UserError(cat(args...));
}

// An internal invariant: a failure is a bug in soltrain, not the user's input.
#define SOLTRAIN_CHECK(cond, ...)                                                                                    \
  do {                                                                                                               \
    if (!(cond))                                                                                                     \
      throw std::logic_error(::soltrain::cat(__FILE__, ":", __LINE__, ": check failed: " #cond " ", ##__VA_ARGS__)); \
  } while (0)

}  // namespace soltrain
