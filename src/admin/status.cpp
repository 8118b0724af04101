// Names of the relay's lifecycle states, as /slot and /readyz print them.
#include "walrelay/admin/status.hpp"

namespace walrelay {

const char* to_string(RelayState state) {
  switch (state) {
    case RelayState::starting: return "starting";
    case RelayState::connecting: return "connecting";
    case RelayState::standby: return "standby";
    case RelayState::snapshot: return "snapshot";
    case RelayState::streaming: return "streaming";
    case RelayState::reconnecting: return "reconnecting";
    case RelayState::draining: return "draining";
    case RelayState::halted: return "halted";
    case RelayState::stopped: return "stopped";
  }
  return "unknown";
}

}  // namespace walrelay
