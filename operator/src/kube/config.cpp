#include "kube/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace edit::op::kube {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Finds the entry named `name` in a kubeconfig list (clusters, users, contexts).
YAML::Node findNamed(const YAML::Node& list, const std::string& name, const char* section) {
  if (list && list.IsSequence())
    for (const auto& item : list)
      if (item["name"] && item["name"].as<std::string>() == name) return item;
  throw std::runtime_error(std::string("kubeconfig: no ") + section + " named '" + name + "'");
}

std::string dirOf(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? "." : path.substr(0, pos);
}

std::string relativeTo(const std::string& base, const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  return dirOf(base) + "/" + p;
}

}  // namespace

std::string base64Decode(const std::string& in) {
  static const std::string chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (unsigned char c : in) {
    auto pos = chars.find(static_cast<char>(c));
    if (pos == std::string::npos) continue;  // skips '=', newlines
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

KubeConfig loadKubeconfig(const std::string& path) {
  YAML::Node root = YAML::LoadFile(path);
  std::string ctxName = root["current-context"] ? root["current-context"].as<std::string>() : "";
  YAML::Node ctx;
  if (ctxName.empty()) {
    if (!root["contexts"] || root["contexts"].size() == 0) throw std::runtime_error("kubeconfig: no contexts");
    ctx = root["contexts"][0];
  } else {
    ctx = findNamed(root["contexts"], ctxName, "context");
  }
  YAML::Node c = ctx["context"];
  KubeConfig cfg;
  YAML::Node cluster = findNamed(root["clusters"], c["cluster"].as<std::string>(), "cluster")["cluster"];
  cfg.server = cluster["server"].as<std::string>();
  if (cluster["certificate-authority"]) cfg.caFile = relativeTo(path, cluster["certificate-authority"].as<std::string>());
  if (cluster["certificate-authority-data"])
    cfg.caData = base64Decode(cluster["certificate-authority-data"].as<std::string>());
  if (cluster["insecure-skip-tls-verify"]) cfg.insecure = cluster["insecure-skip-tls-verify"].as<bool>();
  if (c["user"] && root["users"]) {
    YAML::Node user = findNamed(root["users"], c["user"].as<std::string>(), "user")["user"];
    if (user && user["token"]) cfg.token = user["token"].as<std::string>();
    if (user && user["tokenFile"]) cfg.token = trim(readFile(relativeTo(path, user["tokenFile"].as<std::string>())));
  }
  if (c["namespace"]) cfg.defaultNamespace = c["namespace"].as<std::string>();
  while (!cfg.server.empty() && cfg.server.back() == '/') cfg.server.pop_back();
  return cfg;
}

KubeConfig loadInCluster(const std::string& saDir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !port) throw std::runtime_error("not in a cluster: KUBERNETES_SERVICE_HOST/PORT unset");
  KubeConfig cfg;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  cfg.server = "https://" + h + ":" + port;
  cfg.token = trim(readFile(saDir + "/token"));
  cfg.caFile = saDir + "/ca.crt";
  std::ifstream ns(saDir + "/namespace");
  if (ns) std::getline(ns, cfg.defaultNamespace);
  return cfg;
}

KubeConfig resolveConfig(const std::string& kubeconfigFlag) {
  if (!kubeconfigFlag.empty()) return loadKubeconfig(kubeconfigFlag);
  if (const char* env = std::getenv("KUBECONFIG"); env && *env) return loadKubeconfig(env);
  return loadInCluster();
}

}  // namespace edit::op::kube
