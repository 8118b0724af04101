// Trace context text (see trace_context.hpp).
#include "walrelay/route/trace_context.hpp"

#include <algorithm>

namespace walrelay {
namespace {

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool all_zero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == '0'; });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\f' || s.front() == '\r' ||
                        s.front() == '\n'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\f' || s.back() == '\r' ||
                        s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

// java.util.Properties' escapes in a key or value: \t \n \r \f, \uXXXX
// (ASCII only: a trace context is ASCII), and \x for any other x.
bool unescape_properties(std::string_view in, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i == in.size()) return true;  // a trailing backslash continues a line; nothing follows it here
    switch (char e = in[i]) {
      case 't': out += '\t'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        if (i + 4 >= in.size()) return false;  // four digits must follow
        unsigned v = 0;
        for (std::size_t k = 1; k <= 4; ++k) {
          char h = in[i + k];
          v <<= 4;
          if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
          else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
          else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
          else return false;
        }
        if (v > 0x7f) return false;
        out += static_cast<char>(v);
        i += 4;
        break;
      }
      default: out += e;
    }
  }
  return true;
}

// tracestate: list-members of printable ASCII, at most 512 characters
// (W3C Trace Context, 3.3); its members are not taken apart.
bool valid_tracestate(std::string_view s) {
  if (s.size() > 512) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

}  // namespace

bool valid_traceparent(std::string_view v) {
  // version "-" trace-id "-" parent-id "-" trace-flags
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
  std::string_view version = v.substr(0, 2), trace_id = v.substr(3, 32), parent_id = v.substr(36, 16),
                   flags = v.substr(53, 2);
  if (!is_lower_hex(version) || version == "ff" || !is_lower_hex(trace_id) || !is_lower_hex(parent_id) ||
      !is_lower_hex(flags))
    return false;
  if (all_zero(trace_id) || all_zero(parent_id)) return false;
  // Version 00 is exactly these fields; a later one may append "-..." fields.
  if (version == "00") return v.size() == 55;
  return v.size() == 55 || v[55] == '-';
}

bool parse_trace_context(std::string_view text, std::string& traceparent, std::string& tracestate, std::string& why) {
  traceparent.clear();
  tracestate.clear();
  why.clear();
  const std::string_view whole = trim(text);
  if (whole.empty()) return false;
  if (whole.find('\n') == std::string_view::npos && whole.find('=') == std::string_view::npos &&
      whole.find(':') == std::string_view::npos) {
    // A plain traceparent.
    if (!valid_traceparent(whole)) {
      why = "\"" + std::string(whole.substr(0, 80)) + "\" is not a W3C traceparent";
      return false;
    }
    traceparent = whole;
    return true;
  }
  // Properties text, as java.util.Properties.store writes it.
  std::string key, value;
  bool have_parent = false;
  std::size_t pos = 0;
  while (pos <= whole.size()) {
    std::size_t end = whole.find('\n', pos);
    if (end == std::string_view::npos) end = whole.size();
    std::string_view line = trim(whole.substr(pos, end - pos));
    pos = end + 1;
    if (line.empty() || line[0] == '#' || line[0] == '!') continue;
    // The key ends at the first unescaped '=', ':' or blank.
    std::size_t k = 0;
    while (k < line.size() && line[k] != '=' && line[k] != ':' && line[k] != ' ' && line[k] != '\t') {
      if (line[k] == '\\') ++k;
      ++k;
    }
    std::string_view raw_key = line.substr(0, std::min(k, line.size()));
    std::string_view rest = k < line.size() ? line.substr(k) : std::string_view{};
    rest = trim(rest);
    if (!rest.empty() && (rest[0] == '=' || rest[0] == ':')) rest = trim(rest.substr(1));
    if (!unescape_properties(raw_key, key) || !unescape_properties(rest, value)) {
      why = "a line of the trace context has a malformed escape";
      return false;
    }
    if (key == "traceparent") {
      if (!valid_traceparent(value)) {
        why = "traceparent \"" + value.substr(0, 80) + "\" is not a W3C traceparent";
        return false;
      }
      traceparent = value;
      have_parent = true;
    } else if (key == "tracestate") {
      tracestate = value;
    }
  }
  if (!have_parent) {
    why = "the trace context has no traceparent";
    tracestate.clear();
    return false;
  }
  if (!valid_tracestate(tracestate)) {
    why = "tracestate is not printable ASCII of at most 512 characters: left out";
    tracestate.clear();
  }
  return true;
}

}  // namespace walrelay
