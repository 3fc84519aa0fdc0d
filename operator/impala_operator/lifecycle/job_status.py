"""Pure status computation: child objects + the sidecar's snapshot -> the ImpalaJob's `.status`.

Children arrive as the API's JSON dicts (camelCase); they are reduced to small views here
(`learner_pod_view`, `deployment_view`) so the lifecycle and autoscaler never see raw objects.
The field names are the CRD's status schema (`crd.status_schema`): anything else is pruned by the
API server, so `compute_status` writes only those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from impala_api import names
from impala_api.roles import STATUS_PORT
from impala_api.snapshot import StatusSnapshot, duration_text
from impala_operator.lifecycle.conditions import (
    parse_time,
    rfc3339,
    set_condition,
    stamp_conditions,
)
from impala_operator.lifecycle.run_policy import INVALID_SPEC, Event, JobState, LearnerPod
from impala_operator.scale.autoscaler import MetricSample

LEARNER_CONTAINER = "learner"
SPEC_HASH_ANNOTATION = "impala.dev/pod-spec-hash"
"""On the learner pod: hash of the pod spec it was created from. Pods are immutable, so when the
job's learner settings (resources, image, placement) change, a differing hash means "recreate".
On a rollout/aggregator Deployment: hash of its spec bar the replicas, so that the timer, its one
writer, re-applies it when the job's settings for its pods change."""
RETIRED_ANNOTATION = "impala.dev/retired"
"""Set by the operator on a learner pod just before it deletes it (`runtime.handlers.execute`):
a learner pod deleted without it was deleted by someone else, which the run policy counts."""
REQUESTED_ANNOTATION = "impala.dev/requested-replicas"
"""On a rollout/aggregator Deployment: the `spec.<group>.replicas` the operator last honoured, so
a `kubectl scale ij/NAME` (a new request) is told apart from the autoscaler's own changes."""


@dataclass(frozen=True)
class DeploymentView:
    """A rollout/aggregator Deployment, as far as the operator cares."""

    name: str
    replicas: int
    """spec.replicas: what the operator last set."""
    ready: int
    requested: str | None
    """REQUESTED_ANNOTATION's value ("" for no request), None if the annotation is absent."""
    observed: int = 0
    """status.replicas: pods that exist and are not being deleted (what the scale subresource
    reports)."""
    terminating: int = 0
    """status.terminatingReplicas: pods being deleted that have not ended yet (a rollout worker
    draining its last fragment). Beta and on since Kubernetes 1.35; absent before, read as 0."""
    spec_hash: str | None = None
    """SPEC_HASH_ANNOTATION's value: the spec it was last applied with, replicas aside."""


def _learner_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        if cs.get("name") == LEARNER_CONTAINER:
            return dict(cs)
    return {}


DISRUPTED_POD_REASONS = frozenset(
    {"Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated"}
)
"""Pod `status.reason`s the kubelet or node controllers set when they end a pod (node-pressure
eviction, graceful node shutdown, a lost node): the cluster's doing, not the learner's."""
SIGTERM_EXIT_CODES = frozenset({130, 143})
"""The learner's exits on SIGTERM (130: it stopped cleanly after its final checkpoint; 143: the
signal's default). Only the kubelet sends it, when something ends the pod from outside."""


def disruption(pod_status: Mapping[str, Any], exit_code: int | None) -> str:
    """Why a pod ended from outside ("" if nothing says so): the DisruptionTarget condition
    (eviction, preemption, taint manager, kubelet, pod GC), a node reason, or a SIGTERM exit."""
    for cond in pod_status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f"DisruptionTarget: {cond.get('reason') or 'unknown reason'}"
    if pod_status.get("reason") in DISRUPTED_POD_REASONS:
        return str(pod_status["reason"])
    if exit_code in SIGTERM_EXIT_CODES:
        return f"exit code {exit_code} after SIGTERM"
    return ""


def learner_pod_view(pod: Mapping[str, Any]) -> LearnerPod:
    """A learner pod's name, attempt, phase, readiness and learner-container outcome."""
    meta = pod.get("metadata", {})
    pod_status = pod.get("status", {})
    attempt = meta.get("labels", {}).get(names.RESTART_KEY, "0")
    rank = meta.get("labels", {}).get(names.RANK_KEY, "0")
    terminated = (_learner_container(pod).get("state") or {}).get("terminated") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod_status.get("conditions") or []
    )
    return LearnerPod(
        name=meta.get("name", ""),
        attempt=int(attempt) if str(attempt).isdigit() else -1,
        phase=pod_status.get("phase") or "Pending",
        ready=ready,
        exit_code=terminated.get("exitCode"),
        reason=terminated.get("reason") or "",
        message=terminated.get("message") or "",
        deleting=bool(meta.get("deletionTimestamp")),
        finished_at=parse_time(terminated.get("finishedAt")),
        spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION),
        retired=RETIRED_ANNOTATION in (meta.get("annotations") or {}),
        rank=int(rank) if str(rank).isdigit() else 0,
        unschedulable=_unschedulable(pod_status),
        disruption=disruption(pod_status, terminated.get("exitCode")),
    )


def _unschedulable(pod_status: Mapping[str, Any]) -> str:
    """The scheduler's message while it cannot place the pod, else ""."""
    for cond in pod_status.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled", "False", "Unschedulable"
        ):  # fmt: skip
            return str(cond.get("message") or "Unschedulable")
    return ""


def deployment_view(deployment: Mapping[str, Any]) -> DeploymentView:
    """A Deployment's desired/ready replicas, the request annotation and its spec's hash."""
    meta = deployment.get("metadata", {})
    return DeploymentView(
        name=meta.get("name", ""),
        replicas=int(deployment.get("spec", {}).get("replicas") or 0),
        ready=int(deployment.get("status", {}).get("readyReplicas") or 0),
        observed=int(deployment.get("status", {}).get("replicas") or 0),
        terminating=int(deployment.get("status", {}).get("terminatingReplicas") or 0),
        requested=(meta.get("annotations") or {}).get(REQUESTED_ANNOTATION),
        spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION),
    )


def sidecar_url(name: str, namespace: str, annotations: Mapping[str, str]) -> str:
    """Where the operator reads the job's `/status`: the status-url annotation, else the
    `<job>-status` Service."""
    override = annotations.get(names.STATUS_URL_ANNOTATION, "").strip()
    return override or status_url(name, namespace)


def status_url(name: str, namespace: str) -> str:
    """`status.statusURL`: the sidecar's /status through the job's Service."""
    return f"{names.status_url(name, namespace, STATUS_PORT)}/status"


def metric_sample(snapshot: StatusSnapshot | None, now: float, stale_after: float) -> MetricSample:
    """The autoscaler's reading of one snapshot: unavailable if missing, stale or not running."""
    if snapshot is None or snapshot.phase != "Running" or now - snapshot.updated_at > stale_after:
        return MetricSample(time=now, available=False)
    return MetricSample(
        time=now,
        available=True,
        queue_fill=snapshot.learner_queue.fill,
        idle_fraction=snapshot.learner_queue.learner_idle_fraction,
        env_steps_per_s=snapshot.throughput.env_steps_per_s,
    )


def progress(snapshot: StatusSnapshot) -> dict[str, Any]:
    """`status.progress` from a sidecar snapshot: `returnMean` is the return the run is judged
    by (the RETURN column), its training return's, or for a job scored against a fixed opponent
    its evaluation's."""
    trend = snapshot.return_trend
    best = trend.best_return_mean if trend.source == "training" else None
    evaluation: dict[str, Any] = {}
    if snapshot.evaluation is not None:
        ev = snapshot.evaluation
        evaluation = {
            "evaluationReturnMean": ev.episode_return_mean,
            "evaluationTimesteps": ev.num_env_steps_sampled,
            "bestEvaluationReturnMean": ev.best_return_mean,
            **({"bestCheckpoint": ev.best_checkpoint} if ev.best_checkpoint else {}),
            **({"evaluationWinRate": ev.win_rate} if ev.win_rate is not None else {}),
        }
    policies = {
        name: {
            "episodeReturnMean": p.episode_return_mean,
            "episodes": p.episodes,
            **({"selfPlayScore": p.self_play_score} if p.self_play_score is not None else {}),
        }
        for name, p in snapshot.policies.items()
    }
    return {
        "timesteps": snapshot.counters.num_env_steps_sampled,
        "episodes": snapshot.counters.episodes,
        "episodeReturnMean": snapshot.episode_return_mean,
        "returnMean": snapshot.followed_return_mean,
        "returnSource": trend.source,
        **({"bestEpisodeReturnMean": best} if best is not None else {}),
        **evaluation,
        **({"policies": policies} if policies else {}),
        "stopProgress": round(snapshot.stop.progress, 4),
        **_completion(snapshot),
        "envStepsPerSecond": round(snapshot.throughput.env_steps_per_s, 3),
        "learnerQueueFill": round(snapshot.learner_queue.fill, 4),
        "policyVersion": snapshot.counters.policy_version,
        "updatedAt": rfc3339(snapshot.updated_at),
    }


RUNNING = ("Starting", "Running")
"""The phases a job has time left in (the ETA column)."""
TIME_LEFT_KEYS = ("remainingSeconds", "eta")


def _completion(snapshot: StatusSnapshot) -> dict[str, Any]:
    """Percent done and the time left, where the stop criteria let them be known (timesteps,
    timeLimitSeconds); the time left only while the run goes on."""
    stop, out = snapshot.stop, dict[str, Any]()
    if stop.foreseeable is not None:
        out["percentComplete"] = int(100 * stop.foreseeable)
    if stop.remaining_seconds is not None and snapshot.phase in RUNNING:
        out["remainingSeconds"] = round(stop.remaining_seconds)
        out["eta"] = duration_text(stop.remaining_seconds)
    return out


def return_regressed(
    status: dict[str, Any],
    snapshot: StatusSnapshot | None,
    now: float,
    generation: int | None = None,
) -> Event | None:
    """Set `status`'s ReturnRegressed condition from the snapshot's return trend: True
    (ReturnFellFromBest, the trend's message) while the training return has fallen far below its
    best for long, False (ReturnHolds) otherwise once a full window of episodes has ended; left
    as it was without a snapshot; stamped with `generation` as the other conditions are. A
    Warning Event when it turns True."""
    if snapshot is None or snapshot.return_trend.first_return_mean is None:
        return None
    trend = snapshot.return_trend
    conditions = status.get("conditions") or []
    was = next((c for c in conditions if c.get("type") == RETURN_REGRESSED), None)
    if trend.regressed:
        message = trend.message or "the training return fell far below its best"
        reason = "ReturnFellFromBest"
    else:
        message, reason = "the training return holds against its best", "ReturnHolds"
    status["conditions"] = list(
        set_condition(conditions, RETURN_REGRESSED, trend.regressed, reason, message, now,
                      generation)
    )  # fmt: skip
    turned = trend.regressed and (was is None or was.get("status") != "True")
    return Event("Warning", RETURN_REGRESSED, message) if turned else None


def job_state(status: Mapping[str, Any]) -> JobState:
    """The lifecycle's state, read back from a status this module wrote."""
    conditions = tuple(dict(c) for c in status.get("conditions") or [])
    phase = status.get("phase")
    reason = ""
    if phase in ("Succeeded", "Failed"):
        reason = next((c.get("reason", "") for c in conditions if c.get("type") == phase), "")
    learner = status.get("learner") or {}
    restarts = int(learner.get("restarts") or 0)
    disruptions = int(learner.get("disruptions") or 0)
    return JobState(
        phase=phase,
        reason=reason,
        message=status.get("message") or "",
        restarts=restarts,
        # A status from before failures were counted apart: every restart was a failure.
        failures=int(learner.get("failures", restarts - disruptions) or 0),
        disruptions=disruptions,
        start_time=parse_time(status.get("startTime")),
        completion_time=parse_time(status.get("completionTime")),
        conditions=conditions,
    )


def invalid_spec_status(
    message: str, generation: int | None, previous: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The status of a job whose spec the model rejects (the API server let it through): Failed
    with InvalidSpec for that generation. The top-level observedGeneration stays the last one
    applied; the earlier conditions stay, set False, beside it."""
    conds: Sequence[dict[str, Any]] = [dict(c) for c in previous.get("conditions") or ()]
    for type_ in ("Running", "Restarting"):
        if any(c.get("type") == type_ and c.get("status") == "True" for c in conds):
            conds = set_condition(conds, type_, False, INVALID_SPEC, message, now)
    conds = set_condition(conds, "Failed", True, INVALID_SPEC, message, now)
    return {
        "phase": "Failed",
        "message": message,
        "conditions": stamp_conditions(conds, generation),
    }


def _group(view: DeploymentView | None, desired: int, selector: str) -> dict[str, Any]:
    ready = view.ready if view is not None else 0
    return {
        "desired": desired,
        "replicas": view.observed if view is not None else 0,
        "ready": ready,
        "selector": selector,
        "summary": f"{ready}/{desired}",
    }


def compute_status(
    *,
    name: str,
    namespace: str,
    state: JobState,
    learner_pods: Sequence[LearnerPod],
    rollouts: DeploymentView | None,
    aggregators: DeploymentView | None,
    desired_rollouts: int,
    desired_aggregators: int,
    snapshot: StatusSnapshot | None,
    previous: Mapping[str, Any],
    last_scale_time: float | None,
    replicas: int = 1,
) -> dict[str, Any]:
    """The whole `.status` (progress kept from `previous` while the sidecar is unreachable);
    `replicas` is `spec.learner.replicas` (`learner.summary`: ready learner pods of the attempt
    in force, of that many).

    `observedGeneration` is not computed here: it means "applied", and only the handler that
    applied a generation's children writes it. Every condition carries it too: they describe
    the job as of that generation."""
    attempt = [p for p in learner_pods if p.attempt == state.restarts]
    current = next((p for p in attempt if p.rank == 0), None)
    ready = sum(1 for p in attempt if p.ready and not p.deleting)
    last_exit = next(
        (
            p.exit_code
            for p in sorted(learner_pods, key=lambda p: -p.attempt)
            if p.exit_code is not None and p.rank == 0
        ),
        (previous.get("learner") or {}).get("lastExitCode"),
    )
    learner: dict[str, Any] = {
        "ready": bool(current and current.ready and not current.deleting),
        "replicas": replicas,
        "readyReplicas": ready,
        "summary": f"{ready}/{replicas}",
        "restarts": state.restarts,
        "failures": state.failures,
        "disruptions": state.disruptions,
        "podName": current.name if current else names.learner_pod_name(name, state.restarts),
    }
    if last_exit is not None:
        learner["lastExitCode"] = last_exit
    applied = previous.get("observedGeneration")
    status: dict[str, Any] = {
        "phase": state.phase,
        "message": state.message,
        "conditions": stamp_conditions(state.conditions, applied),
        "learner": learner,
        "rollouts": _group(rollouts, desired_rollouts, names.selector_string(name, "rollout")),
        "aggregators": _group(
            aggregators, desired_aggregators, names.selector_string(name, "aggregator")
        ),
        "statusURL": status_url(name, namespace),
    }
    if snapshot is not None:
        status["progress"] = progress(snapshot)
    elif previous.get("progress"):
        status["progress"] = dict(previous["progress"])
    if state.phase not in RUNNING and "progress" in status:
        # An ended or suspended job has no time left, whatever its last snapshot foresaw.
        status["progress"] = {
            k: v for k, v in status["progress"].items() if k not in TIME_LEFT_KEYS
        }
    for key, value in (
        ("startTime", state.start_time),
        ("completionTime", state.completion_time),
        ("lastScaleTime", last_scale_time),
    ):
        status[key] = rfc3339(value) if value is not None else None
    return status


LEARNER_POD_REFUSED = "LearnerPodRefused"
RETURN_REGRESSED = "ReturnRegressed"


def learner_pod_refused(
    status: Mapping[str, Any], pod: str, error: str, now: float
) -> tuple[dict[str, Any], Event | None]:
    """The tick's status when the API server refused to create the learner pod (a
    ServiceAccount or PriorityClass that does not exist, a quota, an admission webhook): the
    refusal as the job's message and on its Created condition (False), and a Warning Event the
    first time. The pod is asked for again every tick; startupDeadlineSeconds runs meanwhile."""
    message = (
        f"the API server refused learner pod {pod}: {error}; fix what it names (the learner's "
        "pod settings are spec.learner.pod) or create what is missing"
    )
    conditions = status.get("conditions") or ()
    was: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Created"), {})
    out = _created(status, False, LEARNER_POD_REFUSED, message, now)
    out["message"] = message
    first = was.get("reason") != LEARNER_POD_REFUSED or was.get("message") != message
    return out, Event("Warning", LEARNER_POD_REFUSED, message) if first else None


def learner_pod_is_refused(status: Mapping[str, Any]) -> bool:
    """The API server refused the learner pod at the last tick (Created=False)."""
    return any(
        c.get("type") == "Created" and c.get("reason") == LEARNER_POD_REFUSED
        for c in status.get("conditions") or ()
    )


def learner_pod_accepted(status: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The tick's status once a refused learner pod was created after all: Created again."""
    if not learner_pod_is_refused(status):
        return dict(status)
    created = "the learner pod was created"
    out = _created(status, True, "Created", created, now)
    if str(out.get("message") or "").startswith("the API server refused learner pod"):
        out["message"] = created
    return out


def _created(
    status: Mapping[str, Any], value: bool, reason: str, message: str, now: float
) -> dict[str, Any]:
    """`status` with its Created condition set, stamped with the generation the others carry."""
    conditions = status.get("conditions") or ()
    new = set_condition(conditions, "Created", value, reason, message, now)
    generation = next((c.get("observedGeneration") for c in conditions), None)
    return {**status, "conditions": stamp_conditions(new, generation)}


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status keys that changed, as a JSON merge patch: None deletes a key, and
    a changed object carries None for each of its keys that `new` no longer has (a merge patch
    of an object merges into the stored one, so a key left out would stay)."""
    patch = {}
    for key, value in new.items():
        was = old.get(key)
        if was == value:
            continue
        if isinstance(value, Mapping) and isinstance(was, Mapping):
            value = {**dict.fromkeys(set(was) - set(value)), **value}
        patch[key] = value
    return patch
