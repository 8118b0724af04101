// Process exit codes, as --help, the docs and the supervisors' restart rules
// name them.
#pragma once

namespace walrelay {

inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1;  // could not run (--check found problems, an unexpected error)
inline constexpr int exit_config = 2;   // invalid configuration, before any connection
inline constexpr int exit_halted = 3;   // halted on something that needs a human; a restart would not help

}  // namespace walrelay
