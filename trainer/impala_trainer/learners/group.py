"""The learners as the driver sees them: one `LearnerGroup` for every policy of the job,
whatever they are (RLlib's name; a single-agent job's one policy is `default`).

The driver feeds batches (`try_put`, `put`, routed by `TrainBatch.policy_id`), takes what was
learned (`updates`, each stat under `<policy>/<stat>`), reads the weights it broadcasts and the
state it checkpoints (`learner`: every policy's, `learners.policies.PolicySetState`, the fixed
weights of a policy that does not learn and selfPlay's pool included), and never asks what kind
of learners it talks to. `make_learner_group` builds one of two:

- `LocalLearners`: a learner thread per trained policy, each with its own `Learner` (model,
  optimiser, schedules, PopArt), in the driver's process (learner.process driver) or in a
  process of its own (separate, `learners.process`, which offers the same surface).
- `LearnerActors`: learner.replicas learners (`learners.worker`) on the driver's backend
  (Ray actors placed on the `learner` resource, learner 0 on the driver's node), each holding
  every trained policy, each policy's learners training one set of weights in lock step over
  torch.distributed (`learning.collective`). The driver routes each batch to the learner with
  the fewest of that policy's batches outstanding (RLlib routes its aggregator actors' batches
  per learner), so each learner trains a stream of its own and all of them take the same number
  of steps; a long poll per learner brings its updates back, rank 0's with its newest weights.

The separate process is kept because it measurably wins on a small model: the CartPole example
trains 57-60K env steps/s with it, 46-52K with the thread in the driver, and 20-25K with one
learner actor on the driver's node (a batch and a report over Ray per update, where the process
takes the batch's arrays through shared memory).
"""

from __future__ import annotations

import logging
import pickle
import queue
import time
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import Any, Protocol

from impala_api.spec import ImpalaJobSpec
from impala_trainer.backend import Backend, Handle, LearnerMethod, Ref
from impala_trainer.batches import TrainBatch
from impala_trainer.learners.learner_thread import POLICY_LAG, LearnerThread
from impala_trainer.learners.policies import (
    NOTHING_TO_TRAIN,
    LearnerState,
    PolicySetState,
    SelfPlayPool,
    self_play_pool,
)
from impala_trainer.learners.process import LearnerProcess
from impala_trainer.learners.worker import LearnerInfo, LearnerProgress
from impala_trainer.learning.collective import RENDEZVOUS_TIMEOUT_SECONDS, Rendezvous
from impala_trainer.learning.learner import Learner, LearnerChange, LearnerConfig, LearnerPolicy
from impala_trainer.rollouts.agent_envs import PolicyModel

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.1
"""Longest a learner holds the driver's progress poll open while it has no update to report."""
REPLY_TIMEOUT_SECONDS = 300.0
"""Longest a request to a learner (its state for a checkpoint, a state to load) may take."""
CHANGE_LEAD_UPDATES = 20
"""How many updates ahead of learner 0's last report a group's learners take a change: far
more than the updates a report and a call to every learner take, a fraction of a second of
training."""


class LearnerGroupError(RuntimeError):
    """A learner of the group failed, did not join or did not answer."""


@dataclass
class Updates:
    """What the learners did since the driver last asked."""

    env_steps: int = 0
    """Env steps trained, over every learner (a batch counts on its first pass)."""
    steps: int = 0
    """Optimiser steps (every learner of a group takes each one together)."""
    stats: list[dict[str, float]] = field(default_factory=list)
    """The learner stats of each step (learner 0's in a group)."""
    policy_lags: list[float] = field(default_factory=list)
    """Each batch's policy lag at its first pass, over every learner."""

    def add(self, env_steps: int, stats: dict[str, float], counts_step: bool = True) -> None:
        self.env_steps += env_steps
        lag = stats.pop(POLICY_LAG, None)
        if lag is not None:
            self.policy_lags.append(lag)
        if counts_step:
            self.steps += 1
            self.stats.append(stats)


class LearnerGroup(Protocol):
    learner: LearnerState
    """The weights broadcast to the rollouts, the state a checkpoint keeps, the policy version."""
    device: str
    autocast_dtype: Any

    def start(self) -> None: ...

    def check(self) -> None:
        """Raise if a learner failed or stopped."""
        ...

    def try_put(self, batch: TrainBatch) -> bool:
        """Hand a batch to a learner with room for it; False when every queue is full."""
        ...

    def put(self, batch: TrainBatch, timeout: float) -> bool:
        """`try_put`, waiting up to `timeout` for room."""
        ...

    def updates(self) -> Updates: ...

    def stats(self) -> dict[str, float]:
        """Each policy's learner thread timings and idle fraction under `<policy>/<stat>` (learner
        0's of a group), and the mean idle fraction."""
        ...

    def queue_stats(self) -> dict[str, Any]: ...

    def close(self, timeout: float) -> None:
        """Stop learning; the final state stays readable through `learner`."""
        ...


class LocalLearners:
    """Each trained policy's learner thread, in the driver's process or in a process of its
    own (`LearnerProcess`, the same surface)."""

    def __init__(
        self, threads: dict[str, LearnerThread | LearnerProcess], learner: LearnerState
    ) -> None:
        self.threads = threads
        self.learner = learner
        first = next(iter(threads.values())).learner
        self.device, self.autocast_dtype = str(first.device), first.autocast_dtype

    def start(self) -> None:
        for thread in self.threads.values():
            thread.start()

    def check(self) -> None:
        for thread in self.threads.values():
            if thread.error is not None:
                raise thread.error
            if not thread.is_alive():
                raise RuntimeError(thread.stopped_reason())

    def try_put(self, batch: TrainBatch) -> bool:
        try:
            self.threads[batch.policy_id].inqueue.put_nowait(batch)
        except queue.Full:
            return False
        return True

    def put(self, batch: TrainBatch, timeout: float) -> bool:
        try:
            self.threads[batch.policy_id].inqueue.put(batch, timeout=timeout)
        except queue.Full:
            return False
        return True

    def updates(self) -> Updates:
        each = {name: Updates() for name in self.threads}
        for name, thread in self.threads.items():
            while True:
                try:
                    env_steps, stats = thread.outqueue.get_nowait()
                except queue.Empty:
                    break
                each[name].add(env_steps, stats)
        return by_policy(each)

    def stats(self) -> dict[str, float]:
        return policy_stats({name: t.stats() for name, t in self.threads.items()})

    def queue_stats(self) -> dict[str, Any]:
        return fullest([t.learner_queue_size.stats() for t in self.threads.values()])

    def close(self, timeout: float) -> None:
        for thread in self.threads.values():
            thread.stop()
        deadline = time.monotonic() + timeout
        for thread in self.threads.values():
            if thread.is_alive():
                thread.join(timeout=max(0.0, deadline - time.monotonic()))


def by_policy(each: dict[str, Updates]) -> Updates:
    """Every policy's updates as one: the env steps and steps summed, each stat under
    `<policy>/<stat>`."""
    out = Updates()
    for name, done in each.items():
        out.env_steps += done.env_steps
        out.steps += done.steps
        out.policy_lags.extend(done.policy_lags)
        out.stats.extend({f"{name}/{k}": v for k, v in s.items()} for s in done.stats)
    return out


def policy_stats(each: dict[str, dict[str, float]]) -> dict[str, float]:
    """Every policy's learner thread stats under `<policy>/<stat>`, and the run's own figure:
    how idle its learners are, on average."""
    out = {f"{name}/{k}": v for name, stats in each.items() for k, v in stats.items()}
    out["learner_idle_fraction"] = fmean(
        s.get("learner_idle_fraction", 0.0) for s in each.values()
    )
    return out


def fullest(each: list[dict[str, Any]]) -> dict[str, Any]:
    """The fullest policy's queue figures: the queue that holds the rollouts back."""
    return max(each, key=lambda s: float(s.get("size_mean", 0.0)))


class GroupState:
    """`LearnerState` of one policy of a group: learner 0's weights as its last report carried
    them, and its state asked of it (every learner holds the same after each step)."""

    def __init__(self, actors: LearnerActors, policy: str, info: LearnerInfo) -> None:
        self._actors = actors
        self.policy = policy
        self._nbytes = info.weights_nbytes
        self.policy_version = info.policy_version
        self.weights: bytes | None = None
        """Learner 0's newest weights, pickled (`Learner.pickled_weights`)."""
        self.global_timestep = 0
        """Where the learners' schedules start; from then on they keep the clock themselves."""
        self.final: dict[str, Any] | None = None
        """The state taken as the group closed."""

    def weights_nbytes(self) -> int:
        return self._nbytes

    def pickled_weights(self) -> bytes:
        if self.weights is None:  # before learner 0's first report (the first broadcast)
            self.weights = self._actors.ask(0, "weights", self.policy,
                                            timeout=REPLY_TIMEOUT_SECONDS)  # fmt: skip
        return self.weights

    def get_weights(self) -> dict[str, Any]:
        weights: dict[str, Any] = pickle.loads(self.pickled_weights())
        return weights

    def state_dict(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        state: dict[str, Any] = pickle.loads(
            self._actors.ask(0, "state_dict", self.policy, timeout=REPLY_TIMEOUT_SECONDS)
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        versions = self._actors.ask_all("load_state_dict", self.policy, data,
                                        timeout=REPLY_TIMEOUT_SECONDS)  # fmt: skip
        self.policy_version = versions[0]
        self.weights = None

    def change(self, change: LearnerChange) -> None:
        """Every learner takes `change` before the same update: before they start, their first;
        then CHANGE_LEAD_UPDATES after the version learner 0 last reported (the learners step
        in lock step, so each is within a step of it). A learner already past that step would
        take it out of step with the others; that is logged."""
        lead = CHANGE_LEAD_UPDATES if self._actors.started else 0
        due = replace(change, at_version=self.policy_version + lead)
        data = pickle.dumps(due, protocol=pickle.HIGHEST_PROTOCOL)
        versions = self._actors.ask_all("change", self.policy, data,
                                        timeout=REPLY_TIMEOUT_SECONDS)  # fmt: skip
        late = [rank for rank, v in enumerate(versions) if v >= (due.at_version or 0)]
        if late:
            logger.warning("learners %s took policy %s's change late (at their versions %s)",
                           late, self.policy, versions)  # fmt: skip


class LearnerActors:
    """learner.replicas learners on the backend, each holding every trained policy; see the
    module docstring. Started once and closed once, whichever policy's group asks first."""

    def __init__(
        self,
        policies: dict[str, LearnerPolicy],
        seed: int,
        backend: Backend,
        intra_op_threads: int,
        untrained: dict[str, LearnerState],
        pool: SelfPlayPool | None,
    ) -> None:
        config = next(iter(policies.values())).config  # the job's sections, every policy's
        self.backend = backend
        self.world_size = config.learner.replicas
        self.capacity = config.training.learner_queue_size
        """Batches one learner may have outstanding of a policy (queued, not yet begun)."""
        self._learner_args = (policies, seed)
        self._intra_op_threads = intra_op_threads
        self.handles: list[Handle] = [self._start(0)]  # the others once it is placed (`_form`)
        self.outstanding = {name: [0] * self.world_size for name in policies}
        self._polls: dict[Ref, int] = {}
        self._feeds: list[Ref] = []
        self.pending = {name: Updates() for name in policies}
        """Each policy's updates not yet taken (`updates`)."""
        self._stats: dict[str, dict[str, float]] = {}
        self._queue_stats: dict[str, dict[str, Any]] = {}
        self.error: BaseException | None = None
        self._started = self._closed = False
        try:
            infos = self._form()
        except BaseException:
            self._kill()
            raise
        self.states = {name: GroupState(self, name, info) for name, info in infos.items()}
        self.learner: LearnerState = PolicySetState(
            {**self.states, **untrained}, pool, frozenset(untrained)
        )
        first = next(iter(infos.values()))
        self.device, self.autocast_dtype = first.device, first.autocast_dtype
        self._stats = {name: info.stats for name, info in infos.items()}
        self._queue_stats = {name: info.queue_stats for name, info in infos.items()}

    # -- forming the group ------------------------------------------------------------------

    def _form(self) -> dict[str, LearnerInfo]:
        """Rank 0's address, then every learner joins there (blocks until all have).

        The other ranks are started only once rank 0 is placed: rank 0 must sit on the driver's
        node, whose one unit of `learner` a rank started beside it could take first (the peer
        pods not joined yet), and rank 0 would then never be placed."""
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_SECONDS
        refs = [self._call(0, "address")]
        address: Rendezvous = self._wait_for(refs, deadline, forming=True)[0]
        self.handles += [self._start(rank) for rank in range(1, self.world_size)]
        rendezvous = Rendezvous(address.host, address.port, self.world_size)
        refs = [self._call(rank, "join", rendezvous) for rank in range(self.world_size)]
        infos: list[dict[str, LearnerInfo]] = self._wait_for(refs, deadline, forming=True)
        return infos[0]

    def _start(self, rank: int) -> Handle:
        return self.backend.start_learner(*self._learner_args, rank, self._intra_op_threads)

    def _wait_for(self, refs: list[Ref], deadline: float, forming: bool = False) -> list[Any]:
        """The values of `refs` (one call per rank, in rank order, or learner 0's alone)."""
        started = time.monotonic()
        ready, _ = self.backend.wait(refs, len(refs), max(0.0, deadline - started))
        if len(ready) < len(refs):
            missing = [r for r, ref in enumerate(refs) if ref not in ready]
            if forming:
                raise LearnerGroupError(self._not_formed(missing))
            raise LearnerGroupError(f"learner(s) {missing} of spec.learner.replicas did not "
                                    f"answer in {deadline - started:.0f} s")  # fmt: skip
        try:
            return self.backend.get_many(refs)
        except self.backend.failure as exc:
            raise LearnerGroupError(
                f"a learner of spec.learner.replicas failed ({_short(exc)})"
            ) from exc

    def _not_formed(self, missing: list[int]) -> str:
        unplaced = [r for r in missing if not self.backend.placed_on(self.handles[r])]
        why = (
            f"learner(s) {unplaced} found no place (no free unit of the 'learner' resource: "
            "a learner pod not ready?)"
            if unplaced
            else f"learner(s) {missing} did not join"
        )
        return (
            f"spec.learner.replicas {self.world_size}: the learners did not form a group in "
            f"{RENDEZVOUS_TIMEOUT_SECONDS:g} s; {why}"
        )

    def _call(self, rank: int, method: LearnerMethod, *args: Any) -> Ref:
        return self.backend.learner_call(self.handles[rank], method, *args)

    def ask(self, rank: int, method: LearnerMethod, *args: Any, timeout: float) -> Any:
        return self._wait_for([self._call(rank, method, *args)], time.monotonic() + timeout)[0]

    @property
    def started(self) -> bool:
        return self._started

    def ask_all(self, method: LearnerMethod, *args: Any, timeout: float) -> list[Any]:
        refs = [self._call(rank, method, *args) for rank in range(self.world_size)]
        return self._wait_for(refs, time.monotonic() + timeout)

    # -- training -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        clocks = {name: state.global_timestep for name, state in self.states.items()}
        self.ask_all("start", clocks, timeout=REPLY_TIMEOUT_SECONDS)
        for rank in range(self.world_size):
            self._poll(rank)

    def _poll(self, rank: int) -> None:
        self._polls[self._call(rank, "progress", POLL_SECONDS)] = rank

    def check(self) -> None:
        self.pump(0.0)
        if self.error is not None:
            raise self.error

    def try_put(self, batch: TrainBatch) -> bool:
        # `outstanding` as of the last reports read (the loop's `check` and `updates` read them):
        # a learner's queue counts fuller than it is until then, never emptier.
        outstanding = self.outstanding[batch.policy_id]
        rank = min(range(self.world_size), key=lambda r: (outstanding[r], r))
        if outstanding[rank] >= self.capacity:
            return False
        self._feeds.append(self._call(rank, "train", batch))
        outstanding[rank] += 1
        return True

    def put(self, batch: TrainBatch, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.try_put(batch):
            left = deadline - time.monotonic()
            if left <= 0 or self.error is not None:
                return False
            self.pump(left)  # a report frees room
        return True

    def pump(self, timeout: float, again: bool = True) -> None:
        """Take the progress reports that are in (waiting up to `timeout` for one), and poll
        those learners `again`."""
        if self._feeds:
            done, self._feeds = self.backend.wait(self._feeds, len(self._feeds), 0.0)
            for ref in done:
                try:
                    self.backend.get(ref)
                except Exception as exc:  # its learner died, or had no room for a minute
                    failed = LearnerGroupError(f"a learner of spec.learner.replicas failed "
                                               f"({_short(exc)})")  # fmt: skip
                    self.error = self.error or failed
        if not self._polls:
            return
        ready, _ = self.backend.wait(list(self._polls), len(self._polls), timeout)
        for ref in ready:
            rank = self._polls.pop(ref)
            try:
                self._on_progress(self.backend.get(ref))
            except self.backend.failure as exc:
                died = LearnerGroupError(
                    f"learner {rank} of spec.learner.replicas died ({_short(exc)})"
                )
                self.error = self.error or died
                continue
            if again:
                self._poll(rank)

    def _on_progress(self, progress: LearnerProgress) -> None:
        rank = progress.rank
        for name, updates in progress.updates.items():
            for env_steps, stats in updates:
                if env_steps:  # a batch's first pass: it left the learner's queue
                    self.outstanding[name][rank] = max(0, self.outstanding[name][rank] - 1)
                self.pending[name].add(env_steps, stats, counts_step=rank == 0)
        if progress.error is not None and self.error is None:
            self.error = LearnerGroupError(
                f"learner {rank} of spec.learner.replicas stopped ({_short(progress.error)})"
            )
        if rank == 0:
            self._stats, self._queue_stats = progress.stats, progress.queue_stats
            for name, state in self.states.items():
                state.policy_version = progress.policy_version[name]
                if name in progress.weights:
                    state.weights = progress.weights[name]

    def updates(self) -> Updates:
        self.pump(0.0)
        each, self.pending = self.pending, {name: Updates() for name in self.pending}
        return by_policy(each)

    def stats(self) -> dict[str, float]:
        self.pump(0.0)
        return policy_stats(self._stats)

    def queue_stats(self) -> dict[str, Any]:
        return fullest(list(self._queue_stats.values()))

    def close(self, timeout: float) -> None:
        """Stop every learner, keep learner 0's final state of each policy, end the learners'
        processes.

        A learner already lost is skipped: the others stop at their next all-reduce (which
        fails without it), and learner 0's state is still read for the last checkpoint."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            stops = [self._call(rank, "stop") for rank in range(self.world_size)]
            self.backend.wait(stops, len(stops), max(0.0, deadline - time.monotonic()))
            # Every step taken is reported by now: the open polls, then a last one each.
            while self._polls and time.monotonic() < deadline:
                self.pump(POLL_SECONDS, again=False)
            for rank in range(self.world_size):
                try:
                    left = max(POLL_SECONDS, deadline - time.monotonic())
                    self._on_progress(self.ask(rank, "progress", 0.0, timeout=left))
                except LearnerGroupError:  # lost: its steps are learner 0's too
                    continue
            for state in self.states.values():
                state.final = state.state_dict()
        finally:
            self._kill()

    def _kill(self) -> None:
        for handle in self.handles:
            try:
                self.backend.kill(handle)
            except Exception:  # already gone
                continue


def _short(exc: BaseException) -> str:
    """An error in one line: Ray's actor errors run to a dozen lines of advice, and the run's
    failure message is one line (the last: `base.one_line`)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def make_learner_group(
    spec: ImpalaJobSpec,
    models: dict[str, PolicyModel],
    seed: int,
    backend: Backend,
    intra_op_threads: int,
) -> LearnerGroup:
    """The job's learners, as the spec asks: learner.replicas learner actors holding every
    trained policy, else a learner thread per trained policy where learner.process says; the
    fixed weights of the policies that do not learn beside them. Built in that order, each in
    the policies' order, so one seed makes the same initial weights.

    `intra_op_threads`: what the driver's process was given for its learner (node/cpus.py), and
    so what each learner actor takes: on a cluster each learner pod has the same CPU request as
    the driver's; locally `impalajob train` gave the driver its share of the machine."""
    trained = set(spec.agents.trained)
    learned = {
        name: LearnerPolicy(LearnerConfig.of(spec, name), model.obs_shape, model.actions)
        for name, model in models.items()
        if name in trained
    }
    if not learned:
        raise ValueError(NOTHING_TO_TRAIN)
    pool = self_play_pool(spec)
    if spec.learner.replicas > 1:
        untrained = _untrained(spec, models, trained)
        return LearnerActors(learned, seed, backend, intra_op_threads, untrained, pool)
    threads = {name: _learner_thread(p, seed, intra_op_threads) for name, p in learned.items()}
    untrained = _untrained(spec, models, trained)
    learners = {**{name: t.learner for name, t in threads.items()}, **untrained}
    return LocalLearners(threads, PolicySetState(learners, pool, frozenset(untrained)))


def _untrained(
    spec: ImpalaJobSpec, models: dict[str, PolicyModel], trained: set[str]
) -> dict[str, LearnerState]:
    """The fixed weights of the policies that do not learn (their initial ones, never changed)."""
    return {
        name: Learner(LearnerConfig.of(spec, name), model.obs_shape, model.actions)
        for name, model in models.items()
        if name not in trained
    }


def _learner_thread(
    policy: LearnerPolicy, seed: int, intra_op_threads: int
) -> LearnerThread | LearnerProcess:
    config = policy.config
    if config.learner.process == "separate":
        return LearnerProcess(config, policy.obs_shape, policy.actions, seed, intra_op_threads)
    from impala_trainer.learners.threads import make_learner_thread

    return make_learner_thread(config, policy.obs_shape, policy.actions)
