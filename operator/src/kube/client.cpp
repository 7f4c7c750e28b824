#include "kube/client.h"

#include <cpprest/http_client.h>

#include <mutex>
#include <thread>

#include "util/log.h"

namespace edit::op::kube {

namespace http = web::http;
namespace hc = web::http::client;

std::string ResourceType::path(const std::string& ns, const std::string& name, const std::string& sub) const {
  std::string p = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (namespaced && !ns.empty()) p += "/namespaces/" + ns;
  p += "/" + plural;
  if (!name.empty()) p += "/" + name;
  if (!sub.empty()) p += "/" + sub;
  return p;
}

namespace resources {
const ResourceType Pods{"", "v1", "pods", "Pod"};
const ResourceType Services{"", "v1", "services", "Service"};
const ResourceType ConfigMaps{"", "v1", "configmaps", "ConfigMap"};
const ResourceType Secrets{"", "v1", "secrets", "Secret"};
const ResourceType Events{"", "v1", "events", "Event"};
const ResourceType Leases{"coordination.k8s.io", "v1", "leases", "Lease"};
const ResourceType EDiTJobs{"edit.io", "v1alpha1", "editjobs", "EDiTJob"};
const ResourceType NetworkPolicies{"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"};
const ResourceType VolcanoPodGroups{"scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup"};
const ResourceType CoschedulingPodGroups{"scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"};
}  // namespace resources

std::string urlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

namespace {

hc::http_client_config makeClientConfig(const KubeConfig& cfg, std::chrono::seconds timeout) {
  hc::http_client_config cc;
  cc.set_timeout(timeout);
  cc.set_validate_certificates(!cfg.insecure);
  if (!cfg.caFile.empty() || !cfg.caData.empty()) {
    std::string caFile = cfg.caFile, caData = cfg.caData;
    cc.set_ssl_context_callback([caFile, caData](boost::asio::ssl::context& ctx) {
      if (!caFile.empty()) ctx.load_verify_file(caFile);
      if (!caData.empty()) ctx.add_certificate_authority(boost::asio::buffer(caData.data(), caData.size()));
    });
  }
  return cc;
}

ApiError errorFrom(int status, const std::string& body) {
  std::string reason, message = body;
  try {
    json j = json::parse(body);
    reason = j.value("reason", "");
    message = j.value("message", body);
  } catch (...) {
  }
  return ApiError(status, reason, "HTTP " + std::to_string(status) + ": " + message);
}

std::string query(const ListOptions& o) {
  std::string q;
  auto add = [&q](const char* k, const std::string& v) {
    if (v.empty()) return;
    q += q.empty() ? "?" : "&";
    q += std::string(k) + "=" + urlEncode(v);
  };
  add("labelSelector", o.labelSelector);
  add("fieldSelector", o.fieldSelector);
  add("resourceVersion", o.resourceVersion);
  return q;
}

}  // namespace

struct Client::Impl {
  std::unique_ptr<hc::http_client> api;    // ordinary requests, short timeout
  std::unique_ptr<hc::http_client> watch;  // long-running watch streams
  std::mutex cancelMu;
  pplx::cancellation_token_source cancel;
};

Client::Client(KubeConfig cfg) : cfg_(std::move(cfg)), impl_(std::make_unique<Impl>()) {
  impl_->api = std::make_unique<hc::http_client>(cfg_.server, makeClientConfig(cfg_, std::chrono::seconds(30)));
  impl_->watch = std::make_unique<hc::http_client>(cfg_.server, makeClientConfig(cfg_, std::chrono::seconds(600)));
}

Client::~Client() { cancelWatches(); }

void Client::cancelWatches() {
  std::lock_guard<std::mutex> lock(impl_->cancelMu);
  impl_->cancel.cancel();
  impl_->cancel = pplx::cancellation_token_source();
}

json Client::request(const std::string& method, const std::string& pathAndQuery, const json* body,
                     const std::string& contentType) {
  // Checked before every send, a retry's too, as late as possible: a process stopped
  // (SIGSTOP, a frozen node) between this check and the send could still write, but not
  // one stopped anywhere before it.
  auto guard = [&] {
    if (writeGuard_ && method != "GET")
      if (std::string why = writeGuard_(); !why.empty())
        throw ApiError(0, "NotLeader", "refused to " + method + " " + pathAndQuery + ": " + why);
  };
  guard();
  http::http_request req(method);
  req.set_request_uri(pathAndQuery);
  req.headers().add("Accept", "application/json");
  req.headers().add("User-Agent", userAgent_);
  if (!cfg_.token.empty()) req.headers().add("Authorization", "Bearer " + cfg_.token);
  if (body) req.set_body(body->dump(), contentType);
  http::http_response resp;
  std::string text;
  // One retry on a transport error: a pooled keep-alive connection may have died with
  // a restarted server. Creates use deterministic names, so a repeat answers 409.
  for (int attempt = 0;; ++attempt) {
    try {
      resp = impl_->api->request(req).get();
      text = resp.extract_utf8string(true).get();
      break;
    } catch (const std::exception& e) {
      if (attempt == 0) {
        http::http_request again(method);
        again.set_request_uri(pathAndQuery);
        for (const auto& h : req.headers()) again.headers().add(h.first, h.second);
        if (body) again.set_body(body->dump(), contentType);
        req = again;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        guard();
        continue;
      }
      throw ApiError(0, "Transport", std::string("request ") + method + " " + pathAndQuery + " failed: " + e.what());
    }
  }
  int status = resp.status_code();
  if (status < 200 || status >= 300) throw errorFrom(status, text);
  if (text.empty()) return json::object();
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    throw ApiError(status, "BadResponse", std::string("unparsable response: ") + e.what());
  }
}

json Client::get(const ResourceType& rt, const std::string& ns, const std::string& name) {
  return request("GET", rt.path(ns, name), nullptr);
}

std::optional<json> Client::tryGet(const ResourceType& rt, const std::string& ns, const std::string& name) {
  try {
    return get(rt, ns, name);
  } catch (const ApiError& e) {
    if (e.notFound()) return std::nullopt;
    throw;
  }
}

json Client::list(const ResourceType& rt, const std::string& ns, const ListOptions& opts) {
  return request("GET", rt.path(ns) + query(opts), nullptr);
}

json Client::create(const ResourceType& rt, const std::string& ns, const json& obj) {
  return request("POST", rt.path(ns), &obj);
}

json Client::update(const ResourceType& rt, const std::string& ns, const json& obj) {
  return request("PUT", rt.path(ns, obj["metadata"]["name"].get<std::string>()), &obj);
}

json Client::updateStatus(const ResourceType& rt, const std::string& ns, const json& obj) {
  return request("PUT", rt.path(ns, obj["metadata"]["name"].get<std::string>(), "status"), &obj);
}

json Client::mergePatch(const ResourceType& rt, const std::string& ns, const std::string& name, const json& patch,
                        const std::string& subresource) {
  return request("PATCH", rt.path(ns, name, subresource), &patch, "application/merge-patch+json");
}

bool Client::remove(const ResourceType& rt, const std::string& ns, const std::string& name,
                    const std::string& propagationPolicy, long gracePeriodSeconds, const std::string& uid) {
  json opts = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", propagationPolicy}};
  std::string query = "?propagationPolicy=" + propagationPolicy;
  if (gracePeriodSeconds >= 0) {
    opts["gracePeriodSeconds"] = gracePeriodSeconds;
    query += "&gracePeriodSeconds=" + std::to_string(gracePeriodSeconds);
  }
  if (!uid.empty()) opts["preconditions"] = {{"uid", uid}};
  try {
    request("DELETE", rt.path(ns, name) + query, &opts);
    return true;
  } catch (const ApiError& e) {
    if (e.notFound()) return false;
    if (!uid.empty() && e.conflict()) return false;  // the name belongs to another object now
    throw;
  }
}

void Client::watch(const ResourceType& rt, const std::string& ns, const ListOptions& opts, int timeoutSeconds,
                   const std::function<bool(const json&)>& onEvent, const std::atomic<bool>& stop) {
  std::string q = query(opts);
  q += q.empty() ? "?" : "&";
  q += "watch=true&allowWatchBookmarks=true&timeoutSeconds=" + std::to_string(timeoutSeconds);
  http::http_request req(http::methods::GET);
  req.set_request_uri(rt.path(ns) + q);
  req.headers().add("Accept", "application/json");
  if (!cfg_.token.empty()) req.headers().add("Authorization", "Bearer " + cfg_.token);
  pplx::cancellation_token token = pplx::cancellation_token::none();
  {
    std::lock_guard<std::mutex> lock(impl_->cancelMu);
    token = impl_->cancel.get_token();
  }
  http::http_response resp;
  try {
    resp = impl_->watch->request(req, token).get();
  } catch (const std::exception& e) {
    throw ApiError(0, "Transport", std::string("watch ") + rt.plural + " failed: " + e.what());
  }
  if (resp.status_code() != 200) throw errorFrom(resp.status_code(), resp.extract_utf8string(true).get());
  auto buf = resp.body().streambuf();
  std::string line;
  std::vector<char> chunk(64 * 1024);
  try {
    while (!stop) {
      // bumpc waits for at least one byte; then take whatever else has already arrived.
      auto c = buf.bumpc().get();
      if (c == concurrency::streams::streambuf<uint8_t>::traits::eof()) return;
      std::string data(1, static_cast<char>(c));
      size_t avail = buf.in_avail();
      if (avail > 0) {
        size_t n = buf.getn(reinterpret_cast<uint8_t*>(chunk.data()), std::min(avail, chunk.size())).get();
        data.append(chunk.data(), n);
      }
      for (char ch : data) {
        if (ch != '\n') {
          line.push_back(ch);
          continue;
        }
        if (line.find_first_not_of(" \r\t") == std::string::npos) {
          line.clear();
          continue;
        }
        json ev = json::parse(line);
        line.clear();
        if (!onEvent(ev)) return;
      }
    }
  } catch (const ApiError&) {
    throw;  // e.g. 410 from an ERROR event, raised by onEvent
  } catch (const json::exception& e) {
    throw ApiError(0, "BadWatchEvent", std::string("unparsable watch event: ") + e.what());
  } catch (const std::exception& e) {
    if (stop) return;
    throw ApiError(0, "Transport", std::string("watch stream broke: ") + e.what());
  }
}

}  // namespace edit::op::kube
