"""Evaluation: N whole episodes of a policy on envs of their own seeds, nothing fed back.

Episodes are shared out before they start (env i plays its quota, then idles), so short episodes
do not crowd out long ones: taking whichever N episodes finish first over parallel envs would
bias the mean towards the short ones. Returns are the env's own rewards (unclipped), as training
reports them. With a video directory, env 0's episodes are recorded from `render()`.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from impala_api.spec import EnvSpec
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.models import ActorCritic
from impala_trainer.policy.acting import PolicyActor
from impala_trainer.policy.video import write_video
from impala_trainer.rollouts.envs import make_vector_env

MAX_VIDEO_FRAMES = 5_000
"""Frames kept per recorded episode (a Pong game is ~4,000 agent steps at frame skip 4)."""


@dataclass
class EvaluationResult:
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    videos: list[Path] = field(default_factory=list)
    env_steps: int = 0

    def summary(self) -> dict[str, Any]:
        """RLlib's evaluation metric names, under `evaluation/` where they are reported."""
        r = self.returns
        return {
            "episodes": len(r),
            "episode_return_mean": statistics.fmean(r),
            "episode_return_median": statistics.median(r),
            "episode_return_min": min(r),
            "episode_return_max": max(r),
            "episode_len_mean": statistics.fmean(self.lengths),
            "env_steps": self.env_steps,
        }


def _quotas(episodes: int, num_envs: int) -> np.ndarray:
    return np.array([episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)])


def evaluate(
    env: EnvSpec,
    model: ActorCritic,
    actions: ActionDistribution,
    episodes: int,
    *,
    explore: bool = False,
    seed: int = 0,
    num_envs: int = 8,
    video_dir: Path | None = None,
    video_episodes: int = 1,
    max_steps: int | None = None,
) -> EvaluationResult:
    """Play `episodes` episodes (greedy unless `explore`) and return their returns and lengths.

    `max_steps` bounds the env steps (a policy that never ends an episode in an env without a
    time limit); episodes still running then are not counted.
    """
    if episodes < 1:
        raise ValueError("episodes must be at least 1")
    if video_dir is not None:
        # pygame (the classic-control renderer) opens a display and an audio device on init;
        # a pod or CI machine has neither, and SDL's and ALSA's complaints would fill the output.
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    n = max(1, min(num_envs, episodes))
    quotas = _quotas(episodes, n)
    vec = make_vector_env(env, n, seed, render=video_dir is not None)
    actor = PolicyActor(model, actions, n, explore, seed, env.clips_rewards)
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
            act = actor.act(obs)
            obs, reward, term, trunc, _ = vec.step(actions.to_env(act))
            reward = np.asarray(reward, np.float64)
            active = done_count < quotas
            result.env_steps += int(active.sum())
            ep_return += reward
            ep_length += 1
            done = np.asarray(term | trunc)
            actor.observe(act, reward.astype(np.float32), done)
            for i in np.flatnonzero(done):
                if done_count[i] < quotas[i]:
                    result.returns.append(float(ep_return[i]))
                    result.lengths.append(int(ep_length[i]))
                    if i == 0 and video_dir is not None and frames:
                        name = f"episode-{done_count[0]:03d}"
                        result.videos.append(write_video(frames, video_dir / name, fps))
                        frames = []
                    done_count[i] += 1
                ep_return[i] = 0.0
                ep_length[i] = 0
    finally:
        vec.close()
    if not result.returns:
        raise RuntimeError(f"no episode ended within {max_steps} env steps")
    return result


def _video_fps(vec: Any, env: EnvSpec) -> float:
    """The env's own frame rate, divided by the frames an agent step skips."""
    fps = float(vec.envs[0].metadata.get("render_fps") or 30)
    return fps / env.frame_skip if env.is_atari else fps
