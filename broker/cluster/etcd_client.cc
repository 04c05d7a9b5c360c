#include "cluster/etcd_client.h"

#include <curl/curl.h>

#include <nlohmann/json.hpp>

#include "membroker/ipc/escape.h"

namespace membroker::broker {

namespace {

using nlohmann::json;

constexpr int kGrpcNotFound = 5;
constexpr int kGrpcUnauthenticated = 16;

// The answer's bytes, bounded: past kEtcdMaxAnswerBytes the transfer stops.
size_t Collect(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > kEtcdMaxAnswerBytes) return 0;
  out->append(data, size * n);
  return size * n;
}

Status AnswerError(const std::string& what, const EtcdAnswer& a) {
  const ErrorCode code = a.error_code == kGrpcUnauthenticated ? ErrorCode::kPermissionDenied
                         : a.error_code == kGrpcNotFound      ? ErrorCode::kNotFound
                                                              : ErrorCode::kInternal;
  return Status(code, what + ": etcd said: " + ipc::EscapeText(a.error));
}

json KeyCompare(const std::string& key, const char* target, const char* field, int64_t value) {
  return {{"key", Base64Encode(key)}, {"target", target}, {"result", "EQUAL"}, {field, std::to_string(value)}};
}

json PutOp(const std::string& key, const std::string& value, int64_t lease) {
  return {{"request_put", {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}, {"lease", std::to_string(lease)}}}};
}

struct WatchState {
  std::string pending;
  const std::function<Status(const EtcdAnswer&)>* on_line;
  const std::function<bool()>* keep_going;
  Status failed;
};

size_t WatchBytes(char* data, size_t size, size_t n, void* user) {
  auto* w = static_cast<WatchState*>(user);
  w->pending.append(data, size * n);
  for (size_t nl; (nl = w->pending.find('\n')) != std::string::npos;) {
    const std::string line = w->pending.substr(0, nl);
    w->pending.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    Result<EtcdAnswer> a = ParseEtcdAnswer(line);
    w->failed = a.ok() ? (*w->on_line)(*a) : a.status();
    if (!w->failed.ok()) return 0;
  }
  if (w->pending.size() > kEtcdMaxAnswerBytes) {
    w->failed = Status(ErrorCode::kProtocolError, "etcd sent a watch line of more than 4 MiB");
    return 0;
  }
  return size * n;
}

int WatchProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* w = static_cast<WatchState*>(user);
  return (*w->keep_going)() ? 0 : 1;
}

}  // namespace

EtcdClient::EtcdClient(EtcdConfig config) : config_(std::move(config)), curl_(curl_easy_init()) {}

EtcdClient::~EtcdClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

// libcurl's own words for a failure, with its detail when it has one
// ("SSL routines::tlsv13 alert certificate required", not "Failure when receiving data").
std::string EtcdClient::Failure(int rc) const {
  const std::string detail = error_;
  return "etcd at " + endpoint() + ": " + (detail.empty() ? curl_easy_strerror(static_cast<CURLcode>(rc)) : detail);
}

// The handle, reset, set to POST body to path at the current endpoint: TLS
// as configured, the token if any. Returns the headers to free after the transfer.
curl_slist* EtcdClient::Prepare(const std::string& path, const std::string& body) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token_.empty()) headers = curl_slist_append(headers, ("Authorization: " + token_).c_str());
  url_ = endpoint() + path;
  curl_easy_setopt(c, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.timeout_ms));
  error_[0] = '\0';
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error_);
  // Peer and host verification are libcurl's defaults; they stay on.
  if (!config_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, config_.ca_file.c_str());
  if (!config_.cert_file.empty()) {
    curl_easy_setopt(c, CURLOPT_SSLCERT, config_.cert_file.c_str());
    curl_easy_setopt(c, CURLOPT_SSLKEY, config_.key_file.c_str());
  }
  return headers;
}

Result<EtcdAnswer> EtcdClient::CallOnce(const std::string& path, const std::string& body) {
  CURL* c = static_cast<CURL*>(curl_);
  if (c == nullptr) return Status(ErrorCode::kResourceExhausted, "curl_easy_init failed");
  std::string answer;
  curl_slist* headers = Prepare(path, body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.timeout_ms));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer);
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) return Status(ErrorCode::kNotConnected, Failure(rc));
  long http = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
  Result<EtcdAnswer> a = ParseEtcdAnswer(answer);
  if (!a.ok() && http != 200)
    return Status(ErrorCode::kNotConnected, "etcd at " + endpoint() + " answered HTTP " + std::to_string(http));
  return a;
}

Result<EtcdAnswer> EtcdClient::Call(const std::string& path, const std::string& body) {
  Status last;
  for (size_t tries = 0; tries < config_.endpoints.size(); ++tries) {
    if (!config_.user.empty() && token_.empty()) {
      Status st = Authenticate();
      if (st.code() == ErrorCode::kNotConnected) {
        last = st;
        current_ = (current_ + 1) % config_.endpoints.size();
        continue;
      }
      MB_RETURN_IF_ERROR(st);
    }
    Result<EtcdAnswer> a = CallOnce(path, body);
    if (a.ok() && a->error_code == kGrpcUnauthenticated && !config_.user.empty()) {
      token_.clear();  // expired: once more with a new one
      MB_RETURN_IF_ERROR(Authenticate());
      a = CallOnce(path, body);
    }
    if (a.ok() || a.status().code() != ErrorCode::kNotConnected) return a;
    last = a.status();
    current_ = (current_ + 1) % config_.endpoints.size();
  }
  return last;
}

Status EtcdClient::Authenticate() {
  token_.clear();
  const json body = {{"name", config_.user}, {"password", config_.password}};
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, CallOnce("/v3/auth/authenticate", body.dump()));
  if (a.error_code != 0) return AnswerError("authenticating as '" + ipc::EscapeText(config_.user) + "'", a);
  if (a.token.empty() || a.token.size() > 4096 || a.token.find_first_of("\r\n") != std::string::npos)
    return Status(ErrorCode::kProtocolError, "etcd answered authentication without a usable token");
  token_ = a.token;
  return Status::Ok();
}

Result<int64_t> EtcdClient::Grant(int64_t ttl_s) {
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/lease/grant", json{{"TTL", ttl_s}}.dump()));
  if (a.error_code != 0) return AnswerError("granting a lease", a);
  if (a.lease_id == 0 || a.ttl <= 0) return Status(ErrorCode::kProtocolError, "etcd granted no lease");
  return a.lease_id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  if (a.error_code == kGrpcNotFound) return int64_t{0};
  if (a.error_code != 0) return AnswerError("keeping the lease alive", a);
  return a.ttl > 0 ? a.ttl : 0;
}

Status EtcdClient::Revoke(int64_t lease) {
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()));
  if (a.error_code != 0 && a.error_code != kGrpcNotFound) return AnswerError("revoking the lease", a);
  return Status::Ok();
}

Result<EtcdClient::Claim> EtcdClient::PutIfAbsent(const std::string& key, const std::string& value, int64_t lease) {
  const json txn = {{"compare", {KeyCompare(key, "CREATE", "create_revision", 0)}},
                    {"success", {PutOp(key, value, lease)}},
                    {"failure", {{{"request_range", {{"key", Base64Encode(key)}}}}}}};
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/kv/txn", txn.dump()));
  if (a.error_code != 0) return AnswerError("claiming " + ipc::EscapeText(key), a);
  Claim c;
  c.created = a.succeeded;
  c.revision = a.revision;
  if (!c.created && !a.kvs.empty()) c.present = a.kvs[0];
  return c;
}

Result<bool> EtcdClient::PutIfCreatedAt(const std::string& key, const std::string& value, int64_t lease,
                                        int64_t create_revision) {
  const json txn = {{"compare", {KeyCompare(key, "CREATE", "create_revision", create_revision)}},
                    {"success", {PutOp(key, value, lease)}}};
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/kv/txn", txn.dump()));
  if (a.error_code != 0) return AnswerError("updating " + ipc::EscapeText(key), a);
  return a.succeeded;
}

Result<bool> EtcdClient::DeleteIfAt(const std::string& key, int64_t mod_revision) {
  const json txn = {{"compare", {KeyCompare(key, "MOD", "mod_revision", mod_revision)}},
                    {"success", {{{"request_delete_range", {{"key", Base64Encode(key)}}}}}}};
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/kv/txn", txn.dump()));
  if (a.error_code != 0) return AnswerError("deleting " + ipc::EscapeText(key), a);
  return a.succeeded;
}

Status EtcdClient::Put(const std::string& key, const std::string& value) {
  const json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/kv/put", body.dump()));
  return a.error_code == 0 ? Status::Ok() : AnswerError("putting " + ipc::EscapeText(key), a);
}

Result<EtcdClient::Range> EtcdClient::RangePrefix(const std::string& prefix) {
  const json body = {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}};
  MB_ASSIGN_OR_RETURN(EtcdAnswer a, Call("/v3/kv/range", body.dump()));
  if (a.error_code != 0) return AnswerError("reading " + ipc::EscapeText(prefix), a);
  return Range{std::move(a.kvs), a.revision};
}

Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision,
                         const std::function<Status(const EtcdAnswer&)>& on_line,
                         const std::function<bool()>& keep_going) {
  if (!config_.user.empty() && token_.empty()) MB_RETURN_IF_ERROR(Authenticate());
  CURL* c = static_cast<CURL*>(curl_);
  if (c == nullptr) return Status(ErrorCode::kResourceExhausted, "curl_easy_init failed");
  const std::string body = json{{"create_request",
                                 {{"key", Base64Encode(prefix)},
                                  {"range_end", Base64Encode(PrefixEnd(prefix))},
                                  {"start_revision", std::to_string(start_revision)}}}}
                               .dump();
  WatchState w{{}, &on_line, &keep_going, Status::Ok()};
  curl_slist* headers = Prepare("/v3/watch", body);
  // A stream idles for as long as nothing changes: a peer gone silent is found
  // by TCP keep-alive probes (about 11 s), not by a timeout on the stream.
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WatchBytes);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &w);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, WatchProgress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &w);
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (!w.failed.ok()) return w.failed;
  if (rc == CURLE_ABORTED_BY_CALLBACK) return Status::Ok();
  if (rc != CURLE_OK) {
    const Status st(ErrorCode::kNotConnected, Failure(rc));
    current_ = (current_ + 1) % config_.endpoints.size();
    return st;
  }
  return Status(ErrorCode::kNotConnected, "etcd at " + endpoint() + " ended the watch stream");
}

}  // namespace membroker::broker
