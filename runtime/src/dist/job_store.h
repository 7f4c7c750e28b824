// The job's store as c10d sees it (a c10d::Store), over dist/kv_store.*: rank 0 hosts the
// server and calls its table directly; every other rank is a client with one connection
// and no background thread, which it can close while it trains (Rendezvous::formed).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/kv_store.h"

namespace edit {

class JobStore : public c10d::Store {
 public:
  // Hosts the store on port, at the pod's own address (EDIT_BIND_ADDR, else POD_IP; every
  // interface when neither is set), for the job and secret of KvAuth::fromEnvironment().
  // Waits up to `timeout` for the port to be free: a rank 0 that replaces one still
  // exiting gets it once the old one is gone.
  static c10::intrusive_ptr<JobStore> host(int port, std::chrono::milliseconds timeout);
  // A client of the store at host:port, with KvAuth::fromEnvironment(); retries for
  // connectTimeout while it is not up. A store of another job or secret: KvRefused.
  static c10::intrusive_ptr<JobStore> connect(const std::string& host, int port,
                                              std::chrono::milliseconds connectTimeout,
                                              std::chrono::milliseconds timeout);

  // A client's connection ends here; any later call throws (as a lost connection would).
  // The host's store stays open.
  void close();
  bool closed() const;
  // The host: how many clients are connected now.
  int clients() const;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR >= 2
  // Newer 2.x process groups ask for a handle of their own (another thread's): the host
  // shares its server, a client opens a second connection to the same address. Not
  // marked override: 2.x releases before Store::clone() do not declare it.
  c10::intrusive_ptr<c10d::Store> clone();
#endif

  explicit JobStore(std::chrono::milliseconds timeout) : c10d::Store(timeout) {}

 private:
  // Runs f on the table (host) or the connection (client, one call at a time).
  template <typename F>
  auto with(F&& f) -> decltype(f(std::declval<KvOps&>()));

  std::shared_ptr<KvServer> server_;
  std::string host_;  // a client's address (clone)
  int port_ = 0;
  mutable std::mutex mu_;  // guards client_
  std::unique_ptr<KvClient> client_;
  bool closed_ = false;
};

}  // namespace edit
