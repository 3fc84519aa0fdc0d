"""The job the operator's planner and handler tests reconcile: its uid, its spec, the operator's
settings (`test_plan.py` and `test_handlers.py` plan and handle the same job)."""

from __future__ import annotations

from typing import Any

from impala_operator.settings import Settings

UID = "0f9a5a3c-1111-2222-3333-444455556666"
SETTINGS = Settings(restart_backoff_seconds=0.0, rollout_workers_per_aggregator=2)


SPEC: dict[str, Any] = {
    "rollouts": {
        "minReplicas": 1,
        "maxReplicas": 5,
        "workersPerPod": 2,
        "autoscaling": {"cooldownSeconds": 0, "stabilizationWindowSeconds": 10},
    },
    "aggregators": {"minReplicas": 0, "maxReplicas": 4},
    "stop": {"timesteps": 1_000_000},
}
"""The job of the operator's planner and handler tests."""
