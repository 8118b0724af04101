#include "walrelay/sinks/owned_record.hpp"

namespace walrelay {

namespace {
std::optional<std::string> owned(std::optional<std::string_view> v) {
  return v ? std::optional<std::string>(std::string(*v)) : std::nullopt;
}
}  // namespace

void OwnedRecord::take(const OutboxRecord& record, std::uint64_t t) {
  token = t;
  bytes = record.size_bytes();
  topic.assign(record.topic);
  event_id.assign(record.event_id);
  key = owned(record.key);
  value = owned(record.value);
  for (auto& h : record.headers) headers.emplace_back(std::string(h.name), owned(h.value));
}

void OwnedRecord::take_dead_letter(std::string_view why, std::string_view to, std::optional<std::string_view> k,
                                   std::optional<std::string_view> v, const std::vector<OutboxRecord::Header>& hs,
                                   std::uint64_t t, std::size_t size) {
  token = t;
  bytes = size;
  topic.assign(to);
  key = owned(k);
  value = owned(v);
  for (auto& h : hs) {
    headers.emplace_back(std::string(h.name), owned(h.value));
    if (h.name == "id" && h.value) event_id.assign(*h.value);
  }
  dead_letter = true;
  reason.assign(why);
}

Delivery OwnedRecord::delivery(bool own_failure) const {
  Delivery d;
  d.token = token;
  d.bytes = bytes;
  d.dead_lettered = dead_letter;
  d.dead_letter_reason = reason;
  d.topic = topic;
  if (own_failure) {
    d.key = key;
    d.value = value;
    for (auto& [name, v] : headers) d.headers.push_back({name, v ? std::optional<std::string_view>(*v) : std::nullopt});
  }
  return d;
}

}  // namespace walrelay
