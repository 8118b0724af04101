// walrelay ctl: one request to the admin endpoint over libcurl (ctl.hpp).
#include "walrelay/commands/ctl.hpp"

#include <cstdio>
#include <iostream>
#include <memory>

#include <curl/curl.h>

namespace walrelay {
namespace {

struct Request {
  const char* method;
  const char* path;
  bool control;  // needs admin.control.token
};

// The request for an action, or nullopt.
std::optional<Request> request_for(const std::string& action) {
  if (action == "status") return Request{"GET", "/status", false};
  if (action == "pause") return Request{"POST", "/pause", true};
  if (action == "resume") return Request{"POST", "/resume", true};
  if (action == "restart") return Request{"POST", "/restart", true};
  return std::nullopt;
}

std::size_t append_body(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// The token to present: the one given, else the configuration's, the
// operator's for a control request and the readers' (or the operator's)
// for status.
std::string token_for(const CtlOptions& o, const Request& r) {
  if (!o.token.empty() || !o.config) return o.token;
  if (r.control) return o.config->admin_control_token;
  return o.config->admin_token.empty() ? o.config->admin_control_token : o.config->admin_token;
}

}  // namespace

std::string admin_url(const std::string& listen) {
  const auto colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  const std::string port = colon == std::string::npos ? "8080" : listen.substr(colon + 1);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  return "http://" + host + ":" + port;
}

int run_ctl(const CtlOptions& o) {
  auto request = request_for(o.action);
  if (!request) {
    std::cerr << "walrelay ctl: unknown action \"" << o.action << "\": expected status, pause, resume or restart\n";
    return 2;
  }
  std::string base = o.url.empty() && o.config ? admin_url(o.config->admin_listen) : o.url;
  if (base.empty()) {
    std::cerr << "walrelay ctl: give --config (walrelay's file: admin.listen and the tokens) or --url\n";
    return 2;
  }
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string url = base + request->path;
  const std::string token = token_for(o, *request);
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(nullptr, curl_slist_free_all);
  curl_slist* list = curl_slist_append(nullptr, "User-Agent: walrelay-ctl");
  if (!token.empty()) list = curl_slist_append(list, ("Authorization: Bearer " + token).c_str());
  headers.reset(list);
  std::string body;
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_CUSTOMREQUEST, request->method);
  if (std::string(request->method) == "POST") curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDS, "");
  curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(curl.get());
  if (rc != CURLE_OK) {
    std::cerr << "walrelay ctl: " << request->method << " " << url << ": " << curl_easy_strerror(rc) << "\n";
    return 1;
  }
  long status = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &status);
  std::cout << body;
  if (!body.empty() && body.back() != '\n') std::cout << "\n";
  if (status >= 200 && status < 300) return 0;
  std::cerr << "walrelay ctl: " << request->method << " " << url << " answered " << status << "\n";
  return 1;
}

}  // namespace walrelay
