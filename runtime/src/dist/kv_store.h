// The job's key-value store: the rendezvous and process-group bootstrap channel that
// rank 0 hosts at MASTER_ADDR:MASTER_PORT (docs/replica-recovery.md; the protocol, its
// limits and the handshake: docs/job-store.md).
//
// Our own, not c10d's TCPStore, because of how a client must behave when rank 0 goes
// away mid-job. LibTorch 1.13's TCPStore client keeps a second connection served by a
// background thread; when rank 0 dies that thread throws an uncaught exception and the
// whole survivor aborts (exit 134), so one lost rank 0 could cost a second rank. This
// client has no thread: every operation is one request and one reply on the calling
// thread, and a lost server is a KvError from the call that noticed it, which the
// recovery handles like any lost peer.
//
// The server is one thread with an epoll loop, whatever the number of clients: a thread
// per connection would carry LibTorch's large static TLS each, and rank 0 would grow with
// every recovery. Every connection starts with a handshake that names the job and proves
// the job's secret (HMAC-SHA256 challenge-response, both ways); every frame is bounded
// before anything is allocated for it and must arrive within a deadline.
//
// Plain C++ and POSIX sockets, no LibTorch: the c10d::Store adapter is dist/job_store.*.
// This header is the store's API; its code is by concern: kv_wire.* (the frames and
// fields), kv_auth.cpp (SHA-256, HMAC, the handshake's keys and proofs), kv_table.cpp,
// kv_session.* (one connection's protocol, without sockets), kv_server.cpp (the epoll
// loop), kv_client.cpp.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace edit {

using Bytes = std::vector<uint8_t>;

// A store operation failed: the connection to the host was lost or refused, or a wait
// timed out. The message names the store's address and what happened.
class KvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store refused this client for good: another job's store, a wrong secret, another
// protocol. Retrying cannot help, so the client does not (unlike a store not up yet).
class KvRefused : public KvError {
 public:
  using KvError::KvError;
};

// Bounds on what one client may make the server hold. The defaults follow PyTorch's
// TCPStore (libuv backend: 8 KiB keys, 8 MiB values, 128 Ki keys per request).
struct KvLimits {
  uint32_t maxKeyBytes = 8u << 10;
  uint32_t maxValueBytes = 8u << 20;
  uint32_t maxKeysPerRequest = 128u << 10;
  // A compare-and-set carries two values and a key.
  uint32_t maxFrameBytes = (16u << 20) + (64u << 10);
  // Before the handshake: a hello is a job name and a nonce.
  uint32_t maxHelloBytes = 1024;
  // Open connections; more are answered "busy" and closed (clients retry until their
  // connect timeout). RLIMIT_NOFILE may bind first: a 4096-rank rendezvous needs 4096.
  int maxConnections = 16384;
  // From a frame's first byte to its last, and for a reply to leave.
  std::chrono::milliseconds frameTimeout{10000};
  // From accept to a proven secret.
  std::chrono::milliseconds handshakeTimeout{10000};
};

// Who may use a store: the job's identity ("namespace/name") and a 32-byte key derived
// from the job's secret. Both sides must agree on both.
struct KvAuth {
  std::string job;
  std::array<uint8_t, 32> key{};
  bool hasSecret = false;

  // The key is HMAC-SHA256(secret, "edit job store v1"): the store never uses the raw
  // secret, which is also the job's telemetry token. An empty secret gives a fixed key
  // (no authentication; edit-train started by hand).
  static KvAuth make(const std::string& job, const std::string& secret);
  // EDIT_NAMESPACE/EDIT_JOB (defaults "default"/"local", what the worker's telemetry
  // uses); the secret from EDIT_STORE_SECRET (edit-run makes one per run) or else
  // EDIT_TELEMETRY_TOKEN (the job's Secret on a cluster).
  static KvAuth fromEnvironment();
};

// HMAC-SHA256 (RFC 2104, FIPS 180-4), here so the runtime needs no crypto library.
std::array<uint8_t, 32> hmacSha256(const uint8_t* key, size_t keyLen, const uint8_t* msg, size_t msgLen);

// The operations c10d's process groups and our rendezvous use, with TCPStore's semantics.
class KvOps {
 public:
  virtual ~KvOps() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until the key exists (KvError after timeout).
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds delta to the decimal integer stored at key (absent: 0) and returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets desired when the key holds expected (or is absent and expected is empty);
  // returns the value the key holds afterwards (absent and expected not empty: expected).
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;  // all of them exist
  virtual bool deleteKey(const std::string& key) = 0;
  virtual int64_t numKeys() = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// The store's data and its semantics; the server serves it, and the process that hosts
// the server (rank 0) calls it directly.
class KvTable : public KvOps {
 public:
  explicit KvTable(const KvLimits& limits = {}) : limits_(limits) {}
  // A value over limits.maxValueBytes is a KvError, from the host as from a client.
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // The value if the key exists, without waiting (the server's gets).
  bool tryGet(const std::string& key, Bytes* value);
  // Ends every blocked get/wait with a KvError (the server is stopping).
  void stop();
  // Called with each key that was written, after the write (any thread).
  void setOnChange(std::function<void(const std::string&)> f);

 private:
  bool allPresent(const std::vector<std::string>& keys) const;
  void changed(const std::string& key);
  void checkValue(const std::string& key, const Bytes& value) const;
  KvLimits limits_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
  bool stopped_ = false;
  std::mutex hookMu_;
  std::function<void(const std::string&)> onChange_;
};

// Serves the table on port, one thread for every connection (epoll). Listens on
// options.bindHost, or on every interface (IPv6 and IPv4) when it is empty. Stopping
// closes every connection: clients see KvError on their next call.
struct KvServerOptions {
  std::string bindHost;  // an address of this host ("" = all interfaces)
  KvAuth auth = KvAuth::make("", "");
  KvLimits limits;
};

class KvServer {
 public:
  using Options = KvServerOptions;
  // Throws KvError when the port stays taken for bindTimeout (a previous host still
  // exiting releases it within that).
  KvServer(int port, std::chrono::milliseconds bindTimeout, Options options = Options());
  ~KvServer();
  KvServer(const KvServer&) = delete;
  KvServer& operator=(const KvServer&) = delete;

  int port() const { return port_; }
  KvTable& table() { return table_; }
  // Connections currently open (tests: who is connected).
  int connections() const;
  // Clients refused so far (another job, a wrong secret, a malformed hello).
  int64_t refusals() const;
  // Threads this server runs (one; tests).
  static constexpr int threads() { return 1; }

 private:
  struct Loop;
  KvTable table_;
  int port_ = 0;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

// A connection to a KvServer. Not thread-safe on its own (JobStore serializes calls).
class KvClient : public KvOps {
 public:
  // Retries refused connections, unresolvable names and a busy or silent store until
  // connectTimeout; a store that refuses this client (another job, a wrong secret) is a
  // KvRefused at once. `timeout` bounds each later reply (beyond a get/wait's own timeout).
  KvClient(const std::string& host, int port, std::chrono::milliseconds connectTimeout,
           std::chrono::milliseconds timeout, const KvAuth& auth = KvAuth::make("", ""),
           const KvLimits& limits = {});
  ~KvClient() override;
  KvClient(const KvClient&) = delete;
  KvClient& operator=(const KvClient&) = delete;

  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  // The handshake on a fresh connection; throws KvRefused, or KvError to retry.
  void handshake(int fd);
  // Sends one request and returns the reply's payload; `wait` is how long the server
  // may hold the reply back (a get or wait), on top of the reply timeout.
  Bytes call(const Bytes& request, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  std::string where() const;

  std::string host_;
  int port_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  KvAuth auth_;
  KvLimits limits_;
};

}  // namespace edit
