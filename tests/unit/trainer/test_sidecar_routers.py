"""Each sidecar router in process: `TestClient(create_app(settings))`, no server, no sockets.

The same endpoints through a real uvicorn (headers, CORS, the CLI's server) are in
tests/integration/test_status_api.py and test_status_auth.py.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from harness.sample_run import sample_snapshot, write_sample_run
from impala_api.snapshot import (
    HISTORY_FILE,
    STATUS_FILE,
    HistoryPoint,
    StatusSnapshot,
    write_json_atomic,
)
from impala_trainer.sidecar.app import create_app
from impala_trainer.sidecar.deps import get_app_settings
from impala_trainer.sidecar.settings import Settings

Client = Callable[..., TestClient]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def client(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """`client(**settings)`: a TestClient on a fresh app for `run_dir` with those settings."""
    for key in list(os.environ):
        if key.startswith("IMPALA_STATUS_"):
            monkeypatch.delenv(key)  # only the test's settings count
    clients: list[TestClient] = []

    def make(**settings: object) -> TestClient:
        app = create_app(Settings(run_dir=run_dir, **settings))  # type: ignore[arg-type]
        clients.append(TestClient(app))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def _steps(points: list[dict] | list[HistoryPoint]) -> list[int]:
    return [p["env_steps"] if isinstance(p, dict) else p.env_steps for p in points]


# -- /healthz -------------------------------------------------------------------------------------


def test_healthz_is_ok_without_a_run_directory(client: Client, run_dir: Path) -> None:
    assert not run_dir.exists()
    r = client().get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


# -- /status --------------------------------------------------------------------------------------


def test_status_is_the_snapshot_with_its_age(client: Client, run_dir: Path) -> None:
    snap, _ = write_sample_run(run_dir, job="cartpole", points=20)
    r = client().get("/status")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert StatusSnapshot.model_validate(body) == snap
    assert body["job"] == "cartpole" and body["phase"] == "Running"
    assert body["counters"]["num_env_steps_sampled"] == 20 * 500
    assert [m["actor_id"] for m in body["membership"]["members"]] == [
        "rollout-0",
        "rollout-1",
        "rollout-2",
        "rollout-3",
        "aggregator-0",
        "aggregator-1",
    ]
    assert body["summary"] is None  # no summary.json until the run ends
    assert 0.0 <= body["age_seconds"] < 30.0


def test_status_age_counts_from_updated_at_else_the_file_mtime(
    client: Client, run_dir: Path
) -> None:
    write_json_atomic(
        run_dir / STATUS_FILE, sample_snapshot("j", None, updated_at=time.time() - 100)
    )
    app = client()
    age = app.get("/status").json()["age_seconds"]
    assert 100.0 <= age < 130.0

    # A snapshot without its own timestamp is as old as the file.
    write_json_atomic(run_dir / STATUS_FILE, StatusSnapshot(job="j", updated_at=0.0))
    an_hour_ago = time.time() - 3600
    os.utime(run_dir / STATUS_FILE, (an_hour_ago, an_hour_ago))
    age = app.get("/status").json()["age_seconds"]
    assert 3600.0 <= age < 3630.0


def test_status_without_status_json_is_503_naming_the_file(client: Client, run_dir: Path) -> None:
    run_dir.mkdir()
    r = client().get("/status")
    assert r.status_code == 503
    assert r.headers["retry-after"] == "5"
    assert r.json() == {
        "error": "missing",
        "detail": f"{STATUS_FILE} does not exist yet in {run_dir}",
        "file": STATUS_FILE,
    }


# -- /history -------------------------------------------------------------------------------------


def test_history_downsamples_to_the_limit_keeping_both_ends(client: Client, run_dir: Path) -> None:
    _, history = write_sample_run(run_dir, points=200)
    app = client(history_default_limit=50)

    body = app.get("/history").json()  # no limit: the configured default
    assert body["job"] == "cartpole"
    assert (body["matched"], body["held"], body["lines_read"], body["skipped_lines"]) == (
        200,
        200,
        200,
        0,
    )
    assert len(body["points"]) == 50

    body = app.get("/history", params={"limit": 10}).json()
    # Evenly spread over the 200 points: indices 0, 22, 44, ..., 199.
    assert _steps(body["points"]) == _steps([history[round(i * 199 / 9)] for i in range(10)])
    assert body["points"][0]["env_steps"] == 500 and body["points"][-1]["env_steps"] == 100_000

    body = app.get("/history", params={"limit": 500}).json()  # more than there is: all of it
    assert _steps(body["points"]) == _steps(history)


def test_history_since_counts_what_matched_before_downsampling(
    client: Client, run_dir: Path
) -> None:
    _, history = write_sample_run(run_dir, points=200)
    since = history[149].env_steps
    body = client().get("/history", params={"since": since, "limit": 5}).json()
    assert body["matched"] == 50 and body["held"] == 200
    assert _steps(body["points"]) == _steps([history[150 + round(i * 49 / 4)] for i in range(5)])
    assert all(p["env_steps"] > since for p in body["points"])


def test_history_is_served_while_status_json_is_missing(client: Client, run_dir: Path) -> None:
    write_sample_run(run_dir, points=3)
    (run_dir / STATUS_FILE).unlink()
    r = client().get("/history")
    assert r.status_code == 200
    assert r.json()["job"] is None and _steps(r.json()["points"]) == [500, 1000, 1500]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "100001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"since": "-1"}, "since"),
        ({"since": "1.5"}, "since"),
    ],
)
def test_history_bad_query_parameter_is_422_naming_it(
    client: Client, run_dir: Path, params: dict[str, str], field: str
) -> None:
    write_sample_run(run_dir, points=3)
    r = client().get("/history", params=params)
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid_request"
    assert body["detail"].startswith(f"query.{field}: "), body["detail"]


def test_history_without_history_jsonl_is_503(client: Client, run_dir: Path) -> None:
    write_json_atomic(run_dir / STATUS_FILE, sample_snapshot("j", None))
    r = client().get("/history")
    assert r.status_code == 503
    assert r.json()["error"] == "missing" and r.json()["file"] == HISTORY_FILE


# -- /metrics -------------------------------------------------------------------------------------


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_prometheus_text_labelled_with_the_job(client: Client, run_dir: Path) -> None:
    snap, _ = write_sample_run(run_dir, job="cartpole", points=30)
    r = client().get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    samples = _samples(r.text)
    assert {dict(labels)["job"] for _, labels in samples} == {"cartpole"}
    job = ("job", "cartpole")
    assert samples["impala_env_steps_sampled_total", frozenset({job})] == 15_000
    assert samples["impala_learner_queue_full_total", frozenset({job})] == 3
    assert samples["impala_episode_return_mean", frozenset({job})] == snap.episode_return_mean
    assert samples["impala_phase", frozenset({job, ("phase", "Running")})] == 1.0
    assert samples["impala_phase", frozenset({job, ("phase", "Failed")})] == 0.0


def test_metrics_job_label_comes_from_settings_when_set(client: Client, run_dir: Path) -> None:
    write_sample_run(run_dir, job="cartpole", points=3)
    text = client(job_name="prod-pong").get("/metrics").text
    assert {dict(labels)["job"] for _, labels in _samples(text)} == {"prod-pong"}


def test_metrics_without_a_snapshot_is_503_not_an_empty_scrape(
    client: Client, run_dir: Path
) -> None:
    run_dir.mkdir()
    r = client().get("/metrics")
    assert r.status_code == 503
    assert r.json()["error"] == "missing" and r.json()["file"] == STATUS_FILE


# -- /readyz --------------------------------------------------------------------------------------


def test_readyz_fresh_snapshot_is_ready(client: Client, run_dir: Path) -> None:
    write_json_atomic(run_dir / STATUS_FILE, sample_snapshot("j", None, phase="Running"))
    r = client(ready_max_age_seconds=60).get("/readyz")
    assert r.status_code == 200
    body = r.json()
    assert (body["ready"], body["phase"], body["max_age_seconds"]) == (True, "Running", 60.0)
    assert 0.0 <= body["age_seconds"] < 30.0


def test_readyz_stale_is_relative_to_the_configured_age(client: Client, run_dir: Path) -> None:
    old = sample_snapshot("j", None, phase="Running", updated_at=time.time() - 600)
    write_json_atomic(run_dir / STATUS_FILE, old)
    app = client(ready_max_age_seconds=60)
    r = app.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["error"] == "stale" and body["file"] == STATUS_FILE
    said = re.search(r"the Running run's snapshot is (\d+) s old \(limit 60 s\)", body["detail"])
    assert said and 600 <= int(said[1]) < 630, body["detail"]

    # The same snapshot under a looser bound: only the settings the route sees change.
    app.app.dependency_overrides[get_app_settings] = lambda: Settings(
        run_dir=run_dir, ready_max_age_seconds=3600
    )
    r = app.get("/readyz")
    assert r.status_code == 200
    assert r.json()["max_age_seconds"] == 3600.0 and 600.0 <= r.json()["age_seconds"] < 630.0


def test_readyz_finished_run_stays_ready_however_old(client: Client, run_dir: Path) -> None:
    done = sample_snapshot("j", None, phase="Succeeded", updated_at=time.time() - 86_400)
    write_json_atomic(run_dir / STATUS_FILE, done)
    r = client(ready_max_age_seconds=60).get("/readyz")
    assert r.status_code == 200
    assert r.json()["phase"] == "Succeeded" and r.json()["age_seconds"] >= 86_400


# -- the bearer token -----------------------------------------------------------------------------

GUARDED = ("/status", "/history", "/metrics", "/")


def test_the_probes_answer_without_the_token(client: Client, run_dir: Path) -> None:
    # The kubelet's probes carry no token (it would have to be written into the pod spec).
    write_sample_run(run_dir, points=3)
    app = client(token="s3cret", ready_max_age_seconds=1e9)
    assert app.get("/healthz").status_code == 200
    assert app.get("/readyz").status_code == 200


@pytest.mark.parametrize("path", GUARDED)
def test_a_configured_token_guards_every_route_but_the_probes(
    client: Client, run_dir: Path, path: str
) -> None:
    write_sample_run(run_dir, points=3)
    app = client(token="s3cret")

    r = app.get(path)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="impala-status"'
    assert r.json()["error"] == "unauthorized"

    r = app.get(path, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="impala-status", error="invalid_token"'
    assert r.json() == {"error": "invalid_token", "detail": "the bearer token is not valid"}

    assert app.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert app.get("/healthz").status_code == 200  # kubelet probes carry no token


def test_without_a_token_every_route_is_open(client: Client, run_dir: Path) -> None:
    write_sample_run(run_dir, points=3)
    app = client()
    assert {path: app.get(path).status_code for path in GUARDED} == dict.fromkeys(GUARDED, 200)
