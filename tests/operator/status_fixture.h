// A status with every field the operator writes, as it writes it (unit_status_test.cpp,
// unit_crd_schema_test.cpp).
#pragma once

#include <nlohmann/json.hpp>

inline nlohmann::json kFullStatus() {
  return nlohmann::json::parse(R"({
    "phase": "Running", "observedGeneration": 3, "replicas": 2, "selector": "edit.io/job-name=j,edit.io/rank",
    "conditions": [{"type": "Running", "status": "True", "reason": "AllWorkersRunning", "message": "m",
                    "lastTransitionTime": "2027-01-15T08:00:00Z", "observedGeneration": 3}],
    "scaling": {"from": 2, "to": 3, "startTime": "2027-01-15T08:00:00Z", "requestTime": "2027-01-15T08:00:05Z"},
    "lastScale": {"from": 1, "to": 2, "result": "Succeeded", "seconds": 12.5, "message": "m", "generation": 2},
    "link": {"rank": 1, "blockedShare": 0.25, "roundSeconds": 1.5, "stepSeconds": 0.5, "rounds": 4, "localSteps": 40},
    "workers": {"total": 2, "pending": 0, "running": 2, "succeeded": 0, "failed": 0},
    "startTime": "2027-01-15T08:00:00Z", "restarts": 1, "restartGeneration": 1, "replicaRecoveries": 2, "disruptions": 1,
    "recovery": {"ranks": [1, 3], "startTime": "2027-01-15T08:01:00Z", "failedPodUIDs": ["a", "b"]},
    "progress": {"step": 10, "totalSteps": 100, "tokens": 4096, "loss": 2.5, "tokensPerSecond": 1000.0,
                 "syncRounds": 2, "anomalies": 0, "etaSeconds": 90.0},
    "stragglers": [{"rank": 1, "pod": "j-worker-1", "node": "n1", "score": 2.5}], "stragglerCount": 1,
    "avoidNodes": [{"rank": 1, "node": "n0"}],
    "export": {"attempts": 1, "nextAttemptTime": "2027-01-15T09:01:00Z", "path": "/checkpoints/hf", "step": 40,
               "weights": "outer", "dtype": "bf16", "bytes": 123},
    "lastReportTime": "2027-01-15T08:02:00Z", "stoppedAtStep": 12, "completionTime": "2027-01-15T09:00:00Z",
    "message": "all workers running"
  })");
}
