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

T0 = 1_700_000_000.0
"""The planner tests' clock."""


def tick(job: Any, uid: str = UID, **overrides: Any) -> Any:
    """`plan_tick` of `job` (an ImpalaJob) with a fresh job's inputs, `overrides` replacing them:
    no status, pods, Deployments, samples or snapshot, at T0, with SETTINGS."""
    from impala_operator.lifecycle.plan import plan_tick

    args: dict[str, Any] = {
        "status": {},
        "pods": [],
        "deployments": {"rollout": None, "aggregator": None},
        "samples": [],
        "snapshot": None,
        "now": T0,
        "settings": SETTINGS,
        **overrides,
    }
    return plan_tick(job, uid, **args)
