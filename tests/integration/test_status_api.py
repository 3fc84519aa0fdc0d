"""Every sidecar endpoint through a real uvicorn on a free port (`serve_in_thread`).

Each router's behaviour is tested in process in tests/unit/trainer/test_sidecar_routers.py (the
422s on bad query parameters and the configured `job` label only there).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.sample_run import sample_history, sample_snapshot, write_sample_run
from impala_api.snapshot import (
    HISTORY_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    PolicyStatus,
    StatusSnapshot,
    Summary,
    append_history,
    write_json_atomic,
)
from impala_trainer.sidecar.settings import Settings
from tests.support.sidecar import serve_in_thread

Serve = Callable[..., httpx.Client]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def serve(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    """Start a sidecar on run_dir with the given settings; returns an httpx client for it."""
    for key in list(os.environ):
        if key.startswith("IMPALA_STATUS_"):
            monkeypatch.delenv(key)
    stops: list[Callable[[], None]] = []
    clients: list[httpx.Client] = []

    def start(**settings: object) -> httpx.Client:
        url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=Settings(**settings))
        stops.append(stop)
        clients.append(httpx.Client(base_url=url, timeout=10))
        return clients[-1]

    yield start
    for c in clients:
        c.close()
    for stop in stops:
        stop()


def test_healthz_needs_nothing_but_readyz_needs_a_snapshot(serve: Serve) -> None:
    client = serve()
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["error"] == "missing"
    assert "does not exist" in r.json()["detail"]


def test_status_serves_the_snapshot_and_summary(serve: Serve, run_dir: Path) -> None:
    snap, _ = write_sample_run(run_dir, points=20)
    client = serve()
    r = client.get("/status")
    assert r.status_code == 200
    body = r.json()
    assert StatusSnapshot.model_validate(body) == snap
    assert 0 <= body["age_seconds"] < 60
    assert body["summary"] is None
    assert body["counters"]["num_env_steps_sampled"] == 10_000
    assert len(body["membership"]["members"]) == 6

    summary = Summary(job="cartpole", timesteps=10_000, wall_seconds=14.0, stopped_by="timesteps")
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    assert Summary.model_validate(client.get("/status").json()["summary"]) == summary

    # A new snapshot is served at once (the body cache follows the file).
    write_json_atomic(run_dir / STATUS_FILE, snap.model_copy(update={"phase": "Succeeded"}))
    assert client.get("/status").json()["phase"] == "Succeeded"


def test_readyz_is_stale_only_while_running(serve: Serve, run_dir: Path) -> None:
    old = time.time() - 600
    write_json_atomic(run_dir / STATUS_FILE, sample_snapshot("j", None, updated_at=old))
    client = serve(ready_max_age_seconds=60)
    r = client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["error"] == "stale"
    # 600 s when written; a second or more later on a loaded machine when read.
    assert re.search(r"snapshot is 6\d\d s old \(limit 60 s\)", r.json()["detail"]), r.json()

    done = sample_snapshot("j", None, phase="Succeeded", updated_at=old)
    write_json_atomic(run_dir / STATUS_FILE, done)
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["phase"] == "Succeeded" and r.json()["age_seconds"] >= 600

    write_json_atomic(run_dir / STATUS_FILE, sample_snapshot("j", None))
    assert client.get("/readyz").json()["ready"] is True


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (None, "missing"),
        (b"", "partial"),
        (b'{"job": "cartpole", "phase": "Runn', "partial"),
        (b"\x00\x01garbage", "corrupt"),
        (b'["a", "list"]', "invalid"),
        (b'{"job": "cartpole", "counters": {"episodes": "lots"}}', "invalid"),
    ],
)
def test_bad_snapshot_gives_503_then_recovers(
    serve: Serve, run_dir: Path, content: bytes | None, kind: str
) -> None:
    run_dir.mkdir(parents=True)
    if content is not None:
        (run_dir / STATUS_FILE).write_bytes(content)
    client = serve()
    for path in ("/status", "/readyz", "/metrics"):
        r = client.get(path)
        assert r.status_code == 503, path
        assert r.headers["content-type"] == "application/json"
        assert r.headers["retry-after"] == "5"
        body = r.json()
        assert body["error"] == kind and body["file"] == STATUS_FILE
        assert body["detail"]
    assert client.get("/healthz").status_code == 200  # still serving

    write_sample_run(run_dir, points=3)
    assert client.get("/status").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200


def test_corrupt_summary_is_503_not_ignored(serve: Serve, run_dir: Path) -> None:
    write_sample_run(run_dir, points=3)
    (run_dir / SUMMARY_FILE).write_text("{]")
    client = serve()
    r = client.get("/status")
    assert r.status_code == 503 and r.json()["file"] == SUMMARY_FILE


def test_history_since_and_limit(serve: Serve, run_dir: Path) -> None:
    _, history = write_sample_run(run_dir, points=200)
    client = serve()
    full = client.get("/history").json()
    assert [p["env_steps"] for p in full["points"]] == [p.env_steps for p in history]
    assert full["job"] == "cartpole" and full["held"] == 200 and full["lines_read"] == 200

    since = history[149].env_steps
    tail = client.get("/history", params={"since": since}).json()
    assert [p["env_steps"] for p in tail["points"]] == [p.env_steps for p in history[150:]]
    assert tail["matched"] == 50

    few = client.get("/history", params={"limit": 10}).json()
    assert len(few["points"]) == 10 and few["matched"] == 200
    assert few["points"][0]["env_steps"] == history[0].env_steps
    assert few["points"][-1]["env_steps"] == history[-1].env_steps

    both = client.get("/history", params={"since": since, "limit": 5}).json()
    assert len(both["points"]) == 5 and both["points"][0]["env_steps"] > since


def test_history_is_bounded_however_long_the_run(serve: Serve, run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    history = sample_history(3000, start_time=0.0)
    for p in history:
        append_history(run_dir / HISTORY_FILE, p)
    client = serve(history_max_points=64)
    body = client.get("/history", params={"limit": 1000}).json()
    assert body["lines_read"] == 3000
    assert body["held"] <= 64 and len(body["points"]) == body["held"]
    steps = [p["env_steps"] for p in body["points"]]
    assert steps[0] == history[0].env_steps  # still starts at the beginning of the run
    assert steps[-32:] == [p.env_steps for p in history[-32:]]  # recent points all there


def test_history_follows_appends_and_skips_bad_lines(serve: Serve, run_dir: Path) -> None:
    _, history = write_sample_run(run_dir, points=5)
    client = serve()
    assert client.get("/history").json()["held"] == 5
    more = sample_history(8, start_time=0.0)[5:]
    with (run_dir / HISTORY_FILE).open("a") as f:
        f.write("{not a point}\n")
    for p in more:
        append_history(run_dir / HISTORY_FILE, p)
    with (run_dir / HISTORY_FILE).open("a") as f:
        f.write('{"time": 1.0, "wall_')  # the writer is mid-line
    body = client.get("/history").json()
    assert [p["env_steps"] for p in body["points"]] == [p.env_steps for p in history + more]
    assert body["skipped_lines"] == 1 and body["lines_read"] == 9


def test_history_missing_is_503(serve: Serve, run_dir: Path) -> None:
    write_json_atomic(run_dir / STATUS_FILE, sample_snapshot("j", None))
    r = serve().get("/history")
    assert r.status_code == 503
    assert r.json() == {
        "error": "missing",
        "detail": f"{HISTORY_FILE} does not exist yet in {run_dir}",
        "file": HISTORY_FILE,
    }


def test_metrics_parse_with_job_label(serve: Serve, run_dir: Path) -> None:
    snap, _ = write_sample_run(run_dir, points=30)
    client = serve()
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families and all(name.startswith("impala_") for name in families)
    for fam in families.values():
        for sample in fam.samples:
            assert sample.labels["job"] == "cartpole", sample

    def value(name: str, **labels: str) -> float:
        for fam in families.values():
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        raise AssertionError(f"no sample {name} {labels}")

    assert families["impala_env_steps_sampled"].type == "counter"
    assert value("impala_env_steps_sampled_total") == snap.counters.num_env_steps_sampled
    assert value("impala_episodes_total") == snap.counters.episodes
    assert value("impala_episode_return_mean") == snap.episode_return_mean
    assert value("impala_phase", phase="Running") == 1.0
    assert value("impala_phase", phase="Failed") == 0.0
    vf_loss = snap.learner["default/vf_loss"]
    assert value("impala_policy_learner_stat", policy="default", stat="vf_loss") == vf_loss
    assert value("impala_timing_seconds", section="learner_grad") == pytest.approx(0.0115)
    assert value("impala_members", role="rollout", state="healthy") == 4
    assert value("impala_learner_queue_fill") == snap.learner_queue.fill
    assert value("impala_rollout_busy_fraction") == snap.throughput.rollout_busy_fraction == 0.42
    assert value("impala_snapshot_timestamp_seconds") == pytest.approx(snap.updated_at)

    newer = snap.model_copy(
        update={
            "phase": "Failed",
            "counters": snap.counters.model_copy(update={"num_env_steps_sampled": 123_456}),
        }
    )
    write_json_atomic(run_dir / STATUS_FILE, newer)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert value("impala_env_steps_sampled_total") == 123_456
    assert value("impala_phase", phase="Failed") == 1.0


def test_a_multi_agent_run_has_metrics_per_policy(serve: Serve, run_dir: Path) -> None:
    snap, _ = write_sample_run(run_dir, points=3)
    ma = snap.model_copy(
        update={
            "learner": {"main/entropy": 0.5, "prey/entropy": 1.5},
            "policies": {
                "main": PolicyStatus(episode_return_mean=0.25, episodes=40, self_play_score=0.7),
                "prey": PolicyStatus(episode_return_mean=-3.0, episodes=12),
            },
        }
    )
    write_json_atomic(run_dir / STATUS_FILE, ma)
    text = serve().get("/metrics").text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def value(name: str, **labels: str) -> float:
        found = [s.value for s in samples if s.name == name and s.labels.items() >= labels.items()]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    assert value("impala_policy_episode_return_mean", policy="main", job="cartpole") == 0.25
    assert value("impala_policy_episodes_total", policy="prey") == 12
    assert value("impala_policy_self_play_score", policy="main") == 0.7
    assert not [s for s in samples if s.name == "impala_policy_self_play_score"
                and s.labels["policy"] == "prey"]  # fmt: skip
    assert value("impala_policy_learner_stat", policy="prey", stat="entropy") == 1.5
    assert not [s for s in samples if s.name == "impala_learner_stat"]


def test_dashboard_and_assets(serve: Serve, run_dir: Path) -> None:
    write_sample_run(run_dir, points=3)
    client = serve()
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="static/dashboard.js"' in page.text and "plot-return" in page.text
    assert "http" not in page.text.replace("http://www.w3.org", "")  # nothing from the internet
    js = client.get("/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "fetch(" in js.text
    assert client.get("/static/dashboard.css").headers["content-type"].startswith("text/css")
    for bad in ("/static/nope.js", "/static/..%2Fserver.py", "/static/index.html"):
        r = client.get(bad)
        assert r.status_code == 404 and r.json()["error"] == "not_found", bad


def test_evaluation_videos_are_served_by_name_with_ranges(serve: Serve, run_dir: Path) -> None:
    write_sample_run(run_dir, points=3)
    (run_dir / "videos").mkdir()
    data = bytes(range(256)) * 40
    (run_dir / "videos" / "eval-000000012000.mp4").write_bytes(data)
    (run_dir / "secret.mp4").write_bytes(b"not a video of the run")
    client = serve()
    r = client.get("/videos/eval-000000012000.mp4")
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "video/mp4"
    part = client.get("/videos/eval-000000012000.mp4", headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]  # a browser seeks
    for bad in ("/videos/eval-000000099999.mp4", "/videos/..%2Fsecret.mp4", "/videos/x.mp4"):
        r = client.get(bad)
        assert r.status_code == 404 and r.json()["error"] == "not_found", bad


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_api_is_read_only(serve: Serve, run_dir: Path, method: str) -> None:
    write_sample_run(run_dir, points=3)
    client = serve()
    for path in ("/status", "/history", "/metrics", "/"):
        r = client.request(method, path)
        assert r.status_code == 405, path
        assert r.headers["allow"] == "GET"
        assert r.json()["error"] == "method_not_allowed"
    assert client.get("/status").status_code == 200


def test_openapi_documents_every_endpoint(serve: Serve) -> None:
    spec = serve().get("/openapi.json").json()
    paths = spec["paths"]
    assert set(paths) == {
        "/healthz", "/readyz", "/status", "/history", "/metrics", "/videos/{name}", "/"
    }
    assert set(paths["/status"]) == {"get"}
    schemas = spec["components"]["schemas"]
    for model in (
        "StatusResponse",
        "HistoryResponse",
        "HealthResponse",
        "ReadyResponse",
        "ErrorResponse",
        "HistoryPoint",
        "Summary",
    ):
        assert model in schemas, model

    def ref(path: str, code: str) -> str:
        return paths[path]["get"]["responses"][code]["content"]["application/json"]["schema"][
            "$ref"
        ]

    assert ref("/status", "200").endswith("/StatusResponse")
    assert ref("/history", "200").endswith("/HistoryResponse")
    assert ref("/status", "503").endswith("/ErrorResponse")
    assert ref("/history", "422").endswith("/ErrorResponse")
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert "security" not in paths["/status"]["get"]  # no token configured


def test_cors_is_off_unless_configured(serve: Serve, run_dir: Path) -> None:
    write_sample_run(run_dir, points=3)
    origin = {"Origin": "http://dashboards.example"}
    r = serve().get("/status", headers=origin)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers

    allowed = serve(cors_origins=["http://dashboards.example"])
    r = allowed.get("/status", headers=origin)
    assert r.headers["access-control-allow-origin"] == "http://dashboards.example"
    pre = allowed.options("/status", headers={**origin, "Access-Control-Request-Method": "GET"})
    assert pre.status_code == 200
    bad = allowed.options(
        "/status", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}
    )
    assert "access-control-allow-origin" not in bad.headers
