"""A run directory as training leaves it, made in a second without training."""

from __future__ import annotations

from pathlib import Path

import torch

from impala_api.spec import DEFAULT_POLICY, ImpalaJob
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.rollouts.envs import env_spaces
from impala_trainer.rundir.checkpoint import DriverState, save_checkpoint
from impala_trainer.rundir.writer import RunDir


def checkpointed_run_dir(path: Path, job: ImpalaJob, seed: int = 0) -> Path:
    """config.yaml and one checkpoint of a policy whose weights are spread out (a fresh policy
    head's near-equal logits would make greedy actions ties that float rounding decides)."""
    RunDir(path).prepare(job)
    spaces = env_spaces(job.spec.env)
    torch.manual_seed(seed)
    learner = Learner(LearnerConfig.of(job.spec), spaces.obs_shape, spaces.actions)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    state = {"policies": {DEFAULT_POLICY: learner.state_dict()}}  # the checkpoint layout
    save_checkpoint(path / "checkpoints", state, DriverState(), keep=1)
    return path
