// A Kafka Connect or Debezium connector configuration, read as walrelay's.
//
// Users migrating from Debezium have a connector's properties file, or the
// JSON that Kafka Connect's REST API takes ({"name": ..., "config": {...}}).
// Both are read as they are: the Outbox Event Router's keys under
// transforms.<name>.* become walrelay's own, keys that only Connect or
// Debezium's change-event machinery use are noted once and dropped, and
// what walrelay does not do is refused naming the key, why, and what to do
// instead. No I/O: text in, settings and notes out.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace walrelay {

// One key=value as written, with where it was written ("file:12").
struct RawSetting {
  std::string key;
  std::string value;
  std::string origin;
};

// Settings of a JSON configuration: Connect's REST body ({"name": ...,
// "config": {...}}) or a bare object of settings. nullopt when the text is
// not a JSON object (a properties file); ConfigError when it is one that
// does not parse or holds a value that is not a string, number or boolean.
std::optional<std::vector<RawSetting>> parse_connect_json(const std::string& text, const std::string& source_name);

// Rewrites Debezium's and Connect's keys into walrelay's, in place: the
// router's transforms.<name>.* lose their prefix, keys with no meaning here
// are removed and described in `notes` (one sentence each, for the log at
// start). Throws ConfigError naming the key for what walrelay refuses.
void translate_connect_keys(std::vector<RawSetting>& settings, std::vector<std::string>& notes);

}  // namespace walrelay
