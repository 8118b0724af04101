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

const char* connect_state(const StatusSnapshot& s) {
  switch (s.state) {
    case RelayState::halted: return "FAILED";
    case RelayState::standby: return "UNASSIGNED";
    case RelayState::snapshot: return "SNAPSHOTTING";  // a pause waits for the snapshot's end
    case RelayState::stopped: return "STOPPED";
    case RelayState::streaming:
      // Paused once reads have stopped at a transaction boundary.
      return s.pause && s.pause->reading_stopped ? "PAUSED" : "RUNNING";
    case RelayState::starting:
    case RelayState::connecting:
      return "STARTING";
    case RelayState::reconnecting:
    case RelayState::draining:
      return "RUNNING";
  }
  return "UNASSIGNED";
}

}  // namespace walrelay
