// Where the Kubernetes API is and how to authenticate: in-cluster service account or a
// kubeconfig file (current context; bearer token, CA file/data, insecure-skip-tls-verify).
#pragma once

#include <string>

namespace edit::op::kube {

struct KubeConfig {
  std::string server;            // https://host:port or http://host:port (the stand-in)
  std::string token;             // bearer token; empty: none
  std::string caFile;            // PEM file; empty: system roots
  std::string caData;            // PEM text (kubeconfig certificate-authority-data, decoded)
  bool insecure = false;         // skip TLS verification
  std::string defaultNamespace = "default";
};

// Reads a kubeconfig (YAML) and picks its current context. Throws std::runtime_error.
KubeConfig loadKubeconfig(const std::string& path);

// KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount/*.
// Throws when not running in a cluster.
KubeConfig loadInCluster(const std::string& saDir = "/var/run/secrets/kubernetes.io/serviceaccount");

// --kubeconfig if given, else $KUBECONFIG, else in-cluster.
KubeConfig resolveConfig(const std::string& kubeconfigFlag);

std::string base64Decode(const std::string& in);

}  // namespace edit::op::kube
