// Records encoded by a schema registry's schemas (Avro, JSON Schema,
// Protobuf) in Confluent's wire format: magic byte 0, the schema id as four
// bytes big-endian, (Protobuf: the message's index path), the encoded value.
//
// The application writes JSON; the subject's registered schema decides the
// bytes. Schemas are fetched on a thread of their own and cached by subject
// and version, so the loop never waits on HTTP and a record does no request.
// A record whose schema is not here yet, or whose registry cannot be reached,
// waits (backpressure); only a payload that does not fit its schema is the
// record's own error.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "walrelay/backoff.hpp"
#include "walrelay/config.hpp"
#include "walrelay/route/outbox_mapper.hpp"

namespace walrelay {

class Metrics;

// A subject's schema as the registry's Confluent-compatible API returns it.
struct RegisteredSchema {
  int id = 0;
  int version = 0;
  std::string subject;
  std::string type = "AVRO";  // AVRO, JSON or PROTOBUF
  std::string text;
  std::size_t references = 0;
};

// What went wrong talking to the registry. reason is a metric label:
// unreachable, not_found, unauthorized, bad_response, bad_schema.
struct RegistryError : std::runtime_error {
  RegistryError(std::string reason_, const std::string& message) : std::runtime_error(message), reason(std::move(reason_)) {}
  std::string reason;
};

// One schema compiled for encoding. Not thread-safe: one per loop.
class SchemaCodec {
 public:
  virtual ~SchemaCodec() = default;
  // Appends the encoding of the JSON text `json` to `out`. An error is the
  // record's (reason schema_mismatch or bad_content) and names the field.
  virtual std::optional<MapError> encode(std::string_view json, std::string& out) = 0;
};
// Compiles a registered schema; throws RegistryError("bad_schema") when it
// cannot be used (not parseable, another format, references).
std::unique_ptr<SchemaCodec> make_schema_codec(RegistryFormat format, const RegisteredSchema& schema);
// The bytes before the encoded value: magic byte, id, and for Protobuf the
// index path of the message (its first, [0], written as one 0 byte).
std::string wire_prefix(RegistryFormat format, int schema_id);

// The registry's HTTP API (libcurl), blocking. The URLs are tried in order;
// the first that answers is used until it does not.
class RegistryClient {
 public:
  explicit RegistryClient(const SchemaRegistryConfig& config);
  ~RegistryClient();
  RegistryClient(const RegistryClient&) = delete;
  RegistryClient& operator=(const RegistryClient&) = delete;

  // GET /subjects/{subject}/versions/{version, or latest}. Throws RegistryError.
  RegisteredSchema get(const std::string& subject, std::optional<int> version);
  // GET /subjects: a round trip for --check. Throws RegistryError.
  void check();
  // Makes a blocking request give up soon (another thread stops the client).
  void cancel() { cancelled_ = true; }

 private:
  std::string request(const std::string& path, long& status);
  const SchemaRegistryConfig& config_;
  void* curl_ = nullptr;
  void* headers_ = nullptr;
  std::size_t preferred_ = 0;
  std::atomic<bool> cancelled_{false};
};

// The relay's side: encodes each record's value by its subject's schema.
// Lives on the loop; fetches run on a thread of their own.
class SchemaEncoder {
 public:
  enum class Status {
    encoded,  // record.value now holds the framed bytes
    pending,  // the schema is not here (yet): offer the record again later
    failed,   // the record's value does not fit: `error` says where
  };
  SchemaEncoder(boost::asio::io_context& loop, const Config& config, Metrics& metrics);
  ~SchemaEncoder();

  Status encode(OutboxRecord& record, MapError& error);
  // Why records wait on the registry now (for /readyz and the log), or empty.
  std::string problem() const;
  // Fetches the schema of `subject` now, blocking, for --check.
  static RegisteredSchema check(const Config& config, const std::string& subject);

 private:
  struct Entry {
    std::string subject;
    std::optional<int> version;
    std::unique_ptr<SchemaCodec> codec;
    std::string prefix;
    int id = 0;
    bool fetching = false;
    std::chrono::steady_clock::time_point retry_at{};
    std::string problem;
    Backoff backoff{std::chrono::milliseconds(500), std::chrono::milliseconds(30000)};
  };
  struct Shared;
  void fetch(Entry& entry);
  void fetched(const std::string& cache_key, std::optional<RegisteredSchema> schema, const RegistryError* error);

  boost::asio::io_context& loop_;
  const Config& config_;
  Metrics& metrics_;
  std::shared_ptr<Shared> shared_;
  struct ViewHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, Entry, ViewHash, std::equal_to<>> entries_;
  std::string key_buf_, value_buf_;
};

}  // namespace walrelay
