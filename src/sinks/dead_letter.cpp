// Dead-letter records (see dead_letter.hpp).
#include "walrelay/sinks/dead_letter.hpp"

namespace walrelay {

std::vector<OutboxRecord::Header> DeadLetter::header_views() const {
  std::vector<OutboxRecord::Header> out;
  out.reserve(headers.size());
  // std::string's storage is NUL-terminated, as librdkafka wants header names.
  for (auto& [name, value] : headers)
    out.push_back({name, value ? std::optional<std::string_view>(*value) : std::nullopt});
  return out;
}

DeadLetter unmappable_row(const OutboxMapper& mapper, const pgoutput::Insert& insert, const MapError& error,
                          pgoutput::Lsn lsn, bool context_headers) {
  DeadLetter d;
  d.reason = error.reason;
  d.value = mapper.row_json(insert);
  if (context_headers) {
    d.headers.emplace_back("__connect.errors.exception.class.name", "walrelay.MappingError");
    d.headers.emplace_back("__connect.errors.exception.message", error.message);
    d.headers.emplace_back("walrelay.error.reason", error.reason);
    d.headers.emplace_back("walrelay.source.table", std::string(mapper.table_name(insert.relation_oid)));
    d.headers.emplace_back("walrelay.source.lsn", lsn.to_string());
  }
  d.headers.emplace_back("id", mapper.event_id_of(insert));
  return d;
}

DeadLetter unmappable_message(const pgoutput::LogicalMessage& message, const MapError& error, bool context_headers) {
  DeadLetter d;
  d.reason = error.reason;
  d.value = std::string(reinterpret_cast<const char*>(message.content.data()), message.content.size());
  if (context_headers) {
    d.headers.emplace_back("__connect.errors.exception.class.name", "walrelay.MappingError");
    d.headers.emplace_back("__connect.errors.exception.message", error.message);
    d.headers.emplace_back("walrelay.error.reason", error.reason);
    d.headers.emplace_back("walrelay.source.message.prefix", std::string(message.prefix));
    d.headers.emplace_back("walrelay.source.message.transactional", message.transactional() ? "true" : "false");
    d.headers.emplace_back("walrelay.source.lsn", message.lsn.to_string());
  }
  return d;
}

DeadLetter refused_record(const Delivery& delivery, bool context_headers) {
  DeadLetter d;
  d.reason = delivery.error_code;
  if (delivery.key) d.key = std::string(*delivery.key);
  const bool drop_value = delivery.error_code == "msg_size_too_large" ||
                          delivery.error_code == "record_list_too_large" || delivery.error_code == "invalid_record";
  if (delivery.value && !drop_value) d.value = std::string(*delivery.value);
  for (auto& h : delivery.headers)
    d.headers.emplace_back(std::string(h.name), h.value ? std::optional<std::string>(*h.value) : std::nullopt);
  if (context_headers) {
    d.headers.emplace_back("__connect.errors.topic", std::string(delivery.topic));
    d.headers.emplace_back("__connect.errors.exception.class.name", "walrelay.DeliveryError");
    d.headers.emplace_back("__connect.errors.exception.message", delivery.error_message);
    d.headers.emplace_back("walrelay.error.reason", delivery.error_code);
    if (drop_value)
      d.headers.emplace_back("walrelay.value.dropped.bytes",
                             std::to_string(delivery.value ? delivery.value->size() : 0));
  }
  return d;
}

}  // namespace walrelay
