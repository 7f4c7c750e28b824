#include "dist/job_store.h"

#include <cstdlib>
#include <iostream>

namespace edit {

c10::intrusive_ptr<JobStore> JobStore::host(int port, std::chrono::milliseconds timeout) {
  KvServer::Options options;
  for (const char* name : {"EDIT_BIND_ADDR", "POD_IP"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      options.bindHost = v;
      break;
    }
  }
  options.auth = KvAuth::fromEnvironment();
  if (!options.auth.hasSecret)
    std::cerr << "store: no secret (EDIT_STORE_SECRET and EDIT_TELEMETRY_TOKEN are unset): any process that "
                 "reaches port "
              << port << " can use job " << options.auth.job << "'s store (edit-run and the operator set one)"
              << std::endl;
  auto s = c10::make_intrusive<JobStore>(timeout);
  s->server_ = std::make_shared<KvServer>(port, timeout, options);
  return s;
}

c10::intrusive_ptr<JobStore> JobStore::connect(const std::string& host, int port,
                                               std::chrono::milliseconds connectTimeout,
                                               std::chrono::milliseconds timeout) {
  auto s = c10::make_intrusive<JobStore>(timeout);
  s->client_ = std::make_unique<KvClient>(host, port, connectTimeout, timeout, KvAuth::fromEnvironment());
  s->host_ = host;
  s->port_ = port;
  return s;
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> JobStore::clone() {
  if (server_) {
    auto s = c10::make_intrusive<JobStore>(timeout_);
    s->server_ = server_;
    return s;
  }
  if (closed()) throw KvError("store: this rank closed its connection to the store (rank 0 hosts it)");
  return connect(host_, port_, timeout_, timeout_);
}
#endif

template <typename F>
auto JobStore::with(F&& f) -> decltype(f(std::declval<KvOps&>())) {
  if (server_) return f(server_->table());
  std::lock_guard<std::mutex> lock(mu_);
  if (!client_) throw KvError("store: this rank closed its connection to the store (rank 0 hosts it)");
  return f(*client_);
}

void JobStore::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (server_) return;
  client_.reset();
  closed_ = true;
}

bool JobStore::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

int JobStore::clients() const { return server_ ? server_->connections() : 0; }

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  with([&](KvOps& s) { s.set(key, value); });
}

std::vector<uint8_t> JobStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return with([&](KvOps& s) { return s.compareSet(key, expected, desired); });
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  return with([&](KvOps& s) { return s.get(key, timeout_); });
}

int64_t JobStore::add(const std::string& key, int64_t value) {
  return with([&](KvOps& s) { return s.add(key, value); });
}

bool JobStore::deleteKey(const std::string& key) {
  return with([&](KvOps& s) { return s.deleteKey(key); });
}

bool JobStore::check(const std::vector<std::string>& keys) {
  return with([&](KvOps& s) { return s.check(keys); });
}

int64_t JobStore::getNumKeys() {
  return with([&](KvOps& s) { return s.numKeys(); });
}

void JobStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void JobStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  with([&](KvOps& s) { s.wait(keys, timeout); });
}

void JobStore::setTimeout(const std::chrono::milliseconds& timeout) {
  c10d::Store::setTimeout(timeout);
  std::lock_guard<std::mutex> lock(mu_);
  if (client_) client_->setTimeout(timeout);
}

}  // namespace edit
