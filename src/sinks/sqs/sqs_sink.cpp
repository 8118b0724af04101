#include "walrelay/sinks/sqs/sqs_sink.hpp"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "walrelay/json.hpp"
#include "walrelay/sinks/http/http_config.hpp"
#include "walrelay/mutation.hpp"

namespace walrelay {

namespace {

std::string base64(std::string_view bytes) { return encode_base64(bytes); }

bool is_utf8(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

// An attribute's name as SQS takes it: letters, digits, '_', '-' and '.'
// (what else a header's name holds as '_'), no '.' first, last or twice in
// a row, not starting with AWS. or Amazon. (those get a '_' before them).
std::string attribute_name(std::string_view name) {
  std::string out(name.substr(0, 255));
  for (std::size_t i = 0; i < out.size(); ++i) {
    char& c = out[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) c = '_';
    if (c == '.' && (i == 0 || i + 1 == out.size() || out[i - 1] == '.')) c = '_';
  }
  auto starts = [&](std::string_view p) {
    return out.size() >= p.size() &&
           std::equal(p.begin(), p.end(), out.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); });
  };
  if (starts("aws.") || starts("amazon.")) out.insert(out.begin(), '_');
  if (out.empty()) out = "_";
  return out;
}

constexpr std::size_t max_attributes = 10;  // SQS's

// SQS's message attributes of a record: the key as "key", then its headers.
// An attribute cannot be empty: a header without a value is left out. Two
// headers of one name (after attribute_name) or more than 10 refuse the
// record (`clash` says why); a dead-letter copy keeps what fits instead, the
// key, the id and the reason first, and says when its body is base64.
struct Attributes {
  std::vector<std::pair<std::string, const std::string*>> list;
  std::string clash;
};
Attributes attributes_of(const HttpRequestSink::Entry& e, bool body_base64) {
  static const std::string yes = "true";
  Attributes out;
  auto add = [&](std::string name, const std::string* value) {
    for (auto& [n, v] : out.list)
      if (n == name) {
        if (out.clash.empty()) out.clash = "two message attributes would be named " + name;
        return;
      }
    out.list.emplace_back(std::move(name), value);
  };
  if (e.key && !e.key->empty()) add("key", &*e.key);
  if (!e.dead_letter) {
    for (auto& [name, value] : e.headers)
      if (value && !value->empty()) add(attribute_name(name), &*value);
    return out;
  }
  if (e.value && !body_base64 && !is_utf8(*e.value)) add("walrelay.value.base64", &yes);
  const std::string_view first[] = {"id", "walrelay.error.reason", "__connect.errors.topic",
                                    "__connect.errors.exception.message", "walrelay.value.dropped.bytes"};
  for (auto want : first)
    for (auto& [name, value] : e.headers)
      if (name == want && value && !value->empty()) add(attribute_name(name), &*value);
  for (auto& [name, value] : e.headers)
    if (value && !value->empty() && std::find(std::begin(first), std::end(first), name) == std::end(first))
      add(attribute_name(name), &*value);
  out.clash.clear();
  if (out.list.size() > max_attributes) out.list.resize(max_attributes);
  return out;
}


bool one_of(std::string_view code, std::initializer_list<std::string_view> codes) {
  return std::find(codes.begin(), codes.end(), code) != codes.end();
}

// An error answer's code ("com.amazonaws.sqs#QueueDoesNotExist" →
// QueueDoesNotExist) and message.
std::pair<std::string, std::string> error_of(const std::string& response) {
  auto j = nlohmann::json::parse(response, nullptr, false);
  std::string code, message;
  if (j.is_object()) {
    if (auto t = j.find("__type"); t != j.end() && t->is_string()) code = t->get<std::string>();
    for (const char* m : {"message", "Message"})
      if (auto t = j.find(m); t != j.end() && t->is_string()) message = t->get<std::string>();
  }
  if (auto hash = code.rfind('#'); hash != std::string::npos) code = code.substr(hash + 1);
  if (message.empty()) message = response.substr(0, 300);
  return {code, message};
}

// U+FFFE and U+FFFF written as JSON escapes: SQS refuses them in a body
// (the entry's own failure), but a parser that takes U+FFFF for the end of
// its input (ElasticMQ's) would refuse the whole call as malformed. Their
// UTF-8 bytes occur only inside the JSON's strings.
void escape_noncharacters(std::string& json) {
  for (std::size_t at = json.find("\xEF\xBF"); at != std::string::npos; at = json.find("\xEF\xBF", at + 1)) {
    if (at + 2 >= json.size()) break;
    const char last = json[at + 2];
    if (last != '\xBE' && last != '\xBF') continue;
    json.replace(at, 3, last == '\xBF' ? "\\uffff" : "\\ufffe");
  }
}

// The reason a refused record is dead-lettered under: Kafka's names where
// SQS says the same (the dead-letter copy then goes without the value, which
// its queue would refuse the same way), else SQS's code.
std::string reason_of(const std::string& code, const std::string& message) {
  if (one_of(code, {"MessageTooLong", "BatchRequestTooLong", "http_413"}) || message.find("MessageTooLong") != std::string::npos ||
      message.find("must be shorter than") != std::string::npos)
    return "msg_size_too_large";
  if (code == "InvalidMessageContents" || message.find("InvalidMessageContents") != std::string::npos)
    return "invalid_record";
  return code;
}

}  // namespace

SqsSink::SqsSink(boost::asio::io_context& io, SqsConfig config)
    : HttpRequestSink(io, Limits{.timeout_ms = config.timeout_ms,
                                 .connect_timeout_ms = config.connect_timeout_ms,
                                 .retries = config.retries,
                                 .retry_interval_ms = config.retry_interval_ms,
                                 .max_inflight_requests = config.max_inflight_requests,
                                 .max_pending = config.max_pending,
                                 .batch_entries = static_cast<std::size_t>(config.batch_size),
                                 // (base64 makes a body a third larger)
                                 .batch_bytes = static_cast<std::size_t>(config.body_base64 ? config.batch_max_bytes / 4 * 3
                                                                                            : config.batch_max_bytes),
                                 .response_bytes = 65536,
                                 .thread_name = "wr-sqs",
                                 .name = "sqs"}),
      config_(std::move(config)),
      sigv4_("aws:amz:" + config_.region + ":sqs") {
  start_worker();
}

SqsSink::~SqsSink() { stop_worker(); }

std::string SqsSink::url_of(std::string_view topic) const { return sqs_queue_url(config_, topic); }

// A FIFO queue keeps a group's order: the key's records go one at a time.
std::string SqsSink::order_slot(const Entry& e) const {
  if (!sqs_is_fifo(e.url)) return {};
  return e.url + '\n' + (e.key ? "k" + *e.key : std::string("n"));
}

// A dead-letter copy is never refused here: without its value it goes with
// the body null, a value that is not UTF-8 in base64 (saying so), its
// attributes cut to what fits. What the copy could not carry, the record's
// dead-letter reason and the log name.
std::string SqsSink::refusal_of(const Entry& e) const {
  if (e.dead_letter) return {};
  if (!e.value || e.value->empty()) return "SQS takes no empty message body, and the record's value is empty";
  if (!config_.body_base64 && !is_utf8(*e.value))
    return "the record's value is not UTF-8 text, and an SQS message body is text: set sink.sqs.body.base64=true "
           "for a binary format (Avro, Protobuf)";
  const auto attributes = attributes_of(e, config_.body_base64);
  if (!attributes.clash.empty()) return attributes.clash;
  if (attributes.list.size() > max_attributes) {
    std::string names;
    for (auto& [name, value] : attributes.list) names += (names.empty() ? "" : ", ") + name;
    return "SQS takes at most 10 message attributes, and the record has " + std::to_string(attributes.list.size()) +
           " (" + names + ")";
  }
  return {};
}

std::string SqsSink::describe(const Request& r) const {
  const Entry& e = r.entries.front();
  return "SendMessageBatch " + sqs_url_for_log(e.url) + " (topic " + e.topic + ")";
}

void SqsSink::sign(void* easy, curl_slist*& headers, const std::string& target) const {
  // (No "Expect:" line to turn 100-continue off: curl would sign the
  // header it does not send, and AWS would refuse the signature. curl asks
  // for 100-continue only above 1 MiB, past any call's size.)
  for (const std::string& line : {"X-Amz-Target: AmazonSQS." + target, std::string("Content-Type: application/x-amz-json-1.0"),
                                  config_.session_token.empty() ? std::string()
                                                                : "X-Amz-Security-Token: " + config_.session_token}) {
    if (line.empty()) continue;
    curl_slist* more = curl_slist_append(headers, line.c_str());
    if (!more) throw std::runtime_error("libcurl could not make a header");
    headers = more;
  }
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(easy, CURLOPT_USERNAME, config_.access_key_id.c_str());
  curl_easy_setopt(easy, CURLOPT_PASSWORD, config_.secret_access_key.c_str());
  if (!config_.ssl_ca_location.empty()) curl_easy_setopt(easy, CURLOPT_CAINFO, config_.ssl_ca_location.c_str());
}

// One SendMessageBatch call: each entry's Id its place in the call.
void SqsSink::prepare(Request& r) const {
  const std::string& queue = r.entries.front().url;
  const bool fifo = sqs_is_fifo(queue);
  Json entries = Json::array();
  for (std::size_t i = 0; i < r.entries.size(); ++i) {
    const Entry& e = r.entries[i];
    Json m = Json::object();
    m["Id"] = std::to_string(i);
    if (!e.value || e.value->empty()) m["MessageBody"] = "null";  // a dead-letter copy without its value
    else if (config_.body_base64 || !is_utf8(*e.value)) m["MessageBody"] = base64(*e.value);  // (refused unless a copy)
    else m["MessageBody"] = *e.value;
    Json attributes = Json::object();
    for (auto& [name, value] : attributes_of(e, config_.body_base64).list) {
      if (is_utf8(*value)) attributes[name] = {{"DataType", "String"}, {"StringValue", *value}};
      else attributes[name] = {{"DataType", "Binary"}, {"BinaryValue", base64(*value)}};
    }
    if (!attributes.empty()) m["MessageAttributes"] = std::move(attributes);
    if (fifo) {
      m["MessageGroupId"] = sqs_id_of(e.key ? *e.key : std::string_view("walrelay.no-key"));
      // Without an event id (a dead-letter copy of a logical message, of a
      // row whose id is null): an id of this record only. A restart sends
      // it again under another: at least once, never dropped as a repeat
      // of another record.
      m["MessageDeduplicationId"] =
          sqs_id_of(e.event_id.empty() ? unique_id(e) : e.event_id);
    }
    entries.push_back(std::move(m));
  }
  Json call = Json::object();
  call["QueueUrl"] = queue;
  call["Entries"] = std::move(entries);
  r.body = to_json_text(call);
  escape_noncharacters(r.body);
  CURL* easy = r.easy;
  curl_easy_setopt(easy, CURLOPT_URL, sqs_endpoint(queue).c_str());
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, r.body.c_str());
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  sign(easy, r.headers, "SendMessageBatch");
}

void SqsSink::judge(const Request& r, int curl_result, long status, std::vector<Verdict>& verdicts) const {
  const auto result = static_cast<CURLcode>(curl_result);
  if (result != CURLE_OK) {
    verdicts.assign(r.entries.size(),
                    Verdict{outcome_of_transfer(curl_result),
                            result == CURLE_OPERATION_TIMEDOUT ? "timed_out" : "connection_failed",
                            describe(r) + ": " + (r.error[0] ? std::string(r.error) : curl_easy_strerror(result))});
    return;
  }
  if (status != 200) {
    auto [code, message] = error_of(r.response);
    Verdict v;
    v.code = code.empty() ? "http_" + std::to_string(status) : code;
    v.message = describe(r) + " answered " + std::to_string(status) + (code.empty() ? "" : " " + code) + ": " + message;
    if (status == 403 || one_of(code, {"InvalidClientTokenId", "SignatureDoesNotMatch", "AccessDenied",
                                       "AccessDeniedException", "UnrecognizedClientException",
                                       "MissingAuthenticationToken", "IncompleteSignature", "InvalidSecurity",
                                       "ExpiredToken", "RequestExpired", "KMS.AccessDeniedException",
                                       "KmsAccessDenied", "KmsDisabled", "KmsNotFound", "KmsInvalidState",
                                       "KmsOptInRequired", "KmsInvalidKeyUsage", "InvalidAddress",
                                       "UnsupportedOperation"}) ||
        (status >= 300 && status < 400))
      // Credentials, the queue's key, the endpoint (a redirect: another
      // region's): walrelay's configuration, never the records' fault.
      v.outcome = Outcome::denied;
    else if ((status == 400 || status == 413) && !one_of(code, {"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue",
                                             "ThrottlingException", "RequestThrottled", "KmsThrottled",
                                             "KMS.ThrottlingException", "OverLimit", "ServiceUnavailable"}))
      // Refused whole for what an entry holds (too long together, a bad
      // attribute): alone, each is its own answer.
      v.outcome = r.entries.size() > 1 ? Outcome::alone : Outcome::record_error;
    else
      v.outcome = Outcome::transient;  // 5xx, throttled, a queue not there (yet), a redirect
    if (v.outcome == Outcome::record_error) v.code = reason_of(code, message);
    verdicts.assign(r.entries.size(), v);
    return;
  }
  verdicts.assign(r.entries.size(), Verdict{Outcome::transient, "no_verdict", describe(r) + ": the answer did not name the entry"});
  auto j = nlohmann::json::parse(r.response, nullptr, false);
  auto index_of = [&](const nlohmann::json& item) -> std::optional<std::size_t> {
    if (!item.is_object()) return std::nullopt;
    auto id = item.find("Id");
    if (id == item.end() || !id->is_string()) return std::nullopt;
    const std::string text = id->get<std::string>();
    if (text.empty() || text.size() > 2 || !std::all_of(text.begin(), text.end(), ::isdigit)) return std::nullopt;
    const std::size_t i = std::stoul(text);
    return i < r.entries.size() ? std::optional(i) : std::nullopt;
  };
  if (!j.is_object()) return;
  if (mutation::active(mutation::Break::sqs_call_ok_is_delivered)) {
    verdicts.assign(r.entries.size(), Verdict{});
    return;
  }
  if (auto ok = j.find("Successful"); ok != j.end() && ok->is_array())
    for (auto& item : *ok)
      if (auto i = index_of(item)) verdicts[*i] = Verdict{};
  if (auto failed = j.find("Failed"); failed != j.end() && failed->is_array())
    for (auto& item : *failed) {
      auto i = index_of(item);
      if (!i) continue;
      auto text = [&](const char* field) {
        auto f = item.find(field);
        return f != item.end() && f->is_string() ? f->get<std::string>() : std::string();
      };
      const std::string code = text("Code").empty() ? "Failed" : text("Code");
      auto fault = item.find("SenderFault");
      const bool sender = fault != item.end() && fault->is_boolean() && fault->get<bool>();
      const std::string message = text("Message");
      verdicts[*i] = Verdict{sender ? Outcome::record_error : Outcome::transient, sender ? reason_of(code, message) : code,
                             describe(r) + ": " + code + ": " + message};
    }
}

void SqsSink::check_connectivity(int timeout_ms) {
  // ListQueues answers when the endpoint is there and takes the credentials;
  // no event is sent.
  Request r;
  r.easy = curl_easy_init();
  if (!r.easy) throw std::runtime_error("libcurl could not make a request");
  const std::string endpoint = sqs_endpoint(sqs_queue_url(config_, "walrelay-check"));
  r.body = R"({"MaxResults":1})";
  std::string response;
  curl_easy_setopt(r.easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(r.easy, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(r.easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min(timeout_ms, config_.connect_timeout_ms)));
  curl_easy_setopt(r.easy, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(r.easy, CURLOPT_URL, endpoint.c_str());
  curl_easy_setopt(r.easy, CURLOPT_POSTFIELDS, r.body.c_str());
  curl_easy_setopt(r.easy, CURLOPT_ERRORBUFFER, r.error);
  curl_easy_setopt(r.easy, CURLOPT_WRITEFUNCTION, +[](char* data, std::size_t size, std::size_t n, void* user) {
    auto* out = static_cast<std::string*>(user);
    if (out->size() < 4096) out->append(data, std::min<std::size_t>(size * n, 4096 - out->size()));
    return size * n;
  });
  curl_easy_setopt(r.easy, CURLOPT_WRITEDATA, &response);
  sign(r.easy, r.headers, "ListQueues");
  const CURLcode result = curl_easy_perform(r.easy);
  if (result != CURLE_OK)
    throw std::runtime_error("ListQueues " + endpoint + ": " + (r.error[0] ? std::string(r.error) : curl_easy_strerror(result)));
  long status = 0;
  curl_easy_getinfo(r.easy, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) {
    auto [code, message] = error_of(response);
    // Signed right, but a send-only role may not list queues: the
    // credentials were taken, which is what this checks.
    if (one_of(code, {"AccessDenied", "AccessDeniedException"})) return;
    throw std::runtime_error("ListQueues " + endpoint + " answered " + std::to_string(status) + " " + code + ": " +
                             message + " (credentials from " + config_.credentials_source + ")");
  }
}

}  // namespace walrelay
