"""A run directory's policy: the job it trained (config.yaml), its spaces and network, the
weights of one checkpoint. What `impalajob evaluate` and `impalajob export` start from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from impala_api.manifest import load_manifest
from impala_api.snapshot import CHECKPOINT_DIR, CONFIG_FILE
from impala_api.spec import ImpalaJob
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from impala_trainer.rollouts.envs import EnvSpaces
from impala_trainer.rundir.checkpoint import (
    LEARNER_FILE,
    OLD_LAYOUT,
    STATE_FILE,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)


class PolicyNotFoundError(Exception):
    """The run directory has no job or no checkpoint to load, or its checkpoint does not fit its
    job's network (the message names the file and says which)."""


@dataclass
class LoadedPolicy:
    job: ImpalaJob
    model: ActorCritic
    """In eval mode, float32, on the CPU."""
    actions: ActionDistribution
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    checkpoint: Path
    policy_version: int
    global_timestep: int
    policy: str
    """The run's policy this is (a gymnasium env's run: `default`)."""


def find_checkpoint(run_dir: Path, name: str | None = None) -> Path:
    """The checkpoint directory `name` (ckpt-000012, `best`, or a path) or the newest one."""
    if name is not None:
        path = Path(name) if Path(name).is_dir() else run_dir / CHECKPOINT_DIR / name
        if (path / LEARNER_FILE).is_file() and (path / STATE_FILE).is_file():
            return path
        names = ", ".join(p.name for p in list_checkpoints(run_dir / CHECKPOINT_DIR)) or "none"
        raise PolicyNotFoundError(f"no complete checkpoint {name} in {run_dir} (there are {names})")
    found = latest_checkpoint(run_dir / CHECKPOINT_DIR)
    if found is None:
        raise PolicyNotFoundError(
            f"{run_dir} has no checkpoint yet (checkpoints are written every "
            "checkpoint.frequency iterations and when a run stops)"
        )
    return found


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return " ".join(text.split("\n")[:2])[:300] if text else type(err).__name__


def _one_policy(
    job: ImpalaJob, state: dict[str, Any], policy: str | None, path: Path
) -> tuple[ImpalaJob, dict[str, Any], EnvSpaces]:
    """A run's policy as a single policy's job (its model as spec.model), learner state and
    spaces."""
    from impala_trainer.rollouts.agent_envs import policy_models

    name = policy or job.spec.agents.main_policy
    saved = state.get("policies")
    if not isinstance(saved, dict):
        raise PolicyNotFoundError(OLD_LAYOUT.format(path=path))
    if name not in saved:
        raise PolicyNotFoundError(
            f"{path} holds no policy {name!r}: its policies are {', '.join(saved) or 'none'}"
        )
    model = policy_models(job.spec)[name]
    spaces = EnvSpaces(model.obs_shape, model.obs_dtype, model.actions, None)
    spec = job.spec.policy_spec(name)
    return job.model_copy(update={"spec": spec}), saved[name], spaces


def load_policy(
    run_dir: Path, checkpoint: str | None = None, policy: str | None = None
) -> LoadedPolicy:
    """The policy of `run_dir`'s newest checkpoint (or of `checkpoint`); of a multi-agent run,
    `policy` (default: the self-play policy, else the first that learns)."""
    config = run_dir / CONFIG_FILE
    if not config.is_file():
        raise PolicyNotFoundError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    job = load_manifest(config)
    path = find_checkpoint(run_dir, checkpoint)
    weights = path / LEARNER_FILE
    try:
        state, _ = load_checkpoint(path)
    except Exception as err:  # torch's unpickler and json: truncated, corrupt, not ours
        raise PolicyNotFoundError(f"{weights} cannot be read: {_first_line(err)}") from None
    policy = policy or job.spec.agents.main_policy
    job, state, spaces = _one_policy(job, state, policy, path)
    model = build_model(job.spec.model, spaces.obs_shape, spaces.actions)
    try:
        model.load_state_dict(state["model"])
    except (KeyError, RuntimeError) as err:
        raise PolicyNotFoundError(
            f"{weights} is not a checkpoint of the network {config} describes (spec.model, "
            f"spec.env): {_first_line(err)}"
        ) from None
    model.float().eval()
    return LoadedPolicy(
        job=job,
        model=model,
        actions=spaces.actions,
        obs_shape=tuple(spaces.obs_shape),
        obs_dtype=np.dtype(spaces.obs_dtype),
        checkpoint=path,
        policy_version=int(state.get("policy_version", 0)),
        global_timestep=int(state.get("global_timestep", 0)),
        policy=policy,
    )
