"""What every command checks before it starts a job, beyond the manifest's own validation: that
the environment can be made here and the model fits its spaces; and the defaults that depend on
the env's action space (`space_defaults`).

The API server cannot know these (it imports neither gymnasium nor the user's code), so
`impalajob validate`, `train` and the learner pod run them and refuse with exit 2, naming the
field. Light on purpose: torch is imported only for a custom model, which must be built and run
once to be checked (`impalajob validate` of a built-in model stays torch-free).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from impala_api.spec import ENTROPY_COEFF, RANDOM_OPPONENT, EnvSpec, ImpalaJobSpec
from impala_trainer.rollouts.envs import env_problem, make_vector_env


def job_problem(spec: ImpalaJobSpec) -> tuple[str, str] | None:
    """Why `spec` cannot run here, as (the field under spec, the reason); None when it can."""
    if spec.env.is_pettingzoo:
        return _agents_problem(spec)
    problem = env_problem(spec.env)
    if problem is not None:
        field, why = problem
        return f"env.{field}", why
    model = spec.model
    if (
        model.type not in ("cnn", "resnet", "custom")
        and not model.free_log_std
        and not model.squash_actions
    ):
        return None  # the MLP takes any observation the env checks accepted
    obs_space, action_space = _spaces(spec)
    if model.free_log_std and not isinstance(action_space, gym.spaces.Box):
        return "model.freeLogStd", f"freeLogStd needs a Box action space, not {action_space}"
    if model.squash_actions and not _bounded(action_space):
        return (
            "model.squashActions",
            f"squashActions needs a Box action space with finite bounds, not "
            f"{action_space}: set it to false (the env gets the sample clipped) or omit it",
        )
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

        dist = action_distribution(action_space, model.squash_actions)
        return model_problem(
            model, shape, obs_space.dtype, dist, spec.training.separate_vf_optimizer
        )
    return None


def _agents_problem(spec: ImpalaJobSpec) -> tuple[str, str] | None:
    """A PettingZoo env's: it cannot be made, an agent maps to no policy (or two agents of one
    policy differ in their spaces), a space is one the trainer cannot take, no agent acts by a
    policy that learns, or a policy's model does not fit its agents."""
    from impala_trainer.rollouts.agent_envs import MappingError
    from impala_trainer.rollouts.envs import UnsupportedSpaceError
    from impala_trainer.user_code import UserCodeError

    try:
        policies = _policy_spaces(spec)
    except UserCodeError as err:
        mapping_fn = err.field == "policyMappingFn"
        return ("multiAgent.policyMappingFn" if mapping_fn else f"env.{err.field}"), str(err)
    except MappingError as err:
        return err.field, str(err)
    except UnsupportedSpaceError as err:
        return "env.pettingzoo", str(err)
    except Exception as err:  # the user's env may raise anything while it is made
        where = "env.kwargs" if spec.env.kwargs else "env.pettingzoo"
        return where, f"making {spec.env.pettingzoo} failed: {type(err).__name__}: {err}"
    if not set(policies) & set(spec.agents.trained):
        return (
            "multiAgent.policiesToTrain",
            f"no agent of {spec.env.pettingzoo} acts by a policy that learns (agents act by "
            f"{', '.join(sorted(policies))})",
        )
    for name, (_agents, spaces) in policies.items():
        model = spec.policy_spec(name).model
        shape = tuple(spaces.model_observation.shape or ())
        where = "model" if spec.agents.policies[name].model is None else (
            f"multiAgent.policies.{name}.model")  # fmt: skip
        if model.type in ("cnn", "resnet") and len(shape) != 3:
            return f"{where}.type", (
                f"type {model.type} needs [C, H, W] image observations; policy {name}'s agents "
                f"observe {shape}: use mlp (or auto)"
            )
        if model.free_log_std and not isinstance(spaces.action, gym.spaces.Box):
            return f"{where}.freeLogStd", (
                f"freeLogStd needs a Box action space, not policy {name}'s {spaces.action}"
            )
        if model.type == "custom":
            from impala_trainer.learning.distributions import action_distribution
            from impala_trainer.learning.model_factory import model_problem

            dist = action_distribution(spaces.action, model.squash_actions)
            problem = model_problem(
                model, shape, spaces.model_observation.dtype, dist,
                spec.training.separate_vf_optimizer,
            )  # fmt: skip
            if problem is not None:
                field, why = problem
                return where + field.removeprefix("model"), f"policy {name}: {why}"
    if spec.stop.policy is not None and spec.stop.policy not in policies:
        return "stop.policy", (
            f"no agent of {spec.env.pettingzoo} acts by policy {spec.stop.policy}, so it has "
            f"no return to stop on: name one some agent acts by ({', '.join(sorted(policies))})"
        )
    return _games_problem(spec, policies) or _video_problem(spec)


def _video_problem(spec: ImpalaJobSpec) -> tuple[str, str] | None:
    """spec.evaluation.video of a PettingZoo env: it must be made with render_mode."""
    if spec.evaluation is None or not spec.evaluation.video:
        return None
    from impala_trainer.rollouts.agent_envs import make_pettingzoo
    from impala_trainer.user_code import UserCodeError

    try:
        make_pettingzoo(spec.env, render=True).close()
    except UserCodeError as err:
        return err.field, str(err)
    return None


def _games_problem(spec: ImpalaJobSpec, policies: dict[str, Any]) -> tuple[str, str] | None:
    """spec.evaluation.opponent's games: the scored policy must have a seat, and an opponent
    policy must fit every other seat (it plays them all)."""
    games = spec.evaluation
    if games is None or games.opponent is None:
        return None
    env, scored = spec.env.pettingzoo, spec.evaluated_policy
    field = "evaluation.policy" if games.policy else "evaluation.opponent"
    if scored not in policies:
        return field, (
            f"no agent of {env} acts by policy {scored}, whose games evaluation.opponent would "
            f"score: name a policy some agent acts by ({', '.join(sorted(policies))})"
        )
    if games.opponent == RANDOM_OPPONENT:
        return None
    if games.opponent not in policies:
        return "evaluation.opponent", (
            f"no agent of {env} acts by policy {games.opponent}: an opponent is 'random' or a "
            f"policy some agent acts by ({', '.join(sorted(policies))})"
        )
    theirs = policies[games.opponent][1]
    for name, (agents, spaces) in policies.items():
        # The opponent takes every seat but the scored one: the scored policy's other agents too.
        takes = agents if name != scored else agents[1:]
        if takes and (spaces.observation, spaces.action) != (theirs.observation, theirs.action):
            return "evaluation.opponent", (
                f"policy {games.opponent} cannot take the seat of {takes[0]} (policy {name}): "
                f"their spaces differ; the opponent plays every agent but the one policy "
                f"{scored} plays"
            )
    return None


def _policy_spaces(spec: ImpalaJobSpec) -> dict[str, Any]:
    """A PettingZoo env's policies and their spaces, from one throwaway env per env spec and
    mapping (job_problem and space_defaults both ask, as `_spaces` for a gymnasium env)."""
    return _agent_spaces(spec.model_dump_json(include={"env", "multi_agent", "stop"}))


@functools.lru_cache(maxsize=8)
def _agent_spaces(spec_json: str) -> dict[str, Any]:
    from impala_trainer.rollouts.agent_envs import policy_spaces

    return policy_spaces(ImpalaJobSpec.model_validate_json(spec_json))


BOX_SURROGATE_CLIP = 0.3
"""training.surrogateClip for Box actions when the manifest omits it (PPO's usual clip)."""
BOX_ENTROPY_COEFF = 0.001
"""training.entropyCoeff for Box actions with PopArt by default (a tenth of IMPALA's 0.01: the
advantages it weighs against are of unit scale: with 0.01 HalfCheetah's actions stayed too
noisy to run, 464 at 1M env steps against 978; docs/benchmarks.md, "MuJoCo beside RLlib")."""


class SpaceDefault(NamedTuple):
    """A field the manifest left out whose value depends on the env's action space."""

    field: str
    """Its path under spec, camelCase."""
    value: Any
    why: str

    def __str__(self) -> str:
        value = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"spec.{self.field}: {value} ({self.why})"


def space_defaults(spec: ImpalaJobSpec) -> tuple[ImpalaJobSpec, list[SpaceDefault]]:
    """`spec` with the fields it omits that depend on the action space set for this env's, and
    what was set and why (for `impalajob validate`, the run's log and config.yaml).

    Box actions: a squashed Gaussian where every bound is finite, and APPO's clipped surrogate.
    A learner a few updates ahead of its actors (the policy lag IMPALA runs with) keeps pushing a
    Gaussian past what the acting policy did, under V-trace's truncated weights, until its actions
    saturate at a bound and the policy walks away from every target (docs/models.md, "Box
    actions"); the clip stops that push. And PopArt with a tenth of the entropy bonus: without
    it, advantages in the return's units outweigh the bonus, and the Gaussian turns
    deterministic before the policy learns (Hopper). Discrete actions keep IMPALA's own policy
    gradient and bonus. Whatever is still omitted then takes its plain default (popart false,
    entropyCoeff 0.01)."""
    chosen_spec, chosen = _space_defaults(spec)
    model, training = chosen_spec.model, chosen_spec.training
    if model.popart is None:
        model = model.model_copy(update={"popart": False})
    if training.entropy_coeff is None:
        training = training.model_copy(update={"entropy_coeff": ENTROPY_COEFF})
    return chosen_spec.model_copy(update={"model": model, "training": training}), chosen


def _space_defaults(spec: ImpalaJobSpec) -> tuple[ImpalaJobSpec, list[SpaceDefault]]:
    if spec.env.is_atari:  # ALE's actions are Discrete: nothing depends on the space
        return spec, []
    if spec.env.is_pettingzoo:
        return _policy_space_defaults(spec)
    space = _spaces(spec)[1]
    if not isinstance(space, gym.spaces.Box):
        return spec, []
    chosen: list[SpaceDefault] = []
    model, training = spec.model, spec.training
    if model.squash_actions is None:
        finite = _bounded(space)
        why = (
            "Box actions with finite bounds: the Gaussian's sample squashed into them"
            if finite
            else "Box actions with an infinite bound: the Gaussian's sample as it is"
        )
        chosen.append(SpaceDefault("model.squashActions", finite, why))
        model = model.model_copy(update={"squash_actions": finite})
    if training.surrogate_clip is None:
        why = "Box actions: APPO's clipped surrogate holds a Gaussian policy under policy lag"
        chosen.append(SpaceDefault("training.surrogateClip", BOX_SURROGATE_CLIP, why))
        training = training.model_copy(update={"surrogate_clip": BOX_SURROGATE_CLIP})
    # PopArt needs a built-in value head and V-trace's targets (job.py refuses it otherwise).
    if model.popart is None and model.type != "custom" and training.mode == "vtrace":
        why = "Box actions: advantages in units of the return's scale, so the entropy bonus holds"
        chosen.append(SpaceDefault("model.popart", True, why))
        model = model.model_copy(update={"popart": True})
        if training.entropy_coeff is None and training.entropy_coeff_schedule is None:
            why = "Box actions with PopArt: the bonus against advantages of unit scale"
            chosen.append(SpaceDefault("training.entropyCoeff", BOX_ENTROPY_COEFF, why))
            training = training.model_copy(update={"entropy_coeff": BOX_ENTROPY_COEFF})
    return spec.model_copy(update={"model": model, "training": training}), chosen


def _policy_space_defaults(spec: ImpalaJobSpec) -> tuple[ImpalaJobSpec, list[SpaceDefault]]:
    """space_defaults for each policy of a PettingZoo env with Box actions: its model's
    squashActions; and the clipped surrogate, a training setting every policy shares, once any
    policy acts in a Box."""
    agents = spec.agents
    policies = dict(agents.policies)
    chosen: list[SpaceDefault] = []
    boxes = False
    for name, (_agents, spaces) in _policy_spaces(spec).items():
        if not isinstance(spaces.action, gym.spaces.Box):
            continue
        boxes = True
        model = spec.policy_spec(name).model
        if model.squash_actions is not None:
            continue
        finite = _bounded(spaces.action)
        why = f"policy {name}'s Box actions " + (
            "have finite bounds: the Gaussian's sample squashed into them"
            if finite else "have an infinite bound: the Gaussian's sample as it is"
        )  # fmt: skip
        chosen.append(SpaceDefault(f"multiAgent.policies.{name}.model.squashActions", finite, why))
        policies[name] = policies[name].model_copy(
            update={"model": model.model_copy(update={"squash_actions": finite})}
        )
    training = spec.training
    if boxes and training.surrogate_clip is None:
        why = "Box actions: APPO's clipped surrogate holds a Gaussian policy under policy lag"
        chosen.append(SpaceDefault("training.surrogateClip", BOX_SURROGATE_CLIP, why))
        training = training.model_copy(update={"surrogate_clip": BOX_SURROGATE_CLIP})
    multi_agent = agents.model_copy(update={"policies": policies})
    return spec.model_copy(update={"multi_agent": multi_agent, "training": training}), chosen


def _bounded(space: gym.Space[Any]) -> bool:
    """A Box whose every bound is finite: what a squashed Gaussian fits (distributions'
    `squashable`, without importing torch: validate of a built-in model stays torch-free)."""
    return (
        isinstance(space, gym.spaces.Box)
        and bool(np.isfinite(space.low).all())
        and bool(np.isfinite(space.high).all())
    )


def _spaces(spec: ImpalaJobSpec) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The observation and action space one worker's env has (after wrappers and flattening),
    from one throwaway env per env spec: job_problem and space_defaults both ask."""
    return _env_spaces(spec.env.model_dump_json())


@functools.lru_cache(maxsize=8)
def _env_spaces(env_json: str) -> tuple[gym.Space[Any], gym.Space[Any]]:
    vec = make_vector_env(EnvSpec.model_validate_json(env_json), 1, seed=0)
    try:
        return vec.single_observation_space, vec.single_action_space
    finally:
        vec.close()
