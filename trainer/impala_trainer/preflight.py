"""What every command checks before it starts a job, beyond the manifest's own validation: that
the environment can be made here and the model fits its spaces.

The API server cannot know these (it imports neither gymnasium nor the user's code), so
`impalajob validate`, `train` and the learner pod run them and refuse with exit 2, naming the
field. Light on purpose: torch is imported only for a custom model, which must be built and run
once to be checked (`impalajob validate` of a built-in model stays torch-free).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from impala_api.spec import ImpalaJobSpec
from impala_trainer.rollouts.envs import env_problem, make_vector_env


def job_problem(spec: ImpalaJobSpec) -> tuple[str, str] | None:
    """Why `spec` cannot run here, as (the field under spec, the reason); None when it can."""
    problem = env_problem(spec.env)
    if problem is not None:
        field, why = problem
        return f"env.{field}", why
    model = spec.model
    if model.type not in ("cnn", "resnet", "custom") and not model.free_log_std:
        return None  # the MLP takes any observation the env checks accepted
    obs_space, action_space = _spaces(spec)
    if model.free_log_std and not isinstance(action_space, gym.spaces.Box):
        return "model.freeLogStd", f"freeLogStd needs a Box action space, not {action_space}"
    shape = tuple(obs_space.shape or ())
    if model.type in ("cnn", "resnet") and len(shape) != 3:
        return (
            "model.type",
            f"type {model.type} needs [C, H, W] image observations; {spec.env.id} observes "
            f"{shape}: use mlp (or auto)",
        )
    if model.type == "custom":
        from impala_trainer.learning.distributions import action_distribution
        from impala_trainer.learning.model_factory import model_problem

        dist = action_distribution(action_space)
        return model_problem(
            model, shape, obs_space.dtype, dist, spec.training.separate_vf_optimizer
        )
    return None


def _spaces(spec: ImpalaJobSpec) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The observation and action space one worker's env has (after wrappers and flattening)."""
    vec = make_vector_env(spec.env, 1, seed=0)
    try:
        return vec.single_observation_space, vec.single_action_space
    finally:
        vec.close()
