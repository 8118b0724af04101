// walrelay ctl: the operator's requests to a running walrelay's admin
// endpoint (status, pause, resume, restart), so that nobody writes curl lines.
#pragma once

#include <optional>
#include <string>

#include "walrelay/config.hpp"

namespace walrelay {

struct CtlOptions {
  std::string action;                   // status, pause, resume or restart
  std::string url;                      // the admin endpoint; empty: from the configuration's admin.listen
  std::optional<Config> config;         // walrelay's configuration, when given
  std::string token;                    // the Bearer token; empty: from the configuration
};

// The admin endpoint's base URL for admin.listen ("0.0.0.0:8080" is asked
// on loopback).
std::string admin_url(const std::string& listen);

// Sends the request, prints the answer's body; 0 when it is a 2xx, 1 when
// it is refused or the endpoint does not answer, 2 on a bad action.
int run_ctl(const CtlOptions& options);

}  // namespace walrelay
