"""runPolicy as a pure state machine: observed learner pods + previous state + now -> next state.

Phases: Pending (no learner running yet) -> Starting (learner container up, sidecar not ready) ->
Running (learner ready); Suspended; Succeeded and Failed are terminal. The learner is a bare pod
named by attempt (`<job>-learner-<n>`, n = `status.learner.restarts`), so "restart" means "create
attempt n+1": the attempt number in status is the whole restart record, which makes a restart
idempotent across operator crashes (a failure of attempt n always leads to attempt n+1, however
often it is observed). Semantics follow the Kubernetes Job and Kubeflow's runPolicy: backoffLimit
counts retries of real failures only (a disrupted attempt, as the Job's podFailurePolicy `Ignore`
on DisruptionTarget, restarts at once and uses none), activeDeadlineSeconds runs from startTime
(reset by suspend/resume, as for Jobs), cleanPodPolicy applies on both success and failure,
ttlSecondsAfterFinished deletes the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from impala_api.spec import RunPolicy
from impala_operator.lifecycle.conditions import parse_time, set_condition

Phase = Literal["Pending", "Starting", "Running", "Suspended", "Succeeded", "Failed"]
INVALID_SPEC = "InvalidSpec"
MAX_RESTART_DELAY = 360.0  # the Job controller's cap on its exponential pod-failure backoff


CONFIG_EXIT_CODE = 2
"""The trainer's EXIT_USAGE: bad input, nothing started. Retrying cannot help, so the job fails
at once instead of using its backoffLimit (like a Job's podFailurePolicy `FailJob` rule)."""


@dataclass(frozen=True)
class LearnerPod:
    """What the lifecycle needs to know about one learner pod."""

    name: str
    attempt: int
    phase: str = "Pending"
    """Pod phase: Pending, Running, Succeeded, Failed, Unknown."""
    ready: bool = False
    exit_code: int | None = None
    """Exit code of the learner container once it terminated (the sidecar may still run)."""
    reason: str = ""
    """Termination reason of the learner container (Completed, Error, OOMKilled...)."""
    message: str = ""
    deleting: bool = False
    """The pod has a deletionTimestamp: it is going away and says nothing about the run."""
    retired: bool = False
    """The operator deleted it (suspend, queue hold, spec change, the job's end); a learner pod
    deleted without this was deleted by someone else (a user, a drain): a disruption."""
    rank: int = 0
    """Its rank among `spec.learner.replicas`: 0 runs the driver (its exit is the attempt's
    outcome), 1..N-1 a learner each that the group cannot train without."""
    unschedulable: str = ""
    """The scheduler's reason while it cannot place the pod (PodScheduled=False), else ""."""
    finished_at: float | None = None
    """When the learner container terminated (unix seconds)."""
    spec_hash: str | None = None
    """Hash of the pod spec the operator created it with (None: not recorded)."""
    disruption: str = ""
    """Why the pod was disrupted rather than failed ("" if it was not): its DisruptionTarget
    condition's reason, a kubelet/node reason (Evicted, Shutdown, ...), or a SIGTERM exit."""

    @property
    def finished(self) -> bool:
        return self.succeeded or self.failed

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 or (self.phase == "Succeeded" and self.exit_code is None)

    @property
    def failed(self) -> bool:
        return (self.exit_code is not None and self.exit_code != 0) or (
            self.phase == "Failed" and self.exit_code is None
        )

    @property
    def misconfigured(self) -> bool:
        """Exited with the trainer's bad-input code: the same attempt again would fail the same
        way (an invalid manifest, a storageUri holding another job's run)."""
        return self.exit_code == CONFIG_EXIT_CODE and not self.disruption

    @property
    def disrupted(self) -> bool:
        """Ended by the cluster, not by a fault of its own: the attempt is retried for free."""
        return self.failed and bool(self.disruption)

    @property
    def taken(self) -> bool:
        """Being deleted by someone other than the operator (`kubectl delete pod`, a drain)."""
        return self.deleting and not self.retired


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the ImpalaJob."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class JobState:
    """The lifecycle's part of `status`, as plain values."""

    phase: Phase | None = None
    reason: str = ""
    message: str = ""
    restarts: int = 0
    """Learner attempt in force (= restarts so far, failures plus disruptions)."""
    failures: int = 0
    """Attempts that failed on their own: what backoffLimit counts."""
    disruptions: int = 0
    """Attempts the cluster ended (evicted, preempted, node lost): retried without a count."""
    start_time: float | None = None
    completion_time: float | None = None
    last_failure_time: float | None = None
    """When the previous attempt failed, if known (else read from that pod's finishedAt)."""
    conditions: tuple[dict[str, Any], ...] = ()

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed") and self.reason != INVALID_SPEC


@dataclass(frozen=True)
class Outcome:
    """The next state and what to do to get there."""

    state: JobState
    run_learner: bool
    """The learner pod of attempt `state.restarts` should exist."""
    run_workers: bool
    """Rollout/aggregator Deployments at their desired replicas (else scaled to 0)."""
    delete_pods: tuple[str, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    """Seconds until a time-based transition (backoff, deadline, TTL) is due."""


def restart_delay(restarts: int, base: float) -> float:
    """Wait before attempt `restarts` (>= 1): base, 2 base, 4 base... capped like the Job's."""
    return min(MAX_RESTART_DELAY, base * 2.0 ** max(0, restarts - 1))


def _finish(
    state: JobState, pods: Sequence[LearnerPod], policy: RunPolicy, now: float, events: list[Event]
) -> Outcome:
    """A terminal state: cleanPodPolicy, then the TTL."""
    if policy.clean_pod_policy == "All":
        doomed = [p.name for p in pods if not p.deleting]
    elif policy.clean_pod_policy == "Running":
        # A learner pod whose learner container has ended is finished, though its phase stays
        # Running until the kubelet stops the status sidecar: kept, with the learner's log.
        doomed = [
            p.name
            for p in pods
            if not p.deleting and p.phase in ("Pending", "Running") and not p.finished
        ]
    else:
        doomed = []
    ttl = policy.ttl_seconds_after_finished
    delete_job, requeue = False, None
    if ttl is not None and state.completion_time is not None:
        left = state.completion_time + ttl - now
        delete_job = left <= 0
        if delete_job:
            events.append(
                Event("Normal", "TTLExpired", f"deleting the job {ttl}s after it finished")
            )
        else:
            requeue = left
    return Outcome(
        state,
        run_learner=False,
        run_workers=policy.clean_pod_policy == "None",
        delete_pods=tuple(doomed),
        delete_job=delete_job,
        events=tuple(events),
        requeue_after=requeue,
    )


def _transition(
    state: JobState, phase: Phase, reason: str, message: str, now: float, events: list[Event]
) -> JobState:
    """Move to `phase`, recording an Event and conditions, unless already there (phases, not
    reasons, are compared: only the phase and conditions persist in status)."""
    if state.phase == phase:
        return replace(state, message=message)
    warning = phase == "Failed" or reason == "LearnerFailed"
    events.append(Event("Warning" if warning else "Normal", reason, message))
    conds = state.conditions
    if phase == "Running" and any(c.get("type") == "Restarting" for c in conds):
        conds = set_condition(conds, "Restarting", False, "Running", "learner running", now)
    if phase in ("Running", "Succeeded", "Failed", "Suspended") or state.phase == "Running":
        conds = set_condition(conds, "Running", phase == "Running", reason, message, now)
    if phase in ("Suspended",) or state.phase == "Suspended":
        conds = set_condition(conds, "Suspended", phase == "Suspended", reason, message, now)
    if phase in ("Succeeded", "Failed"):
        conds = set_condition(conds, phase, True, reason, message, now)
    return replace(state, phase=phase, reason=reason, message=message, conditions=conds)


def _restart(state: JobState, reason: str, message: str, now: float, **counts: Any) -> JobState:
    """The next attempt, Pending: restarts + 1 and the given counters; Restarting=True, and
    Running=False if it was set (no learner runs until the next one)."""
    conds = set_condition(state.conditions, "Restarting", True, reason, message, now)
    if any(c.get("type") == "Running" for c in conds):
        conds = set_condition(conds, "Running", False, reason, message, now)
    return replace(
        state,
        phase="Pending",
        reason=reason,
        message=message,
        restarts=state.restarts + 1,
        conditions=conds,
        **counts,
    )


def _not_running_since(state: JobState, started: float, now: float) -> float:
    """Since when the job has had no running learner: now if it was running until this step,
    else the Running condition's last flip to False (a learner that ran and was lost), else the
    job's start."""
    if state.phase == "Running":
        return now
    running = next((c for c in state.conditions if c.get("type") == "Running"), None)
    if running is not None and running.get("status") == "False":
        flipped = parse_time(running.get("lastTransitionTime"))
        if flipped is not None:
            return max(started, flipped)
    return started


@dataclass(frozen=True)
class _End:
    """The job ends this step: the terminal phase it takes, why, and the message saying so."""

    phase: Literal["Succeeded", "Failed"]
    reason: str
    message: str


def _end(
    state: JobState,
    end: _End,
    pods: Sequence[LearnerPod],
    policy: RunPolicy,
    now: float,
    events: list[Event],
) -> Outcome:
    """Enter the terminal phase `end` names, completed now, and finish the job."""
    state = _transition(state, end.phase, end.reason, end.message, now, events)
    return _finish(replace(state, completion_time=now), pods, policy, now, events)


def _admit(state: JobState, now: float, events: list[Event]) -> JobState:
    """A new job, or one whose invalid spec was fixed, is accepted: Pending, Created=True."""
    if state.phase is not None and not (state.phase == "Failed" and state.reason == INVALID_SPEC):
        return state
    conds = state.conditions
    if state.phase == "Failed":  # the spec was fixed: no stale terminal condition stays
        conds = set_condition(conds, "Failed", False, "SpecFixed", "spec is valid again", now)
    conds = set_condition(conds, "Created", True, "Created", "job accepted", now)
    events.append(Event("Normal", "Created", "job accepted; creating its children"))
    return replace(state, phase="Pending", reason="Created", conditions=conds)


def _suspend(
    state: JobState, pods: Sequence[LearnerPod], now: float, events: list[Event]
) -> Outcome:
    """Suspended: the learner pods still pending or running go, workers scale to 0, and the
    clock of activeDeadlineSeconds stops (resuming starts it afresh, as for Jobs)."""
    msg = "suspended: all pods stopped, checkpoint kept"
    state = _transition(state, "Suspended", "Suspended", msg, now, events)
    state = replace(state, start_time=None)
    doomed = tuple(p.name for p in pods if not p.deleting and p.phase in ("Pending", "Running"))
    return Outcome(
        state, run_learner=False, run_workers=False, delete_pods=doomed, events=tuple(events)
    )


@dataclass(frozen=True)
class Hold:
    """Why a job that is neither suspended nor finished may not run now: Kueue has not admitted
    it, or evicted it (`lifecycle.admission`); `fails`: nor ever will (it asks for more than the
    queue's quota could hold), so the job fails with this reason."""

    reason: str
    message: str
    fails: bool = False


def _hold(
    state: JobState, hold: Hold, pods: Sequence[LearnerPod], now: float, events: list[Event]
) -> Outcome:
    """Held by the queue: like a suspend (pods stopped, the learner checkpointing on SIGTERM,
    the same attempt resuming later, activeDeadlineSeconds' clock stopped), but Pending: the job
    waits for admission, it was not stopped by its owner."""
    # No Event here: the queue's own condition (`Admitted`) says why, and its flips are posted.
    state = _transition(state, "Pending", hold.reason, hold.message, now, [])
    state = replace(state, reason=hold.reason, start_time=None)
    doomed = tuple(p.name for p in pods if not p.deleting and p.phase in ("Pending", "Running"))
    return Outcome(
        state, run_learner=False, run_workers=False, delete_pods=doomed, events=tuple(events)
    )


def _resume(state: JobState, now: float, events: list[Event]) -> JobState:
    """Not suspended: a suspended job resumes Pending, and the job's clock starts if it has not
    (the same attempt goes on: the learner resumes from its checkpoint)."""
    if state.phase == "Suspended":
        state = _transition(state, "Pending", "Resumed", "resumed from the checkpoint", now, events)
    if state.start_time is None:
        state = replace(state, start_time=now)
    return state


def _judge_attempt(
    state: JobState,
    pod: LearnerPod,
    policy: RunPolicy,
    now: float,
    events: list[Event],
    peers: Sequence[LearnerPod] = (),
) -> JobState | _End:
    """What the finished learner attempt `pod` (rank 0) means: success ends the job, a
    disruption or a failure within backoffLimit restarts it (the next attempt, Pending), a
    refused configuration or a failure past backoffLimit fails it. A driver that failed because
    the cluster took one of its `peers` (the group cannot train without it) was disrupted."""
    if pod.succeeded:
        msg = pod.message or "learner finished: a stop criterion was met"
        return _End("Succeeded", "Completed", msg)
    if pod.disrupted:
        return _disrupted(state, pod, now, events)
    taken = next((p for p in peers if p.disrupted or p.taken), None)
    if taken is not None:
        why = taken.disruption if taken.disrupted else "deleted"
        pod = replace(pod, disruption=f"learner {taken.name} {why}")
        return _disrupted(state, pod, now, events)
    if pod.misconfigured:
        return _misconfigured(pod)
    return _failed(state, pod, policy, now, events)


def _disrupted(state: JobState, pod: LearnerPod, now: float, events: list[Event]) -> JobState:
    """The cluster ended the attempt: the next one starts at once (no backoff, as the last
    failure time is cleared) and counts a disruption, not a failure."""
    msg = (
        f"learner attempt {pod.attempt} was disrupted ({pod.disruption}); attempt "
        f"{state.restarts + 1} resumes from the latest checkpoint (no retry used)"
    )
    return _restart_disrupted(state, "Normal", "LearnerDisrupted", msg, now, events)


def _restart_disrupted(
    state: JobState,
    kind: Literal["Normal", "Warning"],
    reason: str,
    msg: str,
    now: float,
    events: list[Event],
) -> JobState:
    """The next attempt at once (no backoff: the last failure time is cleared), one more
    disruption, announced."""
    events.append(Event(kind, reason, msg))
    return _restart(
        state, reason, msg, now, disruptions=state.disruptions + 1, last_failure_time=None
    )


def _replaced(state: JobState, pod: LearnerPod, now: float, events: list[Event]) -> JobState:
    """Someone else deleted the running attempt's pod (`kubectl delete pod`, a drain): like a
    disruption, the next attempt resumes from the checkpoint the learner wrote on SIGTERM, and
    it is counted and announced."""
    msg = (
        f"learner pod {pod.name} was deleted (not by the operator); attempt "
        f"{state.restarts + 1} resumes from its final checkpoint once it is gone (no retry used)"
    )
    return _restart_disrupted(state, "Warning", "LearnerReplaced", msg, now, events)


def _peer_lost(
    state: JobState,
    peer: LearnerPod,
    replicas: int,
    policy: RunPolicy,
    now: float,
    events: list[Event],
) -> JobState | _End:
    """A learner of rank >= 1 ended or is being taken while the group runs: the whole group
    restarts from the newest checkpoint (gang semantics), counted as a disruption when the
    cluster or a user ended it, else as a failure."""
    if peer.taken or peer.disrupted or peer.succeeded:
        why = "was deleted" if peer.taken else f"ended ({peer.disruption or 'exit 0'})"
        msg = (
            f"learner pod {peer.name} {why}; the group of {replicas} learners restarts: attempt "
            f"{state.restarts + 1} resumes from the newest checkpoint (no retry used)"
        )
        return _restart_disrupted(state, "Warning", "LearnerReplaced", msg, now, events)
    return _failed(state, peer, policy, now, events)


def _misconfigured(pod: LearnerPod) -> _End:
    """The trainer refused its input: the job fails at once, quoting the learner's last line."""
    last = pod.message.strip().splitlines()[-1:] or [""]
    msg = f"learner attempt {pod.attempt} refused its configuration: {last[0]}".rstrip(": ")
    return _End("Failed", "InvalidConfiguration", msg)


def _failed(
    state: JobState, pod: LearnerPod, policy: RunPolicy, now: float, events: list[Event]
) -> JobState | _End:
    """The attempt failed on its own: retried (one more failure, backed off from now) while
    backoffLimit allows, else the job fails with BackoffLimitExceeded."""
    why = f"learner attempt {pod.attempt} exited with code {pod.exit_code}"
    why += f" ({pod.reason})" if pod.reason else ""
    if state.failures >= policy.backoff_limit:
        msg = f"{why}; backoffLimit {policy.backoff_limit} reached"
        return _End("Failed", "BackoffLimitExceeded", msg)
    failures = state.failures + 1
    msg = f"{why}; retry {failures} of {policy.backoff_limit} from the latest checkpoint"
    events.append(Event("Warning", "LearnerFailed", msg))
    return _restart(state, "LearnerFailed", msg, now, failures=failures, last_failure_time=now)


def _deadlines(
    policy: RunPolicy,
    state: JobState,
    current: LearnerPod | None,
    now: float,
    waiting: Sequence[LearnerPod] = (),
) -> list[float] | _End:
    """activeDeadlineSeconds (from the job's start) and, while the learners are not all ready
    (rank 0 `current` and the group's others still `waiting`), startupDeadlineSeconds (from when
    they last ran): the job fails once either is reached, else the seconds left before each."""
    started = state.start_time if state.start_time is not None else now
    deadline = policy.active_deadline_seconds
    if deadline is not None and now - started >= deadline:
        msg = f"running longer than activeDeadlineSeconds ({deadline}s)"
        return _End("Failed", "DeadlineExceeded", msg)
    waits = [] if deadline is None else [started + deadline - now]
    startup = policy.startup_deadline_seconds
    if startup is not None and not (current is not None and current.ready and not waiting):
        waiting_since = _not_running_since(state, started, now)
        if now - waiting_since >= startup:
            msg = f"the learner did not become ready within startupDeadlineSeconds ({startup}s)"
            unplaced = [p for p in (current, *waiting) if p is not None and p.unschedulable]
            msg += "".join(f"; {_why_waiting(p)}" for p in unplaced)
            return _End("Failed", "StartupDeadlineExceeded", msg)
        waits.append(waiting_since + startup - now)
    return waits


def _backoff(
    state: JobState,
    pods: Sequence[LearnerPod],
    current: LearnerPod | None,
    now: float,
    base: float,
) -> float | None:
    """Seconds the next attempt must still wait after a failure before its pod is created (the
    delay doubles with each failure), or None: the learner may run now."""
    # Back off after a failure only: a disrupted attempt is replaced at once.
    failed_at = state.last_failure_time or next(
        (
            p.finished_at
            for p in pods
            if p.attempt == state.restarts - 1 and p.rank == 0 and p.finished_at
            and not p.disrupted
        ),
        None,
    )
    if current is None and state.failures > 0 and failed_at is not None:
        due = failed_at + restart_delay(state.failures, base)
        if now < due:
            return due - now
    return None


def _phase_of_current_pod(
    state: JobState,
    current: LearnerPod | None,
    now: float,
    events: list[Event],
    waiting: Sequence[LearnerPod] = (),
) -> JobState:
    """The phase the current attempt's pods show: Pending until rank 0 runs (or while it is yet
    to be created), Starting while it is up but not ready or the group's others (`waiting`) are
    not, naming them and why, Running once all are ready."""
    if current is None or current.phase == "Pending":
        unplaced = current is not None and bool(current.unschedulable)
        if state.phase == "Pending" and not unplaced:  # keeps a restart's or resume's message
            return state
        msg = _why_waiting(current) if current is not None and unplaced else (
            "waiting for the learner pod"
        )  # fmt: skip
        return _transition(state, "Pending", "LearnerPending", msg, now, events)
    if current.ready and not waiting:
        return _transition(state, "Running", "Running", "learner running", now, events)
    msg = "learner starting"
    if waiting:
        msg = "waiting for learner pods: " + "; ".join(_why_waiting(p) for p in waiting)
    return _transition(state, "Starting", "LearnerStarting", msg, now, events)


def _why_waiting(pod: LearnerPod) -> str:
    """A learner pod not yet ready, and the scheduler's reason when it cannot place it."""
    if pod.unschedulable:
        return f"learner pod {pod.name} cannot be scheduled: {pod.unschedulable}"
    return f"learner pod {pod.name} is {pod.phase.lower()}"


def step(
    policy: RunPolicy,
    pods: Sequence[LearnerPod],
    state: JobState,
    now: float,
    *,
    restart_backoff: float = 10.0,
    hold: Hold | None = None,
) -> Outcome:
    """One reconcile of the run policy. Pure: the caller applies the Outcome and saves the state.
    `hold` keeps a job that may not run yet (not admitted by its queue) Pending with no pods."""
    events: list[Event] = []
    state = _admit(state, now, events)
    if state.terminal:
        return _finish(state, pods, policy, now, events)
    if policy.suspend:
        return _suspend(state, pods, now, events)
    if hold is not None and hold.fails:
        return _end(state, _End("Failed", hold.reason, hold.message), pods, policy, now, events)
    if hold is not None:
        return _hold(state, hold, pods, now, events)
    state = _resume(state, now, events)
    attempt = [p for p in pods if p.attempt == state.restarts]
    current = next((p for p in attempt if p.rank == 0 and not p.deleting), None)
    peers = [p for p in attempt if p.rank > 0]
    if current is not None and current.finished:
        judged = _judge_attempt(state, current, policy, now, events, peers)
        if isinstance(judged, _End):
            return _end(state, judged, pods, policy, now, events)
        state, current = judged, None  # the next attempt: its pods are yet to be created
    elif (lost := next((p for p in peers if p.finished or p.taken), None)) is not None:
        judged = _peer_lost(state, lost, len(peers) + 1, policy, now, events)
        if isinstance(judged, _End):
            return _end(state, judged, pods, policy, now, events)
        state, current = judged, None
    replaced = next((p for p in attempt if p.rank == 0 and p.taken), None)
    if current is None and replaced is not None and state.restarts == replaced.attempt:
        state = _replaced(state, replaced, now, events)
    waiting = [p for p in peers if not p.ready and not p.deleting] if current else []
    waits = _deadlines(policy, state, current, now, waiting)
    if isinstance(waits, _End):
        return _end(state, waits, pods, policy, now, events)
    backoff = _backoff(state, pods, current, now, restart_backoff)
    if backoff is not None:
        waits.append(backoff)
    state = _phase_of_current_pod(state, current, now, events, waiting)
    # A learner still stopping (its final checkpoint on SIGTERM) must be gone before the next
    # attempt starts: two learners would write one run directory. The pods of an earlier
    # attempt still running (the other learners of a group that lost one) go.
    stopping = any(p.deleting and not p.finished for p in pods)
    stale = tuple(
        p.name
        for p in pods
        if p.attempt < state.restarts and not p.deleting and p.phase in ("Pending", "Running")
        and not p.finished
    )  # fmt: skip
    return Outcome(
        state,
        run_learner=backoff is None and not stopping and not stale,
        run_workers=True,
        delete_pods=stale,
        events=tuple(events),
        requeue_after=min(waits) if waits else None,
    )
