// The pods of a job, pure like desired.h: the base every pod of a job shares (the worker
// pods and the export pod, export_pod.h), the worker pod of one rank, and the Kueue group
// it belongs to.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "controller/desired.h"

namespace edit::op::controller {

// The pod and container securityContext of the job's pods (defaults or spec.podTemplate's).
json podSecurityContext(const api::EDiTJobSpec& s);
json containerSecurityContext(const api::EDiTJobSpec& s);

// What a pod of the job adds to the base: its labels and annotations (over the job's own
// from spec.podTemplate), its one container (name, command, env, resources, mounts) and
// its volumes (after spec.volumes).
struct PodParts {
  std::string name;
  json labels = json::object();
  json annotations = json::object();
  json container = json::object();
  json volumes = json::array();
};
// The pod every pod of the job starts from: the job's labels, annotations, image, pull
// policy and secrets, security contexts, volumes, node selector, tolerations, priority and
// service account; restartPolicy Never; owned by the job.
json basePod(const JobRef& job, PodParts parts);
// spec.checkpoint.pvc as a volume and its mount at /checkpoints (nothing without one).
void addCheckpointVolume(const api::EDiTJobSpec& s, json& volumes, json& mounts);

// How a worker pod enters the job: with the gang (a new rendezvous), as the replacement of
// a failed rank of a running gang (EDIT_JOIN=1: it takes the state from its peers), or as
// a rank of a new replica at an in-place scale-up (EDIT_JOIN=scale).
enum class PodJoin { Start, Replace, Scale };

// A Kueue pod group (plain-pod integration): the pods Kueue admits together as one
// Workload. A gang is one group per restart generation; a scale-up's new pods are another,
// admitted (with their own quota) before they start.
struct PodGroupRef {
  std::string name;  // kueue.x-k8s.io/pod-group-name (a label value: at most 63 characters)
  int total = 0;     // kueue.x-k8s.io/pod-group-total-count
};
PodGroupRef gangPodGroup(const JobRef& job, int restartGeneration);
// scaleStart: status.scaling.startTime as seconds since the epoch (one group per attempt).
PodGroupRef scalePodGroup(const JobRef& job, int restartGeneration, int from, int to, long scaleStart);

// The pod of one rank. job.spec.replicas is the number of replicas of the world the pod
// enters (WORLD_SIZE, EDIT_REPLICAS): status.replicas, or the target of a scale-up for its
// new pods. avoidNodes: nodes this rank must not land on (straggler replacement).
// group: the pod's Kueue group when the job is queued (default: the gang's).
json desiredPod(const JobRef& job, int rank, int restartGeneration, const OperatorSettings& settings,
                const std::set<std::string>& avoidNodes = {}, PodJoin join = PodJoin::Start,
                const PodGroupRef& group = {});

}  // namespace edit::op::controller
