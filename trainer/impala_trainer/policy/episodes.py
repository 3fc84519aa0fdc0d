"""Whole episodes of a gymnasium env's policy on envs of their own seeds, nothing fed back:
`impalajob evaluate`'s `evaluate`, and spec.evaluation's rounds of them (`round_of_episodes`);
the round's result (`EvaluationResult`), which a PettingZoo env's games (`games`) fill too.

Episodes are shared out before they start (env i plays its quota, then idles), so short episodes
do not crowd out long ones: taking whichever N episodes finish first over parallel envs would
bias the mean towards the short ones. Returns are the env's own rewards (unclipped), as training
reports them. With a video directory, env 0's episodes are recorded from `render()`.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from impala_api.spec import EnvSpec, ImpalaJobSpec
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.models import ActorCritic
from impala_trainer.policy.player import Player
from impala_trainer.policy.video import headless_rendering, preview_gif, write_video
from impala_trainer.rollouts.envs import make_vector_env

MAX_VIDEO_FRAMES = 5_000
"""Frames kept per recorded episode (a Pong game is ~4,000 agent steps at frame skip 4)."""


@dataclass
class EvaluationResult:
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    videos: list[Path] = field(default_factory=list)
    env_steps: int = 0
    preview: tuple[bytes, int, int] | None = None
    """The first recorded episode as a small GIF (bytes, height, width), for TensorBoard."""
    policy_returns: dict[str, list[float]] = field(default_factory=dict)
    """A PettingZoo env's: each policy's returns, one per agent and episode."""
    scored: str | None = None
    """Games scored for this policy against spec.evaluation.opponent (wins, draws, losses);
    `returns` are then the policy's own."""
    wins: int = 0
    draws: int = 0
    losses: int = 0

    def summary(self) -> dict[str, Any]:
        """RLlib's evaluation metric names (None where no episode ended)."""
        r = self.returns
        games = self.wins + self.draws + self.losses
        return {
            "episodes": len(r),
            "episode_return_mean": statistics.fmean(r) if r else None,
            "episode_return_std": statistics.pstdev(r) if r else None,
            "episode_return_median": statistics.median(r) if r else None,
            "episode_return_min": min(r) if r else None,
            "episode_return_max": max(r) if r else None,
            "episode_len_mean": statistics.fmean(self.lengths) if r else None,
            "env_steps": self.env_steps,
            "policy_return_means": {
                name: statistics.fmean(v) for name, v in self.policy_returns.items() if v
            },
            "wins": self.wins,
            "draws": self.draws,
            "losses": self.losses,
            "win_rate": self.wins / games if self.scored and games else None,
        }


def _quotas(episodes: int, num_envs: int) -> np.ndarray:
    return np.array([episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)])


def evaluate(
    env: EnvSpec,
    model: ActorCritic,
    actions: ActionDistribution,
    episodes: int | None,
    *,
    explore: bool = False,
    seed: int = 0,
    num_envs: int = 8,
    video_dir: Path | None = None,
    video_episodes: int = 1,
    max_steps: int | None = None,
) -> EvaluationResult:
    """Play `episodes` episodes (greedy unless `explore`) and return their returns and lengths.

    `max_steps` bounds the env steps (spec.evaluation's timesteps unit, or a policy that never
    ends an episode); episodes still running then are not counted. `episodes` None: as many as
    end within `max_steps`.
    """
    if episodes is None:
        if max_steps is None:
            raise ValueError("give episodes or max_steps")
        episodes = num_envs * max_steps  # more than can end: max_steps decides
    if episodes < 1:
        raise ValueError("episodes must be at least 1")
    if video_dir is not None:
        headless_rendering()
    n = max(1, min(num_envs, episodes, max_steps or episodes))
    quotas = _quotas(episodes, n)
    vec = make_vector_env(env, n, seed, render=video_dir is not None)
    player = Player(model, actions, n, explore, seed, env.clips_rewards)
    result = EvaluationResult()
    frames: list[np.ndarray] = []
    fps = _video_fps(vec, env) if video_dir is not None else 0.0
    done_count = np.zeros(n, np.int64)
    ep_return = np.zeros(n, np.float64)
    ep_length = np.zeros(n, np.int64)
    obs, _ = vec.reset(seed=seed)
    try:
        while (done_count < quotas).any():
            if max_steps is not None and result.env_steps >= max_steps:
                break
            recording = video_dir is not None and done_count[0] < video_episodes
            if recording and len(frames) < MAX_VIDEO_FRAMES:
                frames.append(vec.envs[0].render())
            act = player.act(obs)
            obs, reward, term, trunc, _ = vec.step(actions.to_env(act))
            reward = np.asarray(reward, np.float64)
            active = done_count < quotas
            result.env_steps += int(active.sum())
            ep_return += reward
            ep_length += 1
            done = np.asarray(term | trunc)
            player.observe(act, reward.astype(np.float32), done)
            for i in np.flatnonzero(done):
                if done_count[i] < quotas[i]:
                    result.returns.append(float(ep_return[i]))
                    result.lengths.append(int(ep_length[i]))
                    if i == 0 and video_dir is not None and frames:
                        name = f"episode-{done_count[0]:03d}"
                        result.videos.append(write_video(frames, video_dir / name, fps))
                        if result.preview is None:
                            result.preview = preview_gif(frames, fps=fps)
                        frames = []
                    done_count[i] += 1
                ep_return[i] = 0.0
                ep_length[i] = 0
        if video_dir is not None and frames and not result.videos:
            # The budget (max_steps) ended the first episode: its frames so far are the video.
            result.videos.append(write_video(frames, video_dir / "episode-000-partial", fps))
            result.preview = preview_gif(frames, fps=fps)
    finally:
        vec.close()
    return result


def _video_fps(vec: Any, env: EnvSpec) -> float:
    """The env's own frame rate, divided by the frames an agent step skips."""
    fps = float(vec.envs[0].metadata.get("render_fps") or 30)
    return fps / env.frame_skip if env.is_atari else fps


def round_of_episodes(
    spec: ImpalaJobSpec,
    model: ActorCritic,
    actions: ActionDistribution,
    seed: int,
    share: int,
    video: bool,
) -> tuple[EvaluationResult, tuple[str, bytes] | None]:
    """spec.evaluation's round on a gymnasium env: `share` whole episodes (or env steps,
    durationUnit) of `model`, and with `video` its first episode's file (suffix, bytes)."""
    assert spec.evaluation is not None
    evaluation = spec.evaluation
    by_steps = evaluation.duration_unit == "timesteps"
    with tempfile.TemporaryDirectory(prefix="impala-eval-") as tmp:
        result = evaluate(
            spec.env,
            model,
            actions,
            None if by_steps else share,
            explore=evaluation.explore,
            seed=seed,
            num_envs=evaluation.num_envs_per_runner,
            video_dir=Path(tmp) if video else None,
            max_steps=share if by_steps else None,
        )
        first = result.videos[0] if result.videos else None
        data = (first.suffix, first.read_bytes()) if first else None
        result.videos = []
    return result, data
