// The schema registry's HTTP API and the cache of compiled schemas (see
// schema_registry.hpp; the codecs are in schema_codecs.cpp).
#include "walrelay/route/schema_registry.hpp"

#include <curl/curl.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <nlohmann/json.hpp>

#include "walrelay/admin/metrics.hpp"

namespace walrelay {

namespace {

std::size_t append_body(char* data, std::size_t size, std::size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// Subjects go into the path: everything but unreserved characters escaped.
std::string escape_path(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The registry's error body, {"error_code": 40401, "message": "..."}, as a sentence.
std::string registry_message(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return body.substr(0, 200);
}

}  // namespace

RegistryClient::RegistryClient(const SchemaRegistryConfig& config) : config_(config) {
  static const bool global = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
  (void)global;
  curl_ = curl_easy_init();
  if (!curl_) throw RegistryError("unreachable", "libcurl could not be initialised");
  auto* list = curl_slist_append(nullptr, "Accept: application/vnd.schemaregistry.v1+json, application/json");
  if (!config_.bearer_token.empty())
    list = curl_slist_append(list, ("Authorization: Bearer " + config_.bearer_token).c_str());
  headers_ = list;
}

RegistryClient::~RegistryClient() {
  curl_slist_free_all(static_cast<curl_slist*>(headers_));
  curl_easy_cleanup(static_cast<CURL*>(curl_));
}

// One GET, trying each URL from the one that answered last. A transport
// error or a 5xx moves on to the next; any other answer is the answer.
std::string RegistryClient::request(const std::string& path, long& status) {
  auto* curl = static_cast<CURL*>(curl_);
  std::string last_error;
  for (std::size_t n = 0; n < config_.urls.size(); ++n) {
    const std::size_t i = (preferred_ + n) % config_.urls.size();
    const std::string url = config_.urls[i] + path;
    std::string body;
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, static_cast<curl_slist*>(headers_));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.request_timeout_ms));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.request_timeout_ms));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    // Stops a request in flight when the client is cancelled (shutdown).
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, this);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION,
                     +[](void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
                       return static_cast<RegistryClient*>(self)->cancelled_ ? 1 : 0;
                     });
    if (!config_.basic_auth_user_info.empty()) {
      curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(curl, CURLOPT_USERPWD, config_.basic_auth_user_info.c_str());
    }
    if (!config_.ssl_ca_location.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, config_.ssl_ca_location.c_str());
    if (!config_.ssl_certificate_location.empty())
      curl_easy_setopt(curl, CURLOPT_SSLCERT, config_.ssl_certificate_location.c_str());
    if (!config_.ssl_key_location.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, config_.ssl_key_location.c_str());
    if (!config_.ssl_key_password.empty()) curl_easy_setopt(curl, CURLOPT_KEYPASSWD, config_.ssl_key_password.c_str());
    if (!config_.ssl_verify) curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
    CURLcode rc = curl_easy_perform(curl);
    if (cancelled_) throw RegistryError("unreachable", "stopped");
    if (rc != CURLE_OK) {
      last_error = redact_url(config_.urls[i]) + ": " + curl_easy_strerror(rc);
      continue;
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 500) {
      last_error = redact_url(config_.urls[i]) + ": HTTP " + std::to_string(status) + " " + registry_message(body);
      continue;
    }
    preferred_ = i;
    return body;
  }
  throw RegistryError("unreachable", "the schema registry did not answer: " + last_error);
}

RegisteredSchema RegistryClient::get(const std::string& subject, std::optional<int> version) {
  const std::string path =
      "/subjects/" + escape_path(subject) + "/versions/" + (version ? std::to_string(*version) : "latest");
  long status = 0;
  std::string body = request(path, status);
  const std::string what = "subject \"" + subject + "\" version " + (version ? std::to_string(*version) : "latest");
  if (status == 404)
    throw RegistryError("not_found", "the schema registry has no " + what + " (" + registry_message(body) +
                                         "): register the schema, and walrelay goes on");
  if (status == 401 || status == 403)
    throw RegistryError("unauthorized", "the schema registry refused walrelay's credentials for " + what + " (HTTP " +
                                            std::to_string(status) + ")");
  if (status != 200)
    throw RegistryError("bad_response",
                        "the schema registry answered " + what + " with HTTP " + std::to_string(status) + ": " +
                            registry_message(body));
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("id") || !j["id"].is_number_integer() || !j.contains("schema") ||
      !j["schema"].is_string())
    throw RegistryError("bad_response", "the schema registry's answer for " + what + " has no id and schema: " +
                                            body.substr(0, 200));
  RegisteredSchema s;
  s.subject = subject;
  s.id = j["id"].get<int>();
  s.version = j.value("version", 0);
  s.text = j["schema"].get<std::string>();
  if (j.contains("schemaType") && j["schemaType"].is_string()) s.type = j["schemaType"].get<std::string>();
  if (j.contains("references") && j["references"].is_array()) s.references = j["references"].size();
  return s;
}

void RegistryClient::check() {
  long status = 0;
  std::string body = request("/subjects", status);
  if (status == 401 || status == 403)
    throw RegistryError("unauthorized", "the schema registry refused walrelay's credentials (HTTP " +
                                            std::to_string(status) + ")");
  if (status != 200)
    throw RegistryError("bad_response", "the schema registry answered GET /subjects with HTTP " +
                                            std::to_string(status) + ": " + registry_message(body));
}

// What the loop and the fetching thread share: the client (used on the
// thread only) and whether the encoder still exists.
struct SchemaEncoder::Shared {
  explicit Shared(const SchemaRegistryConfig& config) : client(config) {}
  RegistryClient client;
  boost::asio::thread_pool pool{1};
  bool alive = true;  // read and written on the loop only
};

SchemaEncoder::SchemaEncoder(boost::asio::io_context& loop, const Config& config, Metrics& metrics)
    : loop_(loop), config_(config), metrics_(metrics), shared_(std::make_shared<Shared>(config.registry)) {}

SchemaEncoder::~SchemaEncoder() {
  shared_->alive = false;
  shared_->client.cancel();
  shared_->pool.join();
}

SchemaEncoder::Status SchemaEncoder::encode(OutboxRecord& record, MapError& error) {
  if (!record.value) return Status::encoded;  // a tombstone stays one
  // The subject, and the version the row asks for, are the cache's key.
  const auto& reg = config_.registry;
  key_buf_.clear();
  if (reg.subject_strategy != SubjectNameStrategy::record) {
    key_buf_.append(record.topic);
    key_buf_ += '-';
  }
  if (reg.subject_strategy == SubjectNameStrategy::topic) {
    key_buf_ += "value";
  } else {
    if (!record.event_type || record.event_type->empty()) {
      error = {"null_value", "the event's type (" + config_.field_event_type +
                                 ") is NULL or empty: the record name strategy takes the subject from it"};
      return Status::failed;
    }
    key_buf_.append(*record.event_type);
  }
  const std::size_t subject_size = key_buf_.size();
  if (record.schema_version) {
    key_buf_ += '\n';
    key_buf_ += std::to_string(*record.schema_version);
  }
  auto it = entries_.find(std::string_view(key_buf_));
  if (it == entries_.end()) {
    Entry entry;
    entry.subject = key_buf_.substr(0, subject_size);
    entry.version = record.schema_version;
    it = entries_.emplace(key_buf_, std::move(entry)).first;
  }
  Entry& entry = it->second;
  if (!entry.codec) {
    if (!entry.fetching && std::chrono::steady_clock::now() >= entry.retry_at) fetch(entry);
    return Status::pending;
  }
  value_buf_.assign(entry.prefix);
  if (auto e = entry.codec->encode(*record.value, value_buf_)) {
    e->message = "subject \"" + entry.subject + "\" (schema id " + std::to_string(entry.id) + "): " + e->message;
    error = std::move(*e);
    return Status::failed;
  }
  record.value = value_buf_;
  return Status::encoded;
}

void SchemaEncoder::fetch(Entry& entry) {
  entry.fetching = true;
  auto shared = shared_;
  std::string key = key_buf_;
  std::string subject = entry.subject;
  auto version = entry.version;
  boost::asio::post(shared->pool, [this, shared, key, subject, version] {
    std::optional<RegisteredSchema> schema;
    std::optional<RegistryError> error;
    try {
      schema = shared->client.get(subject, version);
    } catch (const RegistryError& e) {
      error = e;
    }
    boost::asio::post(loop_, [this, shared, key, schema = std::move(schema), error = std::move(error)]() mutable {
      if (!shared->alive) return;
      fetched(key, std::move(schema), error ? &*error : nullptr);
    });
  });
}

void SchemaEncoder::fetched(const std::string& cache_key, std::optional<RegisteredSchema> schema,
                            const RegistryError* error) {
  auto it = entries_.find(cache_key);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  entry.fetching = false;
  std::optional<RegistryError> problem;
  if (error) problem = *error;
  if (schema) {
    try {
      entry.codec = make_schema_codec(config_.registry.format, *schema);
      entry.prefix = wire_prefix(config_.registry.format, schema->id);
      entry.id = schema->id;
      entry.problem.clear();
      entry.backoff.reset();
      metrics_.schema_registry_requests("ok").Increment();
      spdlog::info("schema registry: subject \"{}\" version {} is schema id {} ({})", schema->subject, schema->version,
                   schema->id, schema->type);
      return;
    } catch (const RegistryError& e) {
      problem = e;
    }
  }
  metrics_.schema_registry_requests(problem->reason).Increment();
  const auto delay = entry.backoff.next();
  entry.retry_at = std::chrono::steady_clock::now() + delay;
  entry.problem = problem->what();
  // Records of this subject wait: the stream is held (backpressure), never
  // dead-lettered, until the registry answers.
  spdlog::error("schema registry: {}; records of subject \"{}\" wait (the slot is not confirmed past them), next "
                "try in {} ms",
                entry.problem, entry.subject, delay.count());
}

std::string SchemaEncoder::problem() const {
  for (auto& [key, entry] : entries_)
    if (!entry.codec && !entry.problem.empty()) return entry.problem;
  return {};
}

RegisteredSchema SchemaEncoder::check(const Config& config, const std::string& subject) {
  RegistryClient client(config.registry);
  client.check();
  if (subject.empty()) return {};
  auto schema = client.get(subject, std::nullopt);
  make_schema_codec(config.registry.format, schema);
  return schema;
}

}  // namespace walrelay
