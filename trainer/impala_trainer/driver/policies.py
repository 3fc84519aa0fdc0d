"""A job's learners: one `LearnerGroup` per trained policy, as one group (a gymnasium env's
job has one policy, `default`).

RLlib gives each trained policy its own learner; so does this: each trained policy has the
learner group its spec asks for (`learner_group.make_learner_groups`, the policy's model in
place of spec.model; learner.replicas actors hold every policy), with its own V-trace loss,
optimiser, schedules and stats, and trains on the batches of its own agents
(`TrainBatch.policy_id`). `PolicyLearnerGroups` is that set as the
driver's one `LearnerGroup`, and `PolicySetState` their weights and state as its one
`LearnerState`:

- the weights broadcast to the rollouts are every policy's, in `batches.policy_layout`, a
  policy that does not learn included (its initial weights, never changed);
- the state a checkpoint keeps is each policy's learner state by name;
- the policy version the driver counts is the sum of the policies' (it moves whenever one
  learns), and the schedules' clock is the run's env steps trained, for every policy alike.
"""

from __future__ import annotations

import pickle
from statistics import fmean
from typing import Any

import numpy as np
import torch

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import TrainBatch, policy_layout, policy_weights
from impala_trainer.driver.backend import Backend
from impala_trainer.driver.learner_group import LearnerGroup, Updates, make_learner_groups
from impala_trainer.learning.learner import Learner, LearnerState
from impala_trainer.learning.learner_worker import LearnerPolicy
from impala_trainer.rollouts.agent_envs import PolicyModel
from impala_trainer.rundir.checkpoint import OLD_LAYOUT, policy_state

NOTHING_TO_TRAIN = (
    "spec.multiAgent.policiesToTrain: no agent of this env acts by a policy that learns"
)


class SelfPlayPool:
    """spec.multiAgent.selfPlay's snapshots: the policy's weights every
    snapshotIntervalTimesteps env steps trained, the newest poolSize of them, broadcast under
    the names `<policy>@<slot>` (`rollouts.agent_sampler` seats them as opponents)."""

    def __init__(self, policy: str, interval: int, size: int) -> None:
        self.policy, self.interval, self.size = policy, interval, size
        self.snapshots: list[dict[str, np.ndarray]] = []
        self.taken = 0
        """Snapshots taken so far (slot = taken % size)."""
        self.next_at = interval

    def observe(self, env_steps_trained: int, learner: LearnerState) -> None:
        if env_steps_trained < self.next_at:
            return
        weights = {k: np.array(v, copy=True) for k, v in learner.get_weights().items()}
        if len(self.snapshots) < self.size:
            self.snapshots.append(weights)
        else:
            self.snapshots[self.taken % self.size] = weights
        self.taken += 1
        self.next_at = env_steps_trained + self.interval

    def weights(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for slot, snapshot in enumerate(self.snapshots):
            out.update(policy_layout(f"{self.policy}@{slot}", snapshot, 0))
        return out

    def state_dict(self) -> dict[str, Any]:
        # Tensors, not arrays: a checkpoint is read back with torch.load(weights_only=True).
        snapshots = [{k: torch.from_numpy(v) for k, v in s.items()} for s in self.snapshots]
        return {"snapshots": snapshots, "taken": self.taken, "next_at": self.next_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.snapshots = [{k: v.numpy() for k, v in s.items()} for s in state["snapshots"]]
        self.taken, self.next_at = int(state["taken"]), int(state["next_at"])


class PolicySetState:
    """Several policies' learner states as one `LearnerState`."""

    def __init__(self, learners: dict[str, LearnerState], pool: SelfPlayPool | None = None) -> None:
        self.learners = learners
        self.pool = pool
        self._timestep = 0

    @property
    def policy_version(self) -> int:
        return sum(learner.policy_version for learner in self.learners.values())

    @property
    def global_timestep(self) -> int:
        return self._timestep

    @global_timestep.setter
    def global_timestep(self, value: int) -> None:
        self._timestep = value
        for learner in self.learners.values():
            learner.global_timestep = value
        if self.pool is not None:
            self.pool.observe(value, self.learners[self.pool.policy])

    def get_weights(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, learner in self.learners.items():
            out.update(policy_layout(name, learner.get_weights(), learner.policy_version))
        if self.pool is not None:
            out.update(self.pool.weights())
        return out

    def pickled_weights(self) -> bytes:
        return pickle.dumps(self.get_weights(), protocol=pickle.HIGHEST_PROTOCOL)

    def weights_nbytes(self) -> int:
        own = sum(learner.weights_nbytes() for learner in self.learners.values())
        if self.pool is None:
            return own
        # The pool rides along with every broadcast: count it full, as it soon is.
        return own + self.pool.size * self.learners[self.pool.policy].weights_nbytes()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "policies": {name: ls.state_dict() for name, ls in self.learners.items()}
        }
        if self.pool is not None:
            state["self_play"] = self.pool.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("policies")
        if not isinstance(saved, dict):
            raise ValueError(OLD_LAYOUT.format(path="the checkpoint"))
        if set(saved) != set(self.learners):
            have = sorted(saved)
            raise ValueError(
                f"the checkpoint holds {have}, this job's policies are {sorted(self.learners)}: "
                "resume it with the policies it was trained with"
            )
        for name, learner in self.learners.items():
            learner.load_state_dict(saved[name])
        if self.pool is not None and "self_play" in state:
            self.pool.load_state_dict(state["self_play"])


def policy_set_state(weights: dict[str, np.ndarray], global_timestep: int) -> dict[str, Any]:
    """The weights a `PolicySetState` broadcasts as a checkpoint's learner state: each policy's
    alone, as `rundir.checkpoint.policy_state` keeps one (the self-play pool left out)."""
    policies = {
        name: policy_state(arrays, version, global_timestep)
        for name, (arrays, version) in policy_weights(weights).items()
        if "@" not in name  # `<policy>@<slot>`: a snapshot of the pool
    }
    return {"policies": policies}


class PolicyLearnerGroups:
    """One learner group per trained policy, fed each its own policy's batches."""

    def __init__(
        self,
        groups: dict[str, LearnerGroup],
        frozen: dict[str, LearnerState],
        pool: SelfPlayPool | None = None,
    ) -> None:
        self.groups = groups
        learners = {**{name: g.learner for name, g in groups.items()}, **frozen}
        self.learner: LearnerState = PolicySetState(learners, pool)
        first = next(iter(groups.values()))
        self.device = first.device
        self.autocast_dtype = first.autocast_dtype

    def start(self) -> None:
        for group in self.groups.values():
            group.start()

    def check(self) -> None:
        for group in self.groups.values():
            group.check()

    def try_put(self, batch: TrainBatch) -> bool:
        return self.groups[batch.policy_id].try_put(batch)

    def put(self, batch: TrainBatch, timeout: float) -> bool:
        return self.groups[batch.policy_id].put(batch, timeout)

    def updates(self) -> Updates:
        out = Updates()
        for name, group in self.groups.items():
            done = group.updates()
            out.env_steps += done.env_steps
            out.steps += done.steps
            out.policy_lags.extend(done.policy_lags)
            out.stats.extend({f"{name}/{k}": v for k, v in s.items()} for s in done.stats)
        return out

    def stats(self) -> dict[str, float]:
        each = {name: group.stats() for name, group in self.groups.items()}
        out = {f"{name}/{k}": v for name, stats in each.items() for k, v in stats.items()}
        # The run's own figure: how idle its learners are, on average.
        out["learner_idle_fraction"] = fmean(
            s.get("learner_idle_fraction", 0.0) for s in each.values()
        )
        return out

    def queue_stats(self) -> dict[str, Any]:
        # The fullest policy's queue: the one that holds the rollouts back.
        each = [group.queue_stats() for group in self.groups.values()]
        return max(each, key=lambda s: float(s.get("size_mean", 0.0)))

    def close(self, timeout: float) -> None:
        for group in self.groups.values():
            group.close(timeout)


def policy_learner_groups(
    spec: ImpalaJobSpec,
    models: dict[str, PolicyModel],
    seed: int,
    backend: Backend,
    intra_op_threads: int,
) -> PolicyLearnerGroups:
    """A learner group for each trained policy, and the fixed weights of the others (built in
    that order, each in the policies' order, so one seed makes the same initial weights)."""
    trained = set(spec.agents.trained)
    learned = {
        name: LearnerPolicy(spec.policy_spec(name), model.obs_shape, model.actions)
        for name, model in models.items()
        if name in trained
    }
    if not learned:
        raise ValueError(NOTHING_TO_TRAIN)
    groups = make_learner_groups(learned, seed, backend, intra_op_threads)
    frozen: dict[str, LearnerState] = {
        name: Learner(spec.policy_spec(name), model.obs_shape, model.actions)
        for name, model in models.items()
        if name not in trained
    }
    return PolicyLearnerGroups(groups, frozen, self_play_pool(spec))


def self_play_pool(spec: ImpalaJobSpec) -> SelfPlayPool | None:
    """spec.multiAgent.selfPlay's pool, empty; None without selfPlay."""
    play = spec.agents.self_play
    if play is None:
        return None
    return SelfPlayPool(play.policy, play.snapshot_interval_timesteps, play.pool_size)
