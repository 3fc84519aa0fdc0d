"""Headless Chromium loads the dashboard from a run directory with real history.

The page draws each history point as an SVG <circle class="pt" data-x data-y>; the test reads
the rendered DOM back and checks the plots hold exactly the points written to history.jsonl.
A screenshot is saved under pytest's tmp dir as an artefact (its path is printed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.sample_run import write_sample_run
from impala_api.snapshot import STATUS_FILE, ReturnTrend, write_json_atomic
from impala_trainer.sidecar.settings import Settings
from tests.support.sidecar import serve_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--virtual-time-budget=5000",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed (tests/setup-system.sh installs it)")


class _Plots(HTMLParser):
    """Collects the data points of every <svg id=...> plot and the key-number cards."""

    def __init__(self) -> None:
        super().__init__()
        self.points: dict[str, list[tuple[float, float]]] = {}
        self.cards: dict[str, str] = {}
        self._svg: str | None = None
        self._card_field: str | None = None
        self._label = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and a.get("id"):
            self._svg = a["id"]
            self.points.setdefault(self._svg, [])
        elif tag == "circle" and self._svg and a.get("class") == "pt":
            self.points[self._svg].append(
                (float(a["data-x"] or "nan"), float(a["data-y"] or "nan"))
            )
        elif tag == "div" and a.get("class") in ("label", "value"):
            self._card_field = a["class"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._svg = None
        if tag == "div":
            self._card_field = None

    def handle_data(self, data: str) -> None:
        if self._card_field == "label":
            self._label = data
        elif self._card_field == "value":
            self.cards[self._label] = data


@pytest.fixture
def dashboard_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list]]:
    for key in list(os.environ):
        if key.startswith("IMPALA_STATUS_"):
            monkeypatch.delenv(key)
    run_dir = tmp_path / "run"
    snap, history = write_sample_run(run_dir, job="cartpole-browser", points=60)
    url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=Settings())
    yield url, [snap, history]
    stop()


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_dashboard_plots_hold_the_history(dashboard_url: tuple[str, list], tmp_path: Path) -> None:
    url, (snap, history) = dashboard_url
    proc = _run_chromium(tmp_path, "--dump-dom", f"{url}/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = _Plots()
    page.feed(proc.stdout)

    with_return = [p for p in history if p.episode_return_mean is not None]
    assert len(with_return) == len(history) - 1  # the first point has no episodes yet
    assert page.points["plot-return"] == [(p.env_steps, p.episode_return_mean) for p in with_return]
    assert page.points["plot-throughput"] == [(p.wall_seconds, p.env_steps_per_s) for p in history]

    assert page.cards["Env steps sampled"] == f"{snap.counters.num_env_steps_sampled:,}"
    assert page.cards["Mean return (100 ep)"] == f"{snap.episode_return_mean:.2f}"
    assert page.cards["Rollouts / aggregators"] == "4 / 2"
    assert "cartpole-browser" in proc.stdout
    assert 'id="error" class="error" hidden' in proc.stdout  # no error banner


def test_dashboard_screenshot(dashboard_url: tuple[str, list], tmp_path: Path) -> None:
    url, _ = dashboard_url
    shot = tmp_path / "dashboard.png"
    proc = _run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", f"{url}/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"dashboard screenshot: {shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn page, not blank


def test_dashboard_explains_a_missing_snapshot(tmp_path: Path) -> None:
    url, stop = serve_in_thread(tmp_path / "empty", "127.0.0.1", 0, settings=Settings())
    try:
        proc = _run_chromium(tmp_path, "--dump-dom", f"{url}/")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "status → 503 missing: run directory" in proc.stdout
    assert 'id="error" class="error" hidden' not in proc.stdout


def test_dashboard_shows_the_evaluation_curve_and_plays_its_video(tmp_path: Path) -> None:
    """spec.evaluation's output on the page: the evaluation return curve (one point per round)
    and the latest round's video, an H.264 mp4 Chromium decodes; a screenshot as artefact."""
    gym = pytest.importorskip("gymnasium")
    from impala_api.snapshot import STATUS_FILE, EvaluationInfo, append_history, write_json_atomic
    from impala_trainer.policy.video import write_video

    run_dir = tmp_path / "run"
    snap, history = write_sample_run(run_dir, job="cartpole-evaluated", points=30)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=0)
    frames = [env.render()]
    for _ in range(40):
        _, _, terminated, _, _ = env.step(env.action_space.sample())
        if terminated:
            env.reset()
        frames.append(env.render())
    video = write_video(frames, run_dir / "videos" / f"eval-{12_000:012d}", fps=50)
    rounds = {4_000: 41.5, 8_000: 150.25, 12_000: 480.5}
    for steps, ret in rounds.items():
        point = history[-1].model_copy(
            update={"evaluation_env_steps": steps, "evaluation_return_mean": ret}
        )
        append_history(run_dir / "history.jsonl", point)
    snap.evaluation = EvaluationInfo(
        evaluations=3, num_env_steps_sampled=12_000, episodes=10, episode_return_mean=480.5,
        video=f"videos/{video.name}", best_return_mean=480.5, best_num_env_steps_sampled=12_000,
        best_checkpoint="checkpoints/best",
    )  # fmt: skip
    write_json_atomic(run_dir / STATUS_FILE, snap)
    url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=Settings())
    try:
        proc = _run_chromium(tmp_path, "--dump-dom", "--autoplay-policy=no-user-gesture-required",
                             f"{url}/")  # fmt: skip
        shot = tmp_path / "dashboard-evaluation.png"
        shooter = _run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1400",
                                f"{url}/")  # fmt: skip
    finally:
        stop()
    assert proc.returncode == 0 and shooter.returncode == 0, proc.stderr[-3000:]
    page = _Plots()
    page.feed(proc.stdout)
    assert page.points["plot-evaluation"] == [(float(k), v) for k, v in rounds.items()]
    assert page.cards["Evaluation return"] == "480.50"
    assert f'src="videos/{video.name}"' in proc.stdout
    assert 'data-decoded="600x400"' in proc.stdout  # CartPole's frames, decoded by Chromium
    print(f"dashboard screenshot with the evaluation: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dashboard_warns_when_the_return_has_regressed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    snap, _ = write_sample_run(run_dir, job="cartpole-regressed", points=10)
    message = "the training return 12.5 has given back 90% of what it gained"
    trend = ReturnTrend(first_return_mean=10.0, best_return_mean=400.0, best_env_steps=5_000,
                        below_since_env_steps=6_000, below_since_episodes=50, regressed=True,
                        message=message)  # fmt: skip
    write_json_atomic(run_dir / STATUS_FILE, snap.model_copy(update={"return_trend": trend}))
    url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=Settings())
    try:
        proc = _run_chromium(tmp_path, "--dump-dom", f"{url}/")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Return regressed: {message}" in proc.stdout
    assert 'id="regressed" class="warning" hidden' not in proc.stdout
    page = _Plots()
    page.feed(proc.stdout)
    assert page.cards["Best mean return"] == "400"


def test_dashboard_shows_each_policy_and_the_evaluation_win_rate(tmp_path: Path) -> None:
    from impala_api.snapshot import EvaluationInfo, PolicyStatus, ReturnTrend

    run_dir = tmp_path / "run"
    snap, _ = write_sample_run(run_dir, job="tictactoe-browser", points=10)
    snap.policies = {
        "main": PolicyStatus(
            episode_return_mean=0.25, episodes=400, self_play_score=0.625, self_play_games=200
        ),
        "fixed": PolicyStatus(episode_return_mean=-0.5, episodes=200),
    }
    snap.evaluation = EvaluationInfo(
        evaluations=2, num_env_steps_sampled=40_000, episodes=200, episode_return_mean=0.82,
        opponent="random", policy="main", wins=170, draws=4, losses=26, win_rate=0.85,
    )  # fmt: skip
    snap.return_trend = ReturnTrend(source="evaluation", first_return_mean=0.4,
                                    best_return_mean=0.82, best_env_steps=40_000)  # fmt: skip
    write_json_atomic(run_dir / STATUS_FILE, snap)
    url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=Settings())
    try:
        proc = _run_chromium(tmp_path, "--dump-dom", f"{url}/")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = _Plots()
    page.feed(proc.stdout)
    assert page.cards["Best evaluation return"] == "0.82"
    assert "Best mean return" not in page.cards
    assert page.cards["Win rate (main vs random)"] == "85%"
    assert page.cards["Policy main: mean return"] == "0.25"
    assert page.cards["Policy main: score vs pool"] == "0.625"
    assert page.cards["Policy fixed: mean return"] == "-0.50"
    assert "Policy fixed: score vs pool" not in page.cards
