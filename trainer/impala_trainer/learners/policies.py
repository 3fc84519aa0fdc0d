"""Every policy's learner state as one: `PolicySetState`, the `LearnerState` a job's
`LearnerGroup` offers (a gymnasium env's job has one policy, `default`), and selfPlay's pool.

RLlib gives each trained policy its own learner; so does this: each trained policy has its own
V-trace loss, optimiser, schedules and stats, and trains on the batches of its own agents
(`TrainBatch.policy_id`). As one state:

- the weights broadcast to the rollouts are every policy's, in `batches.policy_layout`, a
  policy that does not learn included (its initial weights, never changed), and selfPlay's
  snapshots;
- the state a checkpoint keeps is each policy's learner state by name;
- the policy version the driver counts is the sum of the policies' (it moves whenever one
  learns), and the schedules' clock is the run's env steps trained, for every policy alike.
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol

import numpy as np
import torch

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import policy_layout, policy_weights
from impala_trainer.learning.learner import LearnerChange
from impala_trainer.rundir.checkpoint import OLD_LAYOUT, policy_state


class LearnerState(Protocol):
    """What a driver reads and sets on its learner: a `Learner`, or the view of one that runs in
    a learner process of its own (learners.process.LearnerView)."""

    @property
    def policy_version(self) -> int: ...

    global_timestep: int

    def get_weights(self) -> dict[str, np.ndarray]: ...

    def pickled_weights(self) -> bytes: ...

    def weights_nbytes(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def change(self, change: LearnerChange) -> None:
        """Queue a change for the learner's next update (`learning.learner.LearnerChange`)."""
        ...


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
    """Several policies' learner states as one `LearnerState`; `fixed` names the policies that
    do not learn (no learner thread takes a change of theirs: it is applied at once)."""

    def __init__(
        self,
        learners: dict[str, LearnerState],
        pool: SelfPlayPool | None = None,
        fixed: frozenset[str] = frozenset(),
    ) -> None:
        self.learners = learners
        self.pool = pool
        self.fixed = fixed
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

    def change(self, change: LearnerChange) -> None:
        """Every policy's part of `change`: `change.state` is a `state_dict` of this kind (each
        policy's learner state, the self-play pool's snapshots), the training section every
        policy's. The pool takes the snapshots at once, its next one an interval from now."""
        saved = None if change.state is None else change.state.get("policies")
        adopted = change.state is not None
        if adopted and (not isinstance(saved, dict) or set(saved) != set(self.learners)):
            raise ValueError(
                f"the adopted state holds {sorted(saved or {})}, this job's policies are "
                f"{sorted(self.learners)}: members of a population share their policies"
            )
        for name, learner in self.learners.items():
            part = LearnerChange(None if saved is None else saved[name], change.training,
                                 change.at_version)  # fmt: skip
            if name in self.fixed:
                if part.state is not None:
                    learner.load_state_dict(part.state)
            else:
                learner.change(part)
        if self.pool is not None and change.state is not None and "self_play" in change.state:
            self.pool.load_state_dict(change.state["self_play"])
            self.pool.next_at = self._timestep + self.pool.interval


def policy_set_state(weights: dict[str, np.ndarray], global_timestep: int) -> dict[str, Any]:
    """The weights a `PolicySetState` broadcasts as a checkpoint's learner state: each policy's
    alone, as `rundir.checkpoint.policy_state` keeps one (the self-play pool left out)."""
    policies = {
        name: policy_state(arrays, version, global_timestep)
        for name, (arrays, version) in policy_weights(weights).items()
        if "@" not in name  # `<policy>@<slot>`: a snapshot of the pool
    }
    return {"policies": policies}


def self_play_pool(spec: ImpalaJobSpec) -> SelfPlayPool | None:
    """spec.multiAgent.selfPlay's pool, empty; None without selfPlay."""
    play = spec.agents.self_play
    if play is None:
        return None
    return SelfPlayPool(play.policy, play.snapshot_interval_timesteps, play.pool_size)
