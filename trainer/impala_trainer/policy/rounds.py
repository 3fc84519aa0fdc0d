"""The evaluation actor's work, for every env: spec.evaluation's rounds.

`Evaluator` holds every policy of the job and loads each request's weights (the broadcast
layout, `batches.policy_weights`) one way for all of them; a round is whole episodes of a
gymnasium env (`episodes.round_of_episodes`) or whole games of a PettingZoo env
(`games.round_of_games`), both an `episodes.EvaluationResult`. Above both, so that neither
imports the other.
"""

from __future__ import annotations

import numpy as np
import torch

from impala_api.spec import DEFAULT_POLICY, ImpalaJobSpec
from impala_trainer.batches import policy_weights
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from impala_trainer.policy.episodes import EvaluationResult, round_of_episodes
from impala_trainer.policy.games import game_policies, round_of_games
from impala_trainer.rollouts.envs import env_spaces


class Evaluator:
    """One evaluation actor's rounds (`policy.actor.EvaluationActor` runs it in its own
    process; the local backend calls it directly): the job's policies, loaded with the weights
    of each request, played on env seeds that are the same every round, so rounds differ only
    by the policies."""

    def __init__(self, spec: ImpalaJobSpec, seed: int) -> None:
        assert spec.evaluation is not None
        torch.set_num_threads(1)
        self.spec, self.seed = spec, seed
        self.games = game_policies(spec) if spec.env.is_pettingzoo else {}
        """A PettingZoo env's policies as games play them (their models are `models`)."""
        self.models: dict[str, ActorCritic] = {n: p.model for n, p in self.games.items()}
        if not self.games:
            spaces = env_spaces(spec.env, spec.model.squash_actions)
            self.actions = spaces.actions
            model = build_model(spec.model, spaces.obs_shape, spaces.actions).eval()
            self.models[DEFAULT_POLICY] = model

    def run(
        self, weights: dict[str, np.ndarray], share: int, video: bool
    ) -> tuple[EvaluationResult, tuple[str, bytes] | None]:
        """Play `share` episodes or games (or env steps, durationUnit) with `weights`; the
        result and, when asked, its first episode's video (suffix, bytes)."""
        for name, (arrays, version) in policy_weights(weights).items():
            model = self.models.get(name)  # selfPlay's snapshots are not played here
            if model is None:
                continue
            model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
            if name in self.games:
                self.games[name].policy_version = version
        if self.games:
            return round_of_games(self.spec, self.games, self.seed, share, video)
        model = self.models[DEFAULT_POLICY]
        return round_of_episodes(self.spec, model, self.actions, self.seed, share, video)
