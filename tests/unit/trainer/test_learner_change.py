"""A running learner's changes (population-based training): the live hyperparameters its next
update uses, and another run's state adopted with its own counters kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from impala_api.population.paths import with_values
from impala_trainer.learning.learner import Learner, LearnerChange, LearnerConfig
from tests.support.learner import learner_spec, make_batch, one_torch_thread


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def trained(seed: int, steps: int, **training: object) -> Learner:
    torch.manual_seed(seed)
    learner = Learner(LearnerConfig.of(learner_spec(**training)), (4,), 2)
    for i in range(steps):
        learner.global_timestep += 40
        learner.learn_on_batch(make_batch(seed=seed * 100 + i))
    return learner


def test_the_next_update_uses_the_new_rate_and_entropy_coefficient() -> None:
    spec = learner_spec(lr=1e-3, entropyCoeff=0.01)
    learner = trained(0, 2, lr=1e-3, entropyCoeff=0.01)
    before = learner.learn_on_batch(make_batch(seed=5))
    assert before["cur_lr"] == pytest.approx(1e-3) and before["entropy_coeff"] == 0.01
    new = with_values(spec, {"training.lr": 3e-4, "training.entropyCoeff": 0.002}).training
    learner.change(LearnerChange(training=new))
    after = learner.learn_on_batch(make_batch(seed=6))
    assert after["cur_lr"] == pytest.approx(3e-4) and after["entropy_coeff"] == 0.002
    assert learner.optimizers[0].param_groups[0]["lr"] == pytest.approx(3e-4)


def test_a_schedule_scaled_by_a_new_rate_is_followed_from_the_next_update() -> None:
    schedule = [[0, 1e-3], [1000, 1e-4]]
    spec = learner_spec(lr=1e-3, lrSchedule=schedule)
    learner = trained(0, 1, lr=1e-3, lrSchedule=schedule)
    learner.global_timestep = 500
    assert learner.learn_on_batch(make_batch())["cur_lr"] == pytest.approx(5.5e-4)
    learner.change(LearnerChange(training=with_values(spec, {"training.lr": 2e-3}).training))
    assert learner.learn_on_batch(make_batch())["cur_lr"] == pytest.approx(1.1e-3)


def test_the_optimisers_epsilon_changes_and_stays_after_an_adopted_state() -> None:
    spec = learner_spec()
    winner, loser = trained(1, 3), trained(2, 1)
    new = with_values(spec, {"training.optimizer.epsilon": 1e-5}).training
    loser.change(LearnerChange(state=winner.state_dict(), training=new))
    loser.learn_on_batch(make_batch())
    assert loser.optimizers[0].param_groups[0]["eps"] == 1e-5


def test_an_adopted_state_is_the_winners_with_the_losers_counters() -> None:
    winner, loser = trained(1, 4), trained(2, 2)
    state = winner.state_dict()
    version, clock = loser.policy_version, loser.global_timestep
    loser.change(LearnerChange(state=state))
    assert loser.take_change()  # what the learner thread calls before its next update
    assert loser.policy_version == version and loser.global_timestep == clock
    for name, value in state["model"].items():
        assert torch.equal(loser.model.state_dict()[name].double(), value.double()), name
    mine = loser.optimizers[0].state_dict()["state"]
    theirs = state["optimizers"][0]["state"]
    for index, slots in theirs.items():
        for key, value in slots.items():
            assert torch.equal(torch.as_tensor(mine[index][key]).double(),
                               torch.as_tensor(value).double()), (index, key)  # fmt: skip
    assert not loser.take_change()  # taken once


def test_a_change_at_a_version_waits_for_it() -> None:
    learner = trained(0, 1)
    learner.change(LearnerChange(training=learner.config.training, at_version=3))
    assert not learner.take_change()  # version 1
    learner.learn_on_batch(make_batch())
    learner.learn_on_batch(make_batch())
    assert learner.policy_version == 3 and learner.take_change()
