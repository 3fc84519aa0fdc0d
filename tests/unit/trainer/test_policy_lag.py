"""Why continuous control learned and then collapsed, shown with the real worker and learner in
one process: the actor acts with the weights of LAG updates ago, as IMPALA's actors do while the
learner runs ahead (a bare job on two cores measured a mean lag of 5.3 updates).

On the point-reaching env (harness.reach), on-policy training learns and holds; five updates of
lag, with V-trace's policy gradient, collapse far below acting at random (the actions saturate at a
bound and the point walks away from every target): each stale batch keeps pushing the Gaussian
further along the direction the learner has already moved, since V-trace's truncated weight min(1,
pi/mu) bounds a sample's weight but not how far the policy has gone from the one that acted. APPO's
clipped surrogate (training.surrogateClip, the default for Box actions) stops the push past the
clip, and the same lag then learns as on-policy training does.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import numpy as np
import pytest

import harness.reach as reach
from impala_trainer.batches import concat_fragments
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.rollouts.worker import RolloutWorker
from tests.support.jobs import make_spec
from tests.support.learner import broadcast, one_torch_thread

LAG = 5
ENV_STEPS = 120_000


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _train_with_lag(lag: int, **training: object) -> list[float]:
    """Mean return of each 25 updates' episodes, the actor `lag` updates behind the learner."""
    spec = make_spec(env={"id": f"{reach.__name__}:PointReach-v0"},
                     training={"seed": 0, "trainBatchSize": 800, **training})  # fmt: skip
    worker = RolloutWorker(spec, "w", seed=0)
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    weights = collections.deque([(broadcast(learner), 0)], maxlen=lag + 1)
    worker.set_weights(*weights[0])
    means, returns, steps = [], [], 0
    while steps < ENV_STEPS:
        fragment = worker.sample()  # 16 envs x 50 steps: one train batch
        returns.extend(fragment.episode_returns)
        steps += fragment.actions.shape[0] * fragment.actions.shape[1]
        learner.learn_on_batch(concat_fragments([fragment]))
        weights.append((broadcast(learner), learner.policy_version))
        worker.set_weights(*weights[0])
        if learner.policy_version % 25 == 0:
            means.append(float(np.mean(returns)))
            returns = []
    return means


@pytest.mark.slow
def test_policy_lag_collapses_vtrace_and_the_surrogate_clip_holds() -> None:
    vtrace = _train_with_lag(LAG, surrogateClip=None)
    clipped = _train_with_lag(LAG, surrogateClip=0.3)
    said = f"V-trace {vtrace}, clipped {clipped}"
    # V-trace ends far below acting at random: saturated actions, walking away.
    assert vtrace[-1] < 2 * reach.RANDOM_RETURN, said
    # The clip: past halfway from random to the best by the end, and no fall on the way.
    assert clipped[-1] > (reach.RANDOM_RETURN + reach.BEST_RETURN) / 2, said
    assert clipped[-1] >= max(clipped) - 5.0, said
