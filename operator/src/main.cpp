// edit-operator: runs EDiTJob custom resources. See operator/README.md.
#include <csignal>
#include <functional>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "api/crd_schema.h"
#include "api/editjob.h"
#include "controller/reconciler.h"
#include "http_server.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/events.h"
#include "kube/informer.h"
#include "leader/lease.h"
#include "metrics/health.h"
#include "metrics/metrics.h"
#include "telemetry/server.h"
#include "util/log.h"

using namespace edit::op;

namespace {

std::atomic<bool> g_stop{false};

void onSignal(int) { g_stop = true; }

std::string envOr(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v && *v ? v : def;
}

// A listen address: HOST:PORT, [IPV6]:PORT or :PORT (every IPv4 address, the form
// Kubernetes manifests and Go programs use). Port 0 picks a free port.
struct ListenAddr {
  std::string host;
  int port = 0;
  std::string str() const { return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port); }
};

ListenAddr parseListenAddr(const std::string& flag, const std::string& value) {
  try {
    auto [host, port] = edit::http::splitHostPort(value);  // an empty host means 0.0.0.0
    return {host, port};
  } catch (const std::exception& e) {
    throw std::invalid_argument(flag + ": " + e.what() + "; use HOST:PORT or :PORT (e.g. :8080 or 127.0.0.1:8080)");
  }
}

struct Flags {
  std::string kubeconfig;
  std::vector<std::string> namespaces;
  ListenAddr metricsAddr{"127.0.0.1", 8080};
  ListenAddr healthAddr{"127.0.0.1", 8081};
  ListenAddr grpcAddr{"0.0.0.0", 9090};
  std::string telemetryAdvertiseAddr;
  std::string telemetryTlsCert, telemetryTlsKey;  // PEM files; both set: TLS
  std::string telemetryTlsCaSecret;               // Secret with ca.crt mounted into workers
  std::string telemetryTlsServerName;             // EDIT_TELEMETRY_SERVER_NAME for workers
  bool workerNetworkPolicy = false;
  std::string workerMetricsNamespace;
  bool leaderElect = false;
  std::string leaseNamespace;
  std::string leaseName = "edit-operator";
  std::string logLevel = "info";
  int workers = 2;
  int resyncSeconds = 30;
};

const char* kUsage =
    "usage: edit-operator [flags]\n"
    "  --kubeconfig PATH              kubeconfig (default: $KUBECONFIG, else in-cluster)\n"
    "  --namespaces a,b               namespaces to watch (default: all)\n"
    "  --metrics-addr HOST:PORT       Prometheus /metrics (default 127.0.0.1:8080; :PORT = every\n"
    "                                 IPv4 address; port 0: any free port)\n"
    "  --health-addr HOST:PORT        /healthz and /readyz (default 127.0.0.1:8081)\n"
    "  --grpc-addr HOST:PORT          worker telemetry gRPC (default 0.0.0.0:9090)\n"
    "  --telemetry-advertise-addr A   EDIT_TELEMETRY_ADDR given to workers (default: grpc address)\n"
    "  --telemetry-tls-cert FILE      PEM certificate chain: serve telemetry over TLS (with --telemetry-tls-key)\n"
    "  --telemetry-tls-key FILE       PEM private key of --telemetry-tls-cert\n"
    "  --telemetry-tls-ca-secret NAME Secret (key ca.crt, in each job's namespace) mounted into workers\n"
    "                                 to verify the operator; sets EDIT_TELEMETRY_CA_FILE\n"
    "  --telemetry-tls-server-name N  name workers check in the certificate (default: the advertised host)\n"
    "  --worker-network-policy        give each job a NetworkPolicy: its workers accept only each other\n"
    "                                 (and Prometheus on port 9400, see --worker-metrics-namespace)\n"
    "  --worker-metrics-namespace NS  namespace Prometheus scrapes the workers from (with --worker-network-policy)\n"
    "  --leader-elect                 run only while holding the Lease\n"
    "  --lease-namespace NS           (default: the kubeconfig/service-account namespace)\n"
    "  --lease-name NAME              (default edit-operator)\n"
    "  --log-level debug|info|warn|error\n"
    "  --workers N                    reconcile threads (default 2)\n"
    "  --resync-seconds N             re-reconcile every job this often (default 30; 0: off)\n"
    "  --print-schema                 print the CRD's spec schema this operator parses (JSON) and exit\n";

std::vector<std::string> splitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int parseInt(const std::string& flag, const std::string& value, int min) {
  size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < min)
    throw std::invalid_argument(flag + ": '" + value + "' must be an integer >= " + std::to_string(min));
  return v;
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    bool hasValue = false;
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      hasValue = true;
    }
    auto next = [&]() -> std::string {
      if (hasValue) return value;
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--print-schema") {
      std::cout << api::crdSpecSchema().dump(2) << "\n";
      std::exit(0);
    } else if (a == "--kubeconfig") f.kubeconfig = next();
    else if (a == "--namespaces") f.namespaces = splitComma(next());
    else if (a == "--metrics-addr") f.metricsAddr = parseListenAddr(a, next());
    else if (a == "--health-addr") f.healthAddr = parseListenAddr(a, next());
    else if (a == "--grpc-addr") f.grpcAddr = parseListenAddr(a, next());
    else if (a == "--telemetry-advertise-addr") f.telemetryAdvertiseAddr = next();
    else if (a == "--telemetry-tls-cert") f.telemetryTlsCert = next();
    else if (a == "--telemetry-tls-key") f.telemetryTlsKey = next();
    else if (a == "--telemetry-tls-ca-secret") f.telemetryTlsCaSecret = next();
    else if (a == "--telemetry-tls-server-name") f.telemetryTlsServerName = next();
    else if (a == "--leader-elect") f.leaderElect = !hasValue || value == "true";
    else if (a == "--worker-network-policy") f.workerNetworkPolicy = !hasValue || value == "true";
    else if (a == "--worker-metrics-namespace") f.workerMetricsNamespace = next();
    else if (a == "--lease-namespace") f.leaseNamespace = next();
    else if (a == "--lease-name") f.leaseName = next();
    else if (a == "--log-level") f.logLevel = next();
    else if (a == "--workers") f.workers = parseInt(a, next(), 1);
    else if (a == "--resync-seconds") f.resyncSeconds = parseInt(a, next(), 0);
    else throw std::invalid_argument("unknown flag " + a + "\n" + kUsage);
  }
  return f;
}

// The flags and the telemetry TLS files, checked before anything connects: a problem is a
// usage error (exit 2).
bool readFlags(int argc, char** argv, Flags& flags, telemetry::ServerTls& tls) {
  try {
    flags = parseFlags(argc, argv);
    log::setLevel(log::parseLevel(flags.logLevel));
    tls = telemetry::loadServerTls(flags.telemetryTlsCert, flags.telemetryTlsKey);
    // Workers told to use TLS against a plaintext server could never connect.
    if (!tls.enabled() && (!flags.telemetryTlsCaSecret.empty() || !flags.telemetryTlsServerName.empty()))
      throw std::invalid_argument(
          "--telemetry-tls-ca-secret and --telemetry-tls-server-name need --telemetry-tls-cert and --telemetry-tls-key");
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return false;
  }
  return true;
}

// /metrics on the shared plain server, not prometheus-cpp's Exposer: civetweb rejects ":PORT".
edit::http::Handler metricsHandler(metrics::Metrics& m) {
  return [&m](const std::string& path) {
    if (path != "/metrics") return edit::http::Response{404, "text/plain; charset=utf-8", "not found\n"};
    return edit::http::Response{200, "text/plain; version=0.0.4; charset=utf-8", m.scrape()};
  };
}

// EDIT_TELEMETRY_ADDR for workers: the flag, else the bound gRPC address (loopback for a
// wildcard host).
std::string advertiseAddr(const Flags& flags, int grpcPort) {
  if (!flags.telemetryAdvertiseAddr.empty()) return flags.telemetryAdvertiseAddr;
  const std::string& host = flags.grpcAddr.host;
  return (host == "0.0.0.0" || host == "::" ? std::string("127.0.0.1") : host) + ":" + std::to_string(grpcPort);
}

// Reconciles while holding the Lease; returns 1 when it was lost (Kubernetes restarts the
// pod), 0 on SIGTERM. The elector has a client of its own: the controller's writes go
// through a guard that lets them out only while the lease is fresh (fencing, as far as
// the API allows: a replica that lost its lease, or slept through it, writes nothing).
int runWithLease(kube::Client& client, kube::Client& leaseClient, leader::LeaderElector& elector,
                 const leader::OwnPod& ownPod, metrics::Metrics& metricsReg,
                 const std::function<void()>& startControllers) {
  metricsReg.setLeader(false);
  client.setWriteGuard([&elector] { return elector.mayWrite() ? "" : "this replica does not hold the leader lease"; });
  // Before the Lease goes: workers must not be routed here once another replica leads.
  elector.setBeforeRelease([&] { leader::setLeaderLabel(leaseClient, ownPod, false); });
  return elector.run(startControllers, g_stop) ? 0 : 1;
}

// Runs the controllers until SIGTERM, or with leader election while this replica holds
// the Lease (the elector and its client are the caller's: they must outlive the controllers).
int lead(const Flags& flags, const kube::KubeConfig& kc, const std::string& identity, kube::Client& client,
         const leader::OwnPod& ownPod, metrics::Metrics& metricsReg, const std::function<void()>& startControllers,
         std::unique_ptr<kube::Client>& leaseClient, std::unique_ptr<leader::LeaderElector>& elector) {
  if (!flags.leaderElect) {
    startControllers();
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    leader::setLeaderLabel(client, ownPod, false);
    return 0;
  }
  leaseClient = std::make_unique<kube::Client>(kc);
  leaseClient->setUserAgent("edit-operator (" + identity + ")");
  leader::LeaseSettings ls;
  ls.ns = flags.leaseNamespace.empty() ? kc.defaultNamespace : flags.leaseNamespace;
  ls.name = flags.leaseName;
  ls.identity = identity;
  elector = std::make_unique<leader::LeaderElector>(*leaseClient, ls);
  return runWithLease(client, *leaseClient, *elector, ownPod, metricsReg, startControllers);
}

int serve(const Flags& flags, const telemetry::ServerTls& telemetryTls) {
  kube::KubeConfig kc = kube::resolveConfig(flags.kubeconfig);
  const std::string identity = leader::defaultIdentity();
  kube::Client client(kc);
  // The identity in the User-Agent: API audit logs tell the replicas apart.
  client.setUserAgent("edit-operator (" + identity + ")");
  metrics::Metrics metricsReg;
  edit::http::PlainServer metricsServer(flags.metricsAddr.host, flags.metricsAddr.port, metricsHandler(metricsReg));

  telemetry::TelemetryHub hub(&metricsReg);
  // Until this replica leads, workers that reach it are told to retry (the telemetry
  // Service selects the leader's pod; see leader/lease.h).
  hub.setServing(false);
  telemetry::TelemetryServer grpcServer(hub, flags.grpcAddr.str(), telemetryTls);
  if (telemetryTls.enabled() && flags.telemetryTlsCaSecret.empty())
    log::warn("telemetry TLS is on but --telemetry-tls-ca-secret is not set: workers need "
              "EDIT_TELEMETRY_CA_FILE from their spec, or they cannot connect");
  const std::string advertise = advertiseAddr(flags, grpcServer.port());

  kube::Informer jobs(client, kube::resources::EDiTJobs, flags.namespaces);
  kube::Informer pods(client, kube::resources::Pods, flags.namespaces, api::kLabelJob);
  // Ready once serving, leader or not (as controller-runtime's ping check): a readiness
  // that waited for the Lease would keep a rolling update from ever finishing.
  metrics::HealthServer health(flags.healthAddr.str(), nullptr);
  log::info("edit-operator listening",
            {{"metricsAddr", ListenAddr{flags.metricsAddr.host, metricsServer.port()}.str()},
             {"healthAddr", ListenAddr{health.host(), health.port()}.str()},
             {"grpcAddr", ListenAddr{flags.grpcAddr.host, grpcServer.port()}.str()},
             {"telemetryAdvertiseAddr", advertise},
             {"telemetryTls", telemetryTls.enabled()},
             {"server", kc.server},
             {"leaderElect", flags.leaderElect}});

  // The pod this process runs in (the chart sets both from the downward API).
  const leader::OwnPod ownPod{envOr("POD_NAMESPACE", ""), envOr("POD_NAME", "")};
  // A container restarted in the same pod may carry the label of a leadership it lost.
  leader::setLeaderLabel(client, ownPod, false);

  kube::EventRecorder recorder(&client, "edit-operator");
  controller::OperatorSettings settings{advertise, flags.telemetryTlsCaSecret, flags.telemetryTlsServerName,
                                        flags.workerNetworkPolicy, flags.workerMetricsNamespace};
  controller::Reconciler reconciler(client, pods, hub, metricsReg, recorder, settings);
  controller::Controller ctrl(reconciler, jobs, pods, metricsReg, flags.workers, flags.resyncSeconds);
  hub.setOnReport([&ctrl](const std::string& ns, const std::string& job) {
    // Progress reaches .status at most every 2 s per job (the queue keeps the earliest).
    ctrl.queue().addAfter(ns + "/" + job, std::chrono::milliseconds(2000));
  });
  std::thread ages([&] {
    while (!g_stop) {
      hub.refreshMetrics();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });

  std::thread starter;
  // Returns at once: the elector keeps renewing while the caches sync.
  auto startControllers = [&] {
    metricsReg.setLeader(true);
    hub.setServing(true);
    leader::setLeaderLabel(client, ownPod, true);
    jobs.start();
    pods.start();
    starter = std::thread([&] {
      // Reconciling from a partial cache could recreate pods that exist: wait for sync.
      while (!g_stop && !(jobs.hasSynced() && pods.hasSynced()))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (g_stop) return;
      ctrl.start();
      log::info("controller started", {{"workers", flags.workers}});
    });
  };

  // Outlive the controller threads: their writes ask the elector (the write guard).
  std::unique_ptr<kube::Client> leaseClient;
  std::unique_ptr<leader::LeaderElector> elector;
  const int rc = lead(flags, kc, identity, client, ownPod, metricsReg, startControllers, leaseClient, elector);
  g_stop = true;
  if (starter.joinable()) starter.join();
  log::info("shutting down");
  hub.setServing(false);
  metricsReg.setLeader(false);
  ctrl.stop();
  client.cancelWatches();
  jobs.stop();
  pods.stop();
  grpcServer.shutdown();
  health.stop();
  metricsServer.stop();
  ages.join();
  log::info("stopped", {{"exitCode", rc}});
  // Lost lease: leave at once, like controller-runtime, before any other work runs.
  if (rc != 0) std::_Exit(rc);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  telemetry::ServerTls telemetryTls;
  if (!readFlags(argc, argv, flags, telemetryTls)) return 2;
  std::signal(SIGTERM, onSignal);
  std::signal(SIGINT, onSignal);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return serve(flags, telemetryTls);
  } catch (const std::exception& e) {
    log::error("fatal", {{"error", e.what()}});
    return 1;
  }
}
