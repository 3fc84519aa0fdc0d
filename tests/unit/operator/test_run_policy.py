"""runPolicy state machine: phases, restarts with backoff, suspend, deadline, cleanup and TTL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from impala_api.spec import RunPolicy
from impala_operator.lifecycle.conditions import parse_time, rfc3339, set_condition
from impala_operator.lifecycle.run_policy import (
    INVALID_SPEC,
    Event,
    JobState,
    LearnerPod,
    Outcome,
    _admit,
    _backoff,
    _deadlines,
    _End,
    _end,
    _judge_attempt,
    _phase_of_current_pod,
    _resume,
    _suspend,
    restart_delay,
    step,
)

T0 = 1_700_000_000.0


def _pod(attempt: int = 0, **kw: object) -> LearnerPod:
    return LearnerPod(name=f"j-learner-{attempt}", attempt=attempt, **kw)  # type: ignore[arg-type]


RUNNING = {"phase": "Running", "ready": True}


def _cond(out: Outcome, type_: str) -> dict:
    return next(c for c in out.state.conditions if c["type"] == type_)


def _reasons(out: Outcome) -> list[str]:
    return [e.reason for e in out.events]


def _run(policy: RunPolicy, state: JobState, pods: list[LearnerPod], now: float) -> Outcome:
    return step(policy, pods, state, now, restart_backoff=10.0)


def test_new_job_goes_pending_starting_running() -> None:
    policy = RunPolicy()
    out = _run(policy, JobState(), [], T0)
    assert out.state.phase == "Pending" and out.run_learner and out.run_workers
    assert out.state.start_time == T0 and _reasons(out) == ["Created"]
    assert _cond(out, "Created")["status"] == "True"

    out = _run(policy, out.state, [_pod(phase="Running", ready=False)], T0 + 1)
    assert (out.state.phase, _reasons(out)) == ("Starting", ["LearnerStarting"])

    out = _run(policy, out.state, [_pod(**RUNNING)], T0 + 2)
    assert (out.state.phase, _reasons(out)) == ("Running", ["Running"])
    assert _cond(out, "Running")["status"] == "True"
    # Steady state: no new events, the condition keeps its transition time.
    again = _run(policy, out.state, [_pod(**RUNNING)], T0 + 50)
    assert again.events == () and again.state == out.state


def test_success_cleans_all_pods_and_stops_workers() -> None:
    policy = RunPolicy(clean_pod_policy="All")
    running = _run(policy, JobState(phase="Running", start_time=T0), [_pod(**RUNNING)], T0)
    done = _run(
        policy, running.state, [_pod(phase="Running", exit_code=0, reason="Completed")], T0 + 9
    )
    assert done.state.phase == "Succeeded" and done.state.completion_time == T0 + 9
    assert done.delete_pods == ("j-learner-0",) and not done.run_learner and not done.run_workers
    assert _cond(done, "Succeeded")["status"] == "True"
    assert _cond(done, "Running")["status"] == "False"
    assert "Completed" in _reasons(done)


def test_clean_pod_policy_running_keeps_finished_pods_and_none_keeps_all() -> None:
    pods = [_pod(0, phase="Failed", exit_code=1), _pod(1, phase="Succeeded", exit_code=0)]
    state = JobState(phase="Running", start_time=T0, restarts=1)
    assert _run(RunPolicy(clean_pod_policy="Running"), state, pods, T0).delete_pods == ()
    assert _run(RunPolicy(clean_pod_policy="All"), state, pods, T0).delete_pods == (
        "j-learner-0",
        "j-learner-1",
    )
    none = _run(RunPolicy(clean_pod_policy="None"), state, pods, T0)
    assert none.delete_pods == () and none.run_workers
    # A still-running sidecar keeps a finished learner's pod Running for a moment: "Running"
    # keeps it (the learner's log is the point of keeping finished pods), "All" removes it.
    sidecar_up = [_pod(0, phase="Running", exit_code=0)]
    running = _run(RunPolicy(clean_pod_policy="Running"), replace(state, restarts=0), sidecar_up, 1)
    assert running.state.phase == "Succeeded" and running.delete_pods == ()
    every = _run(RunPolicy(clean_pod_policy="All"), replace(state, restarts=0), sidecar_up, 1)
    assert every.delete_pods == ("j-learner-0",)
    # A learner still running when the job ends (suspended-then-deleted, or a stale attempt) goes.
    stale = [_pod(0, phase="Running"), _pod(1, phase="Running", exit_code=0)]
    assert _run(RunPolicy(clean_pod_policy="Running"), state, stale, 1).delete_pods == (
        "j-learner-0",
    )


def test_failure_restarts_with_backoff_then_fails() -> None:
    policy = RunPolicy(backoff_limit=2)
    state = JobState(phase="Running", start_time=T0)
    out = _run(policy, state, [_pod(0, phase="Running", exit_code=137, reason="OOMKilled")], T0)
    assert out.state.restarts == 1 and out.state.phase == "Pending"
    assert _reasons(out) == ["LearnerFailed"] and out.events[0].type == "Warning"
    assert "OOMKilled" in out.events[0].message and "retry 1 of 2" in out.events[0].message
    assert _cond(out, "Restarting")["status"] == "True"
    # The failed attempt-0 pod is kept for its logs; attempt 1 waits for the backoff delay.
    assert not out.run_learner and out.requeue_after == 10.0 and out.delete_pods == ()
    failed0 = _pod(0, phase="Failed", exit_code=137)

    # Seen again (operator restarted, status already saved): no double counting.
    same = _run(policy, out.state, [failed0], T0 + 5)
    assert same.state.restarts == 1 and same.events == ()
    out = _run(policy, out.state, [failed0], T0 + 10)
    assert out.run_learner

    out = _run(policy, out.state, [failed0, _pod(1, **RUNNING)], T0 + 12)
    assert out.state.phase == "Running" and _cond(out, "Restarting")["status"] == "False"

    out = _run(policy, out.state, [failed0, _pod(1, phase="Failed", exit_code=1)], T0 + 20)
    assert out.state.restarts == 2 and out.requeue_after == 20.0  # doubled delay
    out = _run(policy, out.state, [failed0, _pod(2, phase="Failed", exit_code=1)], T0 + 60)
    assert out.state.phase == "Failed" and out.state.reason == "BackoffLimitExceeded"
    assert out.state.completion_time == T0 + 60 and not out.run_learner
    assert _cond(out, "Failed")["reason"] == "BackoffLimitExceeded"
    # Terminal is sticky: a later observation never revives the job.
    later = _run(policy, out.state, [_pod(2, **RUNNING)], T0 + 70)
    assert later.state.phase == "Failed" and not later.run_learner


@pytest.mark.parametrize(
    ("how", "pod"),
    [
        ("spot reclaim", {"exit_code": 143, "disruption": "exit code 143 after SIGTERM"}),
        ("node drain, final checkpoint", {"exit_code": 130, "disruption": "exit code 130"}),
        ("node shutdown", {"disruption": "Shutdown"}),
        ("preemption", {"exit_code": 137, "disruption": "DisruptionTarget: PreemptionByScheduler"}),
    ],
)
def test_a_disrupted_learner_restarts_at_once_without_using_a_retry(
    how: str, pod: dict[str, object]
) -> None:
    """Three reclaims in a row with backoffLimit 0 do not fail the job: each attempt is replaced
    at once (no backoff) and only `disruptions` counts them."""
    policy = RunPolicy(backoff_limit=0)
    state = JobState(phase="Running", start_time=T0)
    for attempt in range(3):
        gone = _pod(attempt, phase="Failed", finished_at=T0 + attempt, **pod)
        out = _run(policy, state, [gone], T0 + attempt + 1)
        assert out.state.phase == "Pending", how
        assert (out.state.restarts, out.state.failures) == (attempt + 1, 0)
        assert out.state.disruptions == attempt + 1
        assert out.run_learner and out.requeue_after is None  # the next attempt starts now
        assert _reasons(out) == ["LearnerDisrupted"] and out.events[0].type == "Normal"
        assert _cond(out, "Restarting")["reason"] == "LearnerDisrupted"
        state = out.state
    # A real failure after them is still the first one counted.
    crashed = _pod(3, phase="Failed", exit_code=1)
    out = _run(RunPolicy(backoff_limit=1), state, [crashed], T0 + 10)
    assert (out.state.failures, out.state.restarts, out.state.phase) == (1, 4, "Pending")


def test_backoff_limit_zero_fails_on_first_failure() -> None:
    out = _run(
        RunPolicy(backoff_limit=0),
        JobState(phase="Running", start_time=T0),
        [_pod(0, phase="Failed")],
        T0,
    )
    assert (out.state.phase, out.state.reason) == ("Failed", "BackoffLimitExceeded")


def test_a_refused_configuration_fails_at_once_quoting_the_learner() -> None:
    # Exit 2 is the trainer's "bad input": another attempt would refuse it again.
    refused = _pod(
        0,
        phase="Failed",
        exit_code=2,
        message="learner: starting\nimpalajob learner: error: checkpoint.storageUri s3://r/x/ "
        "holds the run of an earlier ImpalaJob 'j' (uid 1): point storageUri at a fresh prefix\n",
    )
    out = _run(RunPolicy(backoff_limit=3), JobState(phase="Running", start_time=T0), [refused], T0)
    assert (out.state.phase, out.state.reason, out.state.failures) == (
        "Failed",
        "InvalidConfiguration",
        0,
    )
    failed = _cond(out, "Failed")
    assert failed["reason"] == "InvalidConfiguration"
    assert failed["message"].endswith("point storageUri at a fresh prefix")
    # a SIGTERM'd or evicted pod is a disruption whatever its code
    evicted = replace(refused, disruption="Evicted")
    out = _run(RunPolicy(), JobState(phase="Running", start_time=T0), [evicted], T0)
    assert out.state.phase == "Pending" and out.state.disruptions == 1


def test_restart_delay_doubles_and_caps() -> None:
    assert [restart_delay(n, 10.0) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert restart_delay(30, 10.0) == 360.0 and restart_delay(3, 0.0) == 0.0


def test_suspend_stops_everything_and_resume_restarts_the_clock() -> None:
    policy = RunPolicy(suspend=True, active_deadline_seconds=100)
    state = JobState(phase="Running", start_time=T0, restarts=1)
    pods = [_pod(0, phase="Failed", exit_code=1), _pod(1, **RUNNING)]
    out = _run(policy, state, pods, T0 + 90)
    assert out.state.phase == "Suspended" and out.delete_pods == ("j-learner-1",)
    assert not out.run_learner and not out.run_workers and out.state.start_time is None
    assert _cond(out, "Suspended")["status"] == "True" and _reasons(out) == ["Suspended"]
    # Long suspensions do not count against the deadline.
    resumed = _run(RunPolicy(active_deadline_seconds=100), out.state, [pods[0]], T0 + 500)
    assert resumed.state.phase == "Pending" and resumed.state.reason == "Resumed"
    assert resumed.run_learner and resumed.state.start_time == T0 + 500
    assert resumed.state.restarts == 1  # same attempt: the learner resumes from its checkpoint
    assert _cond(resumed, "Suspended")["status"] == "False"


def test_a_pod_the_operator_deleted_says_nothing_about_the_run() -> None:
    state = JobState(phase="Running", start_time=T0)
    gone = _pod(0, phase="Failed", exit_code=143, deleting=True, retired=True)
    out = _run(RunPolicy(), state, [gone], T0)
    assert out.state.restarts == 0 and out.state.phase == "Pending" and out.run_learner
    assert (out.state.failures, out.state.disruptions) == (0, 0)


def test_a_learner_pod_deleted_by_someone_else_is_a_counted_and_announced_replacement() -> None:
    """`kubectl delete pod <job>-learner-0` (or a drain): a disruption, posted as an Event; the
    next attempt starts only once the deleted learner has written its final checkpoint and
    gone, so that two learners never share the run directory."""
    state = JobState(phase="Running", start_time=T0)
    stopping = _pod(0, phase="Running", ready=True, deleting=True)
    out = _run(RunPolicy(backoff_limit=0), state, [stopping], T0)
    assert (out.state.restarts, out.state.failures, out.state.disruptions) == (1, 0, 1)
    assert "LearnerReplaced" in _reasons(out) and not out.run_learner
    event = next(e for e in out.events if e.reason == "LearnerReplaced")
    assert event.type == "Warning" and "j-learner-0 was deleted" in event.message
    # Counted once: the next tick finds the same pod still stopping, then gone.
    again = _run(RunPolicy(backoff_limit=0), out.state, [stopping], T0 + 5)
    assert again.state.disruptions == 1 and "LearnerReplaced" not in _reasons(again)
    assert not again.run_learner
    exited = _pod(0, phase="Failed", exit_code=130, deleting=True)
    after = _run(RunPolicy(backoff_limit=0), again.state, [exited], T0 + 30)
    assert after.run_learner and after.state.restarts == 1 and after.state.phase == "Pending"


def test_deadline_fails_the_job_and_requeues_until_then() -> None:
    policy = RunPolicy(active_deadline_seconds=60)
    out = _run(policy, JobState(phase="Running", start_time=T0), [_pod(**RUNNING)], T0 + 45)
    assert out.state.phase == "Running" and out.requeue_after == 15
    out = _run(policy, out.state, [_pod(**RUNNING)], T0 + 60)
    assert (out.state.phase, out.state.reason) == ("Failed", "DeadlineExceeded")
    assert out.delete_pods == ("j-learner-0",) and out.events[-1].type == "Warning"


def test_ttl_deletes_finished_job() -> None:
    policy = RunPolicy(ttl_seconds_after_finished=30)
    done = JobState(phase="Succeeded", reason="Completed", start_time=T0, completion_time=T0 + 10)
    out = _run(policy, done, [], T0 + 20)
    assert not out.delete_job and out.requeue_after == 20
    out = _run(policy, done, [], T0 + 40)
    assert out.delete_job and "TTLExpired" in _reasons(out)
    assert not _run(RunPolicy(), done, [], T0 + 10_000).delete_job


def test_invalid_spec_failure_is_not_terminal_and_leaves_no_stale_condition() -> None:
    failed = set_condition((), "Failed", True, "InvalidSpec", "spec.x: bad", T0)
    state = JobState(phase="Failed", reason="InvalidSpec", message="spec.x: bad", conditions=failed)
    out = _run(RunPolicy(), state, [], T0 + 5)
    assert out.state.phase == "Pending" and out.run_learner
    # A fixed spec clears Failed: `kubectl wait --for=condition=Failed` must not fire on it.
    failed_now = _cond(out, "Failed")
    assert (failed_now["status"], failed_now["reason"]) == ("False", "SpecFixed")
    assert failed_now["lastTransitionTime"] == rfc3339(T0 + 5)


def test_lost_learner_pod_is_recreated_without_counting_a_failure() -> None:
    out = _run(RunPolicy(), JobState(phase="Running", start_time=T0), [], T0)
    assert out.state.phase == "Pending" and out.state.restarts == 0 and out.run_learner
    assert _reasons(out) == ["LearnerPending"] and _cond(out, "Running")["status"] == "False"


def test_set_condition_keeps_transition_time_unless_status_flips() -> None:
    conds = set_condition((), "Ready", True, "A", "a", T0)
    conds = set_condition(conds, "Ready", True, "B", "b", T0 + 5)
    assert conds[0]["lastTransitionTime"] == rfc3339(T0) and conds[0]["reason"] == "B"
    conds = set_condition(conds, "Ready", False, "C", "c", T0 + 9)
    assert conds[0]["lastTransitionTime"] == rfc3339(T0 + 9) and len(conds) == 1


def test_time_round_trip() -> None:
    assert parse_time(rfc3339(T0)) == T0 and parse_time(None) is None
    assert rfc3339(0) == "1970-01-01T00:00:00Z"


def test_startup_deadline_fails_a_learner_that_never_gets_ready() -> None:
    """KubeRay's preRunningDeadlineSeconds: e.g. a GPU no node has keeps the learner Pending."""
    policy = RunPolicy(startup_deadline_seconds=300)
    pending = [_pod(0, phase="Pending")]
    out = _run(policy, JobState(), pending, T0)
    assert out.state.phase == "Pending" and out.requeue_after == 300.0  # woken when it is due
    out = _run(policy, out.state, pending, T0 + 299)
    assert out.state.phase == "Pending" and out.requeue_after == 1.0
    out = _run(policy, out.state, pending, T0 + 300)
    assert (out.state.phase, out.state.reason) == ("Failed", "StartupDeadlineExceeded")
    assert _cond(out, "Failed")["reason"] == "StartupDeadlineExceeded"
    assert not out.run_learner


def test_startup_deadline_runs_from_the_last_running_learner() -> None:
    policy = RunPolicy(startup_deadline_seconds=300)
    running = _run(policy, JobState(phase="Running", start_time=T0), [_pod(**RUNNING)], T0)
    # Hours of training: a ready learner is never past its startup deadline.
    assert _run(policy, running.state, [_pod(**RUNNING)], T0 + 7200).state.phase == "Running"
    # Its pod is lost at T0 + 7200: the replacement has 300 s from then.
    lost = _run(policy, running.state, [], T0 + 7200)
    assert lost.state.phase == "Pending" and lost.requeue_after == 300.0
    still = _run(policy, lost.state, [_pod(0, phase="Pending")], T0 + 7499)
    assert still.state.phase == "Pending"
    late = _run(policy, still.state, [_pod(0, phase="Pending")], T0 + 7500)
    assert late.state.reason == "StartupDeadlineExceeded"


def test_running_is_false_while_the_learner_restarts() -> None:
    policy = RunPolicy()
    out = _run(policy, JobState(), [_pod(**RUNNING)], T0)
    assert _cond(out, "Running")["status"] == "True"
    out = _run(policy, out.state, [_pod(0, phase="Failed", exit_code=1)], T0 + 60)
    assert _cond(out, "Running")["status"] == "False"
    assert _cond(out, "Restarting")["status"] == "True"
    assert _cond(out, "Running")["lastTransitionTime"] == rfc3339(T0 + 60)


# Each decision of `step` on its own.


def _events() -> list[Event]:
    return []


def test_admit_accepts_a_new_job_and_a_fixed_spec_only() -> None:
    events = _events()
    new = _admit(JobState(), T0, events)
    assert (new.phase, new.reason) == ("Pending", "Created")
    assert [(e.type, e.reason) for e in events] == [("Normal", "Created")]
    assert [c["type"] for c in new.conditions] == ["Created"]

    events = _events()
    invalid = set_condition((), "Failed", True, INVALID_SPEC, "spec.x: bad", T0)
    fixed = _admit(JobState(phase="Failed", reason=INVALID_SPEC, conditions=invalid), T0, events)
    assert (fixed.phase, fixed.reason) == ("Pending", "Created")
    assert [(c["type"], c["status"], c["reason"]) for c in fixed.conditions] == [
        ("Failed", "False", "SpecFixed"),
        ("Created", "True", "Created"),
    ]

    events = _events()
    for state in (
        JobState(phase="Running", reason="Running", start_time=T0),
        JobState(phase="Failed", reason="BackoffLimitExceeded"),
        JobState(phase="Suspended"),
    ):
        assert _admit(state, T0, events) is state
    assert events == []


def test_suspend_deletes_what_runs_and_stops_the_clock() -> None:
    pods = [
        _pod(0, phase="Failed", exit_code=1),
        _pod(1, phase="Running"),
        _pod(2, phase="Pending"),
        _pod(3, phase="Running", deleting=True),
    ]
    events = _events()
    state = JobState(phase="Running", start_time=T0, restarts=3)
    out = _suspend(state, pods, T0 + 5, events)
    assert out.delete_pods == ("j-learner-1", "j-learner-2")
    assert not out.run_learner and not out.run_workers and out.requeue_after is None
    assert (out.state.phase, out.state.start_time, out.state.restarts) == ("Suspended", None, 3)
    assert _reasons(out) == ["Suspended"] and events == list(out.events)
    # Already suspended: nothing new to say.
    again = _suspend(out.state, [], T0 + 9, _events())
    assert again.events == () and again.state == out.state


def test_resume_restarts_the_clock_on_the_same_attempt() -> None:
    events = _events()
    suspended = JobState(phase="Suspended", reason="Suspended", restarts=2)
    resumed = _resume(suspended, T0, events)
    assert (resumed.phase, resumed.reason, resumed.start_time) == ("Pending", "Resumed", T0)
    assert resumed.restarts == 2 and [e.reason for e in events] == ["Resumed"]
    # Not suspended: only a missing start time is filled in, an existing one is kept.
    events = _events()
    assert _resume(JobState(phase="Pending"), T0 + 1, events).start_time == T0 + 1
    running = JobState(phase="Running", start_time=T0)
    assert _resume(running, T0 + 99, events) is running and events == []


def test_judge_attempt_success_ends_the_job_with_the_learner_message() -> None:
    state = JobState(phase="Running", start_time=T0)
    events = _events()
    done = _pod(0, phase="Running", exit_code=0, message="stopped at 1M frames")
    assert _judge_attempt(state, done, RunPolicy(), T0, events) == _End(
        "Succeeded", "Completed", "stopped at 1M frames"
    )
    quiet = _pod(0, phase="Succeeded")
    assert _judge_attempt(state, quiet, RunPolicy(), T0, events) == _End(
        "Succeeded", "Completed", "learner finished: a stop criterion was met"
    )
    assert events == []  # the terminal transition posts the event, not the judge


def test_judge_attempt_counts_a_disruption_without_touching_failures() -> None:
    state = JobState(
        phase="Running", start_time=T0, restarts=2, failures=1, last_failure_time=T0 - 50
    )
    events = _events()
    evicted = _pod(2, phase="Failed", exit_code=2, disruption="Evicted")  # code 2, yet evicted
    next_ = _judge_attempt(state, evicted, RunPolicy(backoff_limit=0), T0, events)
    assert isinstance(next_, JobState)
    assert (next_.restarts, next_.failures, next_.disruptions) == (3, 1, 1)
    assert (next_.phase, next_.reason) == ("Pending", "LearnerDisrupted")
    assert next_.last_failure_time is None  # no backoff before the next attempt
    assert [(e.type, e.reason) for e in events] == [("Normal", "LearnerDisrupted")]
    assert "attempt 2 was disrupted (Evicted); attempt 3 resumes" in events[0].message


def test_judge_attempt_misconfigured_fails_at_once_with_the_last_log_line() -> None:
    state = JobState(phase="Running", start_time=T0, failures=0)
    events = _events()
    refused = _pod(1, phase="Failed", exit_code=2, message="starting\nerror: bad storageUri\n\n")
    verdict = _judge_attempt(state, refused, RunPolicy(backoff_limit=5), T0, events)
    assert verdict == _End(
        "Failed",
        "InvalidConfiguration",
        "learner attempt 1 refused its configuration: error: bad storageUri",
    )
    assert events == []
    # Nothing logged: the message ends at the sentence, no dangling colon.
    silent = _judge_attempt(state, _pod(1, exit_code=2), RunPolicy(), T0, events)
    assert isinstance(silent, _End)
    assert silent.message == "learner attempt 1 refused its configuration"


def test_judge_attempt_failure_retries_until_the_backoff_limit() -> None:
    crashed = _pod(0, phase="Failed", exit_code=137, reason="OOMKilled")
    events = _events()
    policy = RunPolicy(backoff_limit=2)
    retry = _judge_attempt(JobState(phase="Running"), crashed, policy, T0, events)
    assert isinstance(retry, JobState)
    assert (retry.phase, retry.reason, retry.restarts, retry.failures) == (
        "Pending",
        "LearnerFailed",
        1,
        1,
    )
    assert retry.last_failure_time == T0 and retry.disruptions == 0
    assert [(e.type, e.reason) for e in events] == [("Warning", "LearnerFailed")]
    assert events[0].message == (
        "learner attempt 0 exited with code 137 (OOMKilled); "
        "retry 1 of 2 from the latest checkpoint"
    )
    events = _events()
    spent = JobState(phase="Running", failures=2)
    assert _judge_attempt(spent, crashed, policy, T0, events) == _End(
        "Failed",
        "BackoffLimitExceeded",
        "learner attempt 0 exited with code 137 (OOMKilled); backoffLimit 2 reached",
    )
    assert events == []


def test_deadlines_fail_at_exactly_the_active_deadline_and_wait_before_it() -> None:
    policy = RunPolicy(active_deadline_seconds=60)
    state = JobState(phase="Running", start_time=T0)
    ready = _pod(**RUNNING)
    assert _deadlines(policy, state, ready, T0 + 45) == [15]
    assert _deadlines(policy, state, ready, T0 + 59.5) == [0.5]
    assert _deadlines(policy, state, ready, T0 + 60) == _End(
        "Failed", "DeadlineExceeded", "running longer than activeDeadlineSeconds (60s)"
    )
    assert _deadlines(RunPolicy(), state, ready, T0 + 1e6) == []


def test_deadlines_time_the_startup_from_the_last_running_learner() -> None:
    policy = RunPolicy(startup_deadline_seconds=300, active_deadline_seconds=1000)
    never_ran = JobState(phase="Pending", start_time=T0)
    assert _deadlines(policy, never_ran, None, T0 + 100) == [900, 200]
    assert _deadlines(policy, never_ran, _pod(phase="Pending"), T0 + 300) == _End(
        "Failed",
        "StartupDeadlineExceeded",
        "the learner did not become ready within startupDeadlineSeconds (300s)",
    )
    # A ready learner is past its start-up: only the active deadline is waited for.
    assert _deadlines(policy, never_ran, _pod(**RUNNING), T0 + 900) == [100]
    # It ran until T0 + 500 (Running flipped to False then): 300 s from there.
    lost = set_condition((), "Running", False, "LearnerFailed", "gone", T0 + 500)
    was_running = JobState(phase="Pending", start_time=T0, conditions=lost)
    assert _deadlines(policy, was_running, None, T0 + 700) == [300, 100]
    # Running until this very step: the full 300 s.
    assert _deadlines(policy, replace(was_running, phase="Running"), None, T0 + 700) == [300, 300]


def test_backoff_blocks_the_next_attempt_until_it_is_due() -> None:
    state = JobState(phase="Pending", restarts=2, failures=2, last_failure_time=T0)
    assert _backoff(state, [], None, T0 + 5, 10.0) == 15.0  # second failure: 20 s
    assert _backoff(state, [], None, T0 + 19.5, 10.0) == 0.5
    assert _backoff(state, [], None, T0 + 20, 10.0) is None  # due: the learner runs
    # Once the next attempt's pod exists there is nothing to hold back.
    assert _backoff(state, [], _pod(2), T0 + 5, 10.0) is None
    # A restart without a failure (disruption, resume) never waits.
    assert _backoff(replace(state, failures=0), [], None, T0 + 5, 10.0) is None


def test_backoff_reads_the_failure_time_from_the_previous_pod_when_unknown() -> None:
    state = JobState(phase="Pending", restarts=1, failures=1)
    failed = _pod(0, phase="Failed", exit_code=1, finished_at=T0)
    assert _backoff(state, [failed], None, T0 + 4, 10.0) == 6.0
    # A disrupted previous attempt says nothing about a failure time; nor does none at all.
    disrupted = replace(failed, disruption="Evicted")
    assert _backoff(state, [disrupted], None, T0 + 4, 10.0) is None
    assert _backoff(state, [], None, T0 + 4, 10.0) is None


def test_phase_of_current_pod() -> None:
    running = JobState(phase="Running", reason="Running", start_time=T0)
    events = _events()
    gone = _phase_of_current_pod(running, None, T0, events)
    assert (gone.phase, gone.reason) == ("Pending", "LearnerPending")
    restarted = JobState(phase="Pending", reason="LearnerFailed", message="retry 1 of 3")
    assert _phase_of_current_pod(restarted, _pod(1, phase="Pending"), T0, events) is restarted
    assert [e.reason for e in events] == ["LearnerPending"]
    starting = _phase_of_current_pod(restarted, _pod(1, phase="Running"), T0, events)
    assert (starting.phase, starting.reason) == ("Starting", "LearnerStarting")
    up = _phase_of_current_pod(starting, _pod(1, **RUNNING), T0, events)
    assert (up.phase, up.reason) == ("Running", "Running")
    assert [e.reason for e in events] == ["LearnerPending", "LearnerStarting", "Running"]


def test_end_completes_the_job_now_and_cleans_up() -> None:
    events = _events()
    state = JobState(phase="Running", start_time=T0)
    verdict = _End("Failed", "DeadlineExceeded", "too long")
    out = _end(state, verdict, [_pod(**RUNNING)], RunPolicy(clean_pod_policy="All"), T0 + 9, events)
    assert (out.state.phase, out.state.reason, out.state.completion_time) == (
        "Failed",
        "DeadlineExceeded",
        T0 + 9,
    )
    assert out.delete_pods == ("j-learner-0",) and not out.run_learner
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "DeadlineExceeded")]
    assert _cond(out, "Failed")["message"] == "too long"


# --- learner.replicas: the group's pods live and restart together ---


def _peer(attempt: int = 0, rank: int = 1, **kw: object) -> LearnerPod:
    return LearnerPod(name=f"j-learner-{attempt}-{rank}", attempt=attempt, rank=rank, **kw)  # type: ignore[arg-type]


def test_a_deleted_learner_of_a_group_restarts_the_whole_group_as_a_disruption() -> None:
    """`kubectl delete pod j-learner-0-1` while the group trains: a disruption, announced; the
    driver's pod goes too (it checkpoints on SIGTERM) and the next attempt's pods start only
    once both are gone."""
    state = JobState(phase="Running", start_time=T0)
    pods = [_pod(0, **RUNNING), _peer(0, phase="Running", ready=True, deleting=True)]
    out = _run(RunPolicy(backoff_limit=0), state, pods, T0)
    assert (out.state.restarts, out.state.failures, out.state.disruptions) == (1, 0, 1)
    assert out.delete_pods == ("j-learner-0",) and not out.run_learner
    assert "LearnerReplaced" in _reasons(out) and "j-learner-0-1 was deleted" in out.state.message
    # The driver's pod, deleted by the operator, stopping; then both gone: attempt 1 starts.
    stopping = [_pod(0, **RUNNING, deleting=True, retired=True), pods[1]]
    again = _run(RunPolicy(backoff_limit=0), out.state, stopping, T0 + 5)
    assert again.state.disruptions == 1 and not again.run_learner and not again.delete_pods
    gone = _run(RunPolicy(backoff_limit=0), again.state, [], T0 + 30)
    assert gone.run_learner and gone.state.restarts == 1


def test_a_learner_of_a_group_that_fails_on_its_own_is_a_failure() -> None:
    state = JobState(phase="Running", start_time=T0)
    pods = [_pod(0, **RUNNING), _peer(0, phase="Failed", exit_code=137, reason="OOMKilled")]
    out = _run(RunPolicy(backoff_limit=2), state, pods, T0)
    assert (out.state.restarts, out.state.failures, out.state.disruptions) == (1, 1, 0)
    assert out.delete_pods == ("j-learner-0",) and "LearnerFailed" in _reasons(out)
    assert "OOMKilled" in out.state.message
    assert _run(RunPolicy(backoff_limit=0), state, pods, T0).state.phase == "Failed"


def test_a_driver_that_failed_because_a_peer_was_taken_was_disrupted() -> None:
    """The group's all-reduce breaks when a peer is evicted or deleted, and the driver exits 1
    before the operator sees the peer go: the attempt was still the cluster's doing."""
    state = JobState(phase="Running", start_time=T0)
    failed = _pod(0, phase="Failed", exit_code=1)
    evicted = _peer(0, phase="Failed", exit_code=143, disruption="DisruptionTarget: Evict")
    out = _run(RunPolicy(backoff_limit=0), state, [failed, evicted], T0)
    assert (out.state.restarts, out.state.failures, out.state.disruptions) == (1, 0, 1)
    assert "j-learner-0-1" in out.state.message and "LearnerDisrupted" in _reasons(out)
    # Alone, the same exit is the learner's own failure.
    alone = _run(RunPolicy(backoff_limit=0), state, [failed, _peer(0, **RUNNING)], T0)
    assert alone.state.phase == "Failed"
    assert alone.delete_pods == ("j-learner-0-1",)  # the job's end takes the group's others


def test_the_rest_of_a_finished_attempts_group_is_deleted_before_the_next_starts() -> None:
    state = JobState(phase="Pending", restarts=1, disruptions=1, start_time=T0)
    pods = [_pod(0, phase="Failed", exit_code=130), _peer(0, **RUNNING), _peer(1, phase="Pending")]
    out = _run(RunPolicy(), state, pods, T0)
    assert out.delete_pods == ("j-learner-0-1",) and not out.run_learner
    assert out.state.restarts == 1  # nothing counted twice


def test_a_group_is_running_only_once_every_learner_is_and_says_which_it_waits_for() -> None:
    """More learners than the cluster can place: the job stays Starting, naming the pod and the
    scheduler's reason, and startupDeadlineSeconds fails it with that reason: no silent hang."""
    policy = RunPolicy(startup_deadline_seconds=300)
    state = JobState(phase="Pending", start_time=T0)
    why = "0/1 nodes are available: 1 Insufficient cpu."
    pods = [_pod(0, **RUNNING), _peer(0, phase="Pending", unschedulable=why)]
    out = _run(policy, state, pods, T0 + 10)
    assert out.state.phase == "Starting" and out.run_learner and not out.delete_pods
    wanted = f"waiting for learner pods: learner pod j-learner-0-1 cannot be scheduled: {why}"
    assert out.state.message == wanted
    failed = _run(policy, out.state, pods, T0 + 300)
    assert (failed.state.phase, failed.state.reason) == ("Failed", "StartupDeadlineExceeded")
    assert f"j-learner-0-1 cannot be scheduled: {why}" in failed.state.message
    placed = [pods[0], _peer(0, **RUNNING)]
    assert _run(policy, out.state, placed, T0 + 20).state.phase == "Running"
