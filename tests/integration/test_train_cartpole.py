"""`impalajob train` end to end on an embedded Ray: solving CartPole, resume, failures, A3C mode.

The CLI runs as a subprocess exactly as a user runs it; the actor-kill test drives the same
Driver in-process so it can reach the rollout actors' handles.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from harness.net import free_port
from tests.support.jobs import job_manifest

EXAMPLE = "manifests/examples/cartpole.yaml"
TIMEOUT = 900  # generous: the machines these run on are shared and noisy


def _train(
    *args: str, timeout: int = TIMEOUT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "train", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _history(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_invalid_manifest_exits_2_naming_the_field_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(job_manifest("bad", training={"lr": -1, "rolloutFragmentLenght": 10}))
    )
    res = _train("-f", str(bad), "--run-dir", str(tmp_path / "run"), timeout=120)
    assert res.returncode == 2, res.stderr
    assert "spec.training.lr" in res.stderr and "got -1" in res.stderr
    assert "did you mean 'rolloutFragmentLength'" in res.stderr
    assert not (tmp_path / "run").exists(), "nothing may start for an invalid manifest"
    res = _train("-f", EXAMPLE, "--set", "stop.timesteps=0", "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2 and "spec.stop.timesteps" in res.stderr
    res = _train("-f", EXAMPLE, "--set", "env.id=NoSuchEnv-v0", "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2 and "spec.env.id" in res.stderr and "NoSuchEnv" in res.stderr
    assert not (tmp_path / "r").exists()


def test_learner_gpus_the_machine_lacks_exit_2_naming_the_field(tmp_path: Path) -> None:
    """32 learner GPUs on any machine of this suite: refused once Ray has counted the GPUs,
    before an actor or learner starts (else a learner waits for one until the rendezvous
    times out, or the first CUDA call fails)."""
    res = _train(
        "-f", EXAMPLE, "--run-dir", str(tmp_path / "run"),
        "--set", "learner.gpus=16", "--set", "learner.replicas=2", timeout=300,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "learner.gpus 16 x learner.replicas 2 asks for 32 GPUs" in res.stderr
    assert "--set learner.gpus=" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.parametrize("process", ["driver", "separate"])
def test_cli_solves_cartpole_and_writes_the_run_directory(tmp_path: Path, process: str) -> None:
    run = tmp_path / "run"
    # The embedded Ray is always our own: a cluster named by RAY_ADDRESS (or by the address file
    # a stopped `ray start` leaves in Ray's temp dir) is not joined, dead or alive.
    stale = {"RAY_ADDRESS": f"127.0.0.1:{free_port()}"}
    where = f"learner.process={process}"  # separate: the learner thread in a process of its own
    res = _train("-f", EXAMPLE, "--run-dir", str(run), "--set", where, env=stale)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "episodeReturnMean reached" in res.stdout

    summary = _json(run / "summary.json")
    assert summary["stopped_by"] == "episodeReturnMean" and summary["phase"] == "Succeeded"
    assert summary["episode_return_mean"] >= 450
    status = _json(run / "status.json")
    assert status["phase"] == "Succeeded" and status["stop"]["stopped_by"] == "episodeReturnMean"
    c = status["counters"]
    assert c["num_env_steps_sampled"] == summary["timesteps"] > 0
    assert c["learner_updates"] == c["policy_version"] > 0
    assert c["num_weight_broadcasts"] > 0 and c["episodes"] >= 100
    assert status["membership"]["rollout_nodes"] == 1
    assert {m["actor_id"] for m in status["membership"]["members"]} == {"rollout-0", "rollout-1"}
    history = _history(run)
    steps = [p["env_steps"] for p in history]
    assert len(history) >= 3 and steps == sorted(steps)
    assert "CartPole-v1" in (run / "config.yaml").read_text()
    ckpts = sorted((run / "checkpoints").glob("ckpt-*"))
    assert ckpts and (ckpts[-1] / "learner.pt").is_file()
    state = _json(ckpts[-1] / "state.json")
    assert state["counters"]["num_env_steps_sampled"] == summary["timesteps"]


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.parametrize("process", ["driver", "separate"])
def test_resume_continues_counters_exactly(tmp_path: Path, process: str) -> None:
    # separate: the checkpoint's learner state comes out of the learner process and goes into a
    # new one; the counters and optimiser steps go on all the same.
    run = tmp_path / "run"
    common = ["-f", EXAMPLE, "--run-dir", str(run), "--set", "stop.episodeReturnMean=null",
              "--set", f"learner.process={process}"]  # fmt: skip
    first = _train(*common, "--set", "stop.timesteps=20000")
    assert first.returncode == 0, first.stderr
    s1 = _json(run / "summary.json")
    c1 = _json(run / "status.json")["counters"]
    assert s1["stopped_by"] == "timesteps" and s1["timesteps"] >= 20000
    lines_before = len(_history(run))

    again = _train(*common, "--set", "stop.timesteps=40000")
    assert again.returncode == 2 and "--resume" in again.stderr  # never silently overwritten

    second = _train(*common, "--set", "stop.timesteps=40000", "--resume")
    assert second.returncode == 0, second.stderr
    resumed = _history(run)[lines_before:]
    # The resumed run's first point is the checkpoint's counters, before any new sampling.
    assert resumed[0]["env_steps"] == s1["timesteps"]
    assert resumed[0]["learner_updates"] == c1["learner_updates"]
    assert resumed[0]["episodes"] == c1["episodes"]
    c2 = _json(run / "status.json")["counters"]
    assert c2["num_env_steps_sampled"] >= 40000
    assert c2["learner_updates"] > c1["learner_updates"]
    assert c2["policy_version"] == c2["learner_updates"], "optimiser steps continue, not restart"
    assert c2["episodes"] > c1["episodes"]
    s2 = _json(run / "summary.json")
    assert s2["wall_seconds"] > s1["wall_seconds"]


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.parametrize("process", ["driver", "separate"])
def test_learner_starvation_fails_with_a_clear_reason(tmp_path: Path, process: str) -> None:
    run = tmp_path / "run"
    res = _train(
        "-f", EXAMPLE, "--run-dir", str(run), "--set", f"learner.process={process}",
        # A batch of a million steps never fills in time: the learner waits past its timeout.
        "--set", "training.trainBatchSize=1000000", "--set", "training.learnerQueueTimeout=3",
    )
    assert res.returncode == 1
    assert "learner starved" in res.stderr and "learnerQueueTimeout" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    summary = _json(run / "summary.json")
    assert summary["phase"] == "Failed" and summary["stopped_by"] is None
    assert "learner starved" in summary["message"]


@pytest.mark.slow
@pytest.mark.train
def test_async_gradients_mode_improves_the_return(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = _train(
        "-f", EXAMPLE, "--run-dir", str(run),
        # A3C has no learner thread to put in a process of its own (the example's `separate`).
        "--set", "training.mode=async-gradients", "--set", "learner.process=driver",
        "--set", "training.rolloutFragmentLength=16",
        "--set", "stop.episodeReturnMean=150", "--set", "stop.timeLimitSeconds=600",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = _json(run / "summary.json")
    assert summary["stopped_by"] == "episodeReturnMean"
    # A freshly initialised policy is near-uniform, and a uniform policy's CartPole return is ~22;
    # reaching 150 is the improvement. (How far the first snapshot already got depends on the
    # machine's speed, so it is not compared.)
    assert summary["episode_return_mean"] >= 150
    c = _json(run / "status.json")["counters"]
    # A3C trains each sample exactly once, as gradients from the worker that sampled it.
    assert c["num_env_steps_trained"] == c["num_env_steps_sampled"]
    assert c["learner_updates"] == c["policy_version"] > 0


@pytest.mark.slow
@pytest.mark.train
def test_aggregator_actor_with_mixin_replay_learns(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = _train(
        "-f", EXAMPLE, "--run-dir", str(run), "--num-aggregator-workers", "1",
        "--set", "training.replayBatchesPerFresh=0.5", "--set", "training.replayBufferBatches=8",
        "--set", "stop.episodeReturnMean=150", "--set", "stop.timeLimitSeconds=600",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    status = _json(run / "status.json")
    c = status["counters"]
    assert status["stop"]["stopped_by"] == "episodeReturnMean"
    assert c["replayed_batches"] > 0
    # Replays are trained on too.
    assert c["num_env_steps_trained"] > c["num_env_steps_sampled"] * 1.2
    aggregators = [m for m in status["membership"]["members"] if m["role"] == "aggregator"]
    assert len(aggregators) == 1 and aggregators[0]["env_steps"] > 0


@pytest.mark.slow
@pytest.mark.train
def test_dashboard_serves_the_run_while_it_trains(tmp_path: Path) -> None:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-m", "impala_cli.main", "train", "-f", EXAMPLE,
        "--run-dir", str(tmp_path / "run"), "--dashboard", "--status-port", str(port),
        "--set", "stop.episodeReturnMean=null", "--set", "stop.timesteps=150000",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[str, Any] | None = None
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline and seen is None:
        try:
            reply = httpx.get(f"http://127.0.0.1:{port}/status", timeout=2)
            if reply.status_code == 200 and reply.json()["counters"]["num_env_steps_sampled"] > 0:
                seen = reply.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, out + err
    assert seen is not None, "the dashboard never served a training snapshot"
    assert seen["job"] == "cartpole" and seen["phase"] == "Running"
    with pytest.raises(httpx.HTTPError):  # the server stops with the run
        httpx.get(f"http://127.0.0.1:{port}/status", timeout=2)


@pytest.fixture
def local_ray() -> Any:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray

    ray.init(
        address="local", num_cpus=2, resources={"rollout": 2, "aggregator": 0},
        include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
    )
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.train
def test_killed_rollout_actor_is_replaced_and_training_continues(
    tmp_path: Path, local_ray: Any
) -> None:
    from impala_api.manifest import load_manifest
    from impala_api.snapshot import StatusSnapshot
    from impala_trainer.driver.launch import Wiring, build_driver
    from impala_trainer.driver.ray_backend import RayBackend
    from impala_trainer.rundir.writer import RunDir

    job = load_manifest(EXAMPLE, ["stop.episodeReturnMean=null", "stop.timesteps=100000000"])
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    killed: dict[str, Any] = {}

    def on_report(snap: StatusSnapshot) -> None:
        steps = snap.counters.num_env_steps_sampled
        if not killed and steps >= 10000:
            victim = driver.manager.actors["rollout-0"]
            killed.update(steps=steps, updates=snap.counters.learner_updates)
            local_ray.kill(victim.handle)
        replacement = driver.manager.actors.get("rollout-2")
        if replacement is not None and replacement.env_steps >= 10000:
            # The replacement works: end the run 10k steps from now, by the timesteps criterion.
            driver.stats.stop.timesteps = min(driver.stats.stop.timesteps or 0, steps + 10000)

    wiring = Wiring(rollout_workers=2, on_report=on_report)
    driver = build_driver(job, run_dir, RayBackend(), wiring)
    result = driver.run()
    assert result.phase == "Succeeded" and result.stopped_by == "timesteps", result.message
    c = driver.stats.counters
    assert killed, "the run ended before the kill"
    assert c.worker_restarts >= 1
    assert c.num_env_steps_sampled > killed["steps"] + 20000
    assert c.learner_updates > killed["updates"]
    status = _json(run_dir.status_file)
    assert status["counters"]["worker_restarts"] >= 1
    members = {m["actor_id"]: m for m in status["membership"]["members"]}
    assert members["rollout-0"]["state"] == "dead"
    # The replacement got weights and sampled after the kill: it contributed steps.
    assert members["rollout-2"]["state"] == "healthy" and members["rollout-2"]["env_steps"] > 0


@pytest.mark.slow
@pytest.mark.train
def test_sigterm_stops_the_run_with_a_checkpoint_and_exit_130(tmp_path: Path) -> None:
    """`kill PID` (what a supervisor sends) ends a local run as Ctrl-C does: final checkpoint,
    summary "Stopped", exit 130, and the way to continue it."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "impala_cli.main", "train", "-f", EXAMPLE, "--run-dir",
         str(run), "--set", "stop.episodeReturnMean=null", "--set", "stop.timeLimitSeconds=600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    try:
        _until_it_learns(proc, run)
        proc.terminate()
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "error" not in stderr
    summary = _json(run / "summary.json")
    assert summary["phase"] == "Stopped"
    assert list((run / "checkpoints").iterdir()), "the run stopped without its final checkpoint"


def _until_it_learns(proc: subprocess.Popen[str], run: Path, seconds: float = 180) -> None:
    """Until the run's first learner update; else the test fails with where the run hung."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        status = run / "status.json"
        if status.exists() and _json(status)["counters"]["learner_updates"] > 0:
            return
        time.sleep(0.5)
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)  # the CLI dumps its threads' stacks to stderr
        time.sleep(2)
    proc.kill()
    out, err = proc.communicate(timeout=30)
    log = run / "trainer.log"
    tail = log.read_text()[-3000:] if log.exists() else "(no trainer.log)"
    pytest.fail(f"no learner update in {seconds:g} s\n{out[-2000:]}\n{err[-6000:]}\n{tail}")


@pytest.mark.slow
@pytest.mark.train
def test_sigterm_while_ray_starts_stops_the_run_and_leaves_no_ray_process(tmp_path: Path) -> None:
    """`ray.init` puts its own SIGTERM handler in place (exit 15 at once, the processes it has
    started left running): a signal then still stops the run as a stop, exit 130, and nothing
    of that Ray stays behind."""
    run = tmp_path / "run"
    began = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "impala_cli.main", "train", "-f", EXAMPLE, "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            children = psutil.Process(proc.pid).children(recursive=True)
            if any("gcs_server" in c.name() for c in children):
                break
            time.sleep(0.05)
        proc.terminate()
        _, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "stopped" in stderr and "Traceback" not in stderr, stderr
    # The suite runs one test at a time: a Ray process started since this one began is its own.
    ours = [p for p in psutil.process_iter() if _since(p, began) and _is_ray(p)]
    _, alive = psutil.wait_procs(ours, timeout=10)
    assert not alive, f"left running: {[p.name() for p in alive]}"


def _since(p: psutil.Process, t: float) -> bool:
    try:
        return p.create_time() >= t
    except psutil.Error:
        return False


def _is_ray(p: psutil.Process) -> bool:
    try:
        return "ray" in " ".join(p.cmdline()).lower()
    except psutil.Error:
        return False


def _interruptible() -> None:
    # A command a non-interactive shell starts in the background (as CI may run the suite)
    # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: a terminal's
    # process, which these tests stand for, has it at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_training(run: Path, *sets: str) -> subprocess.Popen[str]:
    """`impalajob train` of the example in a session of its own, until its first update."""
    args = [a for s in sets for a in ("--set", s)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "impala_cli.main", "train", "-f", EXAMPLE, "--run-dir", str(run),
         "--set", "stop.episodeReturnMean=null", "--set", "stop.timeLimitSeconds=600", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_interruptible, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = run / "status.json"
        if status.exists() and _json(status)["counters"]["learner_updates"] > 0:
            return proc
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("no learner update within 180 s")


@pytest.mark.slow
@pytest.mark.train
def test_ctrl_c_stops_a_run_with_a_learner_process_with_its_checkpoint(tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the whole process group, the learner process included: the
    run still ends as a stopped run with the learner's final state in a checkpoint."""
    run = tmp_path / "run"
    proc = _start_training(run, "learner.process=separate")
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert _json(run / "summary.json")["phase"] == "Stopped"
    ckpts = sorted((run / "checkpoints").glob("ckpt-*"))
    assert ckpts, "the run stopped without its final checkpoint"
    final = _json(ckpts[-1] / "state.json")["counters"]
    assert final["learner_updates"] == _json(run / "status.json")["counters"]["learner_updates"]


@pytest.mark.slow
@pytest.mark.train
def test_a_dead_learner_process_fails_the_run_and_keeps_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    proc = _start_training(run, "learner.process=separate", "checkpoint.intervalSeconds=1")
    try:
        deadline = time.monotonic() + 60
        while not list((run / "checkpoints").glob("ckpt-*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        learners = [c for c in psutil.Process(proc.pid).children(recursive=True)
                    if c.name() == "impala-learner"]  # fmt: skip
        assert len(learners) == 1
        learners[0].kill()  # the OOM killer's way
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    reason = "the learner process was killed by SIGKILL (out of memory?)"
    assert reason in stderr
    summary = _json(run / "summary.json")
    assert summary["phase"] == "Failed" and summary["message"] == reason
    assert list((run / "checkpoints").glob("ckpt-*")), "the checkpoints written before stay"
