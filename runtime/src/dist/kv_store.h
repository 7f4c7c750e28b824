// The job's key-value store: the rendezvous and process-group bootstrap channel that
// rank 0 hosts at MASTER_ADDR:MASTER_PORT (docs/replica-recovery.md).
//
// Our own, not c10d's TCPStore, because of how a client must behave when rank 0 goes
// away mid-job. LibTorch 1.13's TCPStore client keeps a second connection served by a
// background thread; when rank 0 dies that thread throws an uncaught exception and the
// whole survivor aborts (exit 134), so one lost rank 0 could cost a second rank. This
// client has no thread: every operation is one request and one reply on the calling
// thread, and a lost server is a KvError from the call that noticed it, which the
// recovery handles like any lost peer.
//
// Plain C++ and POSIX sockets, no LibTorch: the c10d::Store adapter is dist/job_store.*.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
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
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // Ends every blocked get/wait with a KvError (the server is stopping).
  void stop();

 private:
  bool allPresent(const std::vector<std::string>& keys) const;
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
  bool stopped_ = false;
};

// Listens on port (all interfaces, IPv6 and IPv4) and serves the table, one thread per
// connection. Stopping closes every connection: clients see KvError on their next call.
class KvServer {
 public:
  // Throws KvError when the port stays taken for bindTimeout (a previous host still
  // exiting releases it within that).
  KvServer(int port, std::chrono::milliseconds bindTimeout);
  ~KvServer();
  KvServer(const KvServer&) = delete;
  KvServer& operator=(const KvServer&) = delete;

  int port() const { return port_; }
  KvTable& table() { return table_; }
  // Connections currently open (tests: who is connected).
  int connections() const;

 private:
  void acceptLoop();
  void serve(int fd);

  KvTable table_;
  int port_ = 0;
  int listenFd_ = -1;
  int wakeFd_[2] = {-1, -1};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::vector<int> clients_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
};

// A connection to a KvServer. Not thread-safe on its own (JobStore serializes calls).
class KvClient : public KvOps {
 public:
  // Retries refused connections and unresolvable names until connectTimeout; `timeout`
  // bounds each later reply (beyond a get/wait's own timeout).
  KvClient(const std::string& host, int port, std::chrono::milliseconds connectTimeout,
           std::chrono::milliseconds timeout);
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
  // Sends one request and returns the reply's payload; `wait` is how long the server
  // may hold the reply back (a get or wait), on top of the reply timeout.
  Bytes call(const Bytes& request, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  std::string where() const;

  std::string host_;
  int port_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
};

}  // namespace edit
