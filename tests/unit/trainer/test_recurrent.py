"""Recurrent policies (`model.useLstm`): the worker carries the state across steps and fragments
and zeroes it where an episode starts; a fragment ships the state each column began with; the
learner's unroll from it reproduces the worker's step-by-step outputs; sequences (maxSeqLen),
towers and checkpoints keep the state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import Fragment, concat_fragments, split_sequences
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.models import ActorCritic
from impala_trainer.learning.towers import MultiDeviceLearner
from impala_trainer.rollouts.worker import RolloutWorker
from impala_trainer.rundir.checkpoint import DriverState, load_checkpoint, save_checkpoint
from tests.support.jobs import make_spec
from tests.support.learner import acting_weights, one_torch_thread

STATELESS_CARTPOLE: dict[str, Any] = {
    "id": "CartPole-v1",
    "numEnvsPerWorker": 4,
    "wrappers": [
        {
            "import": "impala_trainer.rollouts.wrappers:KeepObservations",
            "kwargs": {"indices": [0, 2]},
        }
    ],
}


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _spec(fake_devices: int = 0, **model: Any) -> ImpalaJobSpec:
    return make_spec(
        env=STATELESS_CARTPOLE,
        model={"hidden": [16], "useLstm": True, "lstmCellSize": 8, **model},
        training={"rolloutFragmentLength": 20, "gradClip": None},
        learner={"fakeDevices": fake_devices},
    )


def _resets(f: Fragment) -> torch.Tensor:
    """Zero the state before step t where the column's episode ended at t - 1."""
    done = torch.from_numpy(f.terminateds | f.truncateds)
    return torch.cat([done.new_zeros(1, done.shape[1]), done[:-1]])


def _unroll(
    model: ActorCritic, f: Fragment, resets: torch.Tensor | None = None, prev: bool = True
) -> Any:
    """The learner's unroll of `f` (with the steps' actions and rewards where the model takes
    them, unless `prev` is False)."""
    extra = (
        (torch.from_numpy(f.actions), torch.from_numpy(f.rewards))
        if prev and model.uses_prev_action_reward
        else ()
    )
    with torch.no_grad():
        return model.forward_sequence(
            torch.from_numpy(f.obs),
            torch.from_numpy(f.state_in),
            _resets(f) if resets is None else resets,
            *extra,
        )


def test_the_learners_unroll_equals_the_workers_steps() -> None:
    worker = RolloutWorker(_spec(), "w", seed=0)
    fragments = [worker.sample() for _ in range(4)]
    assert all(f.state_in.shape == (4, 16) for f in fragments)  # [B, h + c]
    assert sum(int(f.terminateds.sum()) for f in fragments) > 4  # episodes end mid-fragment
    for f in fragments:
        outputs, _, _ = _unroll(worker.policies["default"].model, f)
        np.testing.assert_allclose(outputs.numpy(), f.behaviour_logits, rtol=1e-5, atol=1e-6)
    # Guard: without the resets at episode ends the unroll is a different policy.
    f = next(f for f in fragments if f.terminateds[:-1].any())
    no_resets = torch.zeros(f.terminateds.shape, dtype=torch.bool)
    outputs, _, _ = _unroll(worker.policies["default"].model, f, no_resets)
    assert not np.allclose(outputs.numpy(), f.behaviour_logits, atol=1e-4)


def test_the_state_is_carried_across_fragments_and_zeroed_where_an_episode_ends() -> None:
    worker = RolloutWorker(_spec(), "w", seed=1)
    first = worker.sample()
    np.testing.assert_array_equal(first.state_in, 0.0)  # every episode starts from zeros
    for _ in range(6):
        second = worker.sample()
        _, _, states = _unroll(worker.policies["default"].model, first)
        ended = first.terminateds[-1] | first.truncateds[-1]
        expected = np.where(ended[:, None], 0.0, states[-1].numpy())
        np.testing.assert_allclose(second.state_in, expected, rtol=1e-5, atol=1e-6)
        assert np.abs(second.state_in[~ended]).sum() > 0  # carried, not restarted
        first = second


def test_max_seq_len_cuts_fragments_into_sequences_with_their_own_start_states() -> None:
    whole = RolloutWorker(_spec(), "w", seed=2).sample()
    worker = RolloutWorker(_spec(maxSeqLen=5), "w", seed=2)  # the same weights and episodes
    seqs = worker.sample()
    assert seqs.obs.shape == (5, 16, 2) and seqs.state_in.shape == (16, 16)
    assert seqs.env_steps == whole.env_steps == 80
    # Column i * B + b is steps [5i, 5i + 5) of env b; its bootstrap is the next sequence's start.
    np.testing.assert_array_equal(seqs.obs[:, 4 + 1], whole.obs[5:10, 1])
    np.testing.assert_array_equal(seqs.bootstrap_obs[4 + 1], whole.obs[10, 1])
    np.testing.assert_array_equal(seqs.bootstrap_obs[12:], whole.bootstrap_obs)
    _, _, states = _unroll(worker.policies["default"].model, whole)
    ended = whole.terminateds | whole.truncateds
    for i in (1, 2, 3):
        expected = np.where(ended[5 * i - 1][:, None], 0.0, states[5 * i - 1].numpy())
        np.testing.assert_allclose(seqs.state_in[4 * i : 4 * i + 4], expected, atol=1e-6)
    outputs, _, _ = _unroll(worker.policies["default"].model, seqs)
    np.testing.assert_allclose(outputs.numpy(), seqs.behaviour_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        split_sequences(whole, 5, np.zeros((4, 4, 16), np.float32)).actions, seqs.actions
    )


def test_towers_split_the_batch_by_sequence_and_match_one_device() -> None:
    worker = RolloutWorker(_spec(), "w", seed=3)
    batch = concat_fragments([worker.sample(), worker.sample()])  # 8 sequences
    torch.manual_seed(0)
    built = worker.models["default"]
    single = Learner(LearnerConfig.of(_spec()), built.obs_shape, built.actions, dtype=torch.float64)
    multi = MultiDeviceLearner(LearnerConfig.of(_spec(fake_devices=2)), built.obs_shape,
                               built.actions, dtype=torch.float64)  # fmt: skip
    multi.set_weights(single.get_weights())
    single.learn_on_batch(batch)
    multi.load_batch_into_buffer(batch, 0)
    shards = multi._stacks[0]
    assert [s.tensors.state_in.shape for s in shards] == [(4, 16), (4, 16)]
    torch.testing.assert_close(shards[1].tensors.state_in, torch.from_numpy(batch.state_in[4:]))
    multi.learn_on_loaded_batch(0)
    for ps, pm in zip(single.model.parameters(), multi.model.parameters(), strict=True):
        torch.testing.assert_close(pm.grad, ps.grad, rtol=1e-9, atol=1e-12)


def test_a_checkpoint_restores_the_recurrent_policy(tmp_path: Path) -> None:
    worker = RolloutWorker(_spec(), "w", seed=4)
    learner = Learner(LearnerConfig.of(_spec()), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    for _ in range(2):
        learner.learn_on_batch(concat_fragments([worker.sample()]))
    state = DriverState(counters={}, wall_seconds=1.0, episode_returns=[], episode_lengths=[],
                        iteration=1, started_at=0.0)  # fmt: skip
    restored, _ = load_checkpoint(save_checkpoint(tmp_path, learner.state_dict(), state, keep=1))
    fresh = Learner(LearnerConfig.of(_spec()), worker.models["default"].obs_shape,
                    worker.models["default"].actions)  # fmt: skip
    fresh.load_state_dict(restored)
    f = worker.sample()
    for a, b in zip(_unroll(learner.model, f), _unroll(fresh.model, f), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_previous_action_and_reward_ride_in_the_state() -> None:
    """`lstmUsePrevActionReward`: the core also sees the last action (one-hot) and reward, kept
    as the state's tail, so fragments, sequences and the learner's unroll carry them."""
    worker = RolloutWorker(_spec(lstmUsePrevActionReward=True, maxSeqLen=10), "w", seed=6)
    model = worker.policies["default"].model
    assert model.state_size == 16 + 2 + 1  # [h, c, one-hot of Discrete(2), reward]
    fragments = [worker.sample() for _ in range(4)]
    for f in fragments:
        outputs, _, states = _unroll(worker.policies["default"].model, f)
        np.testing.assert_allclose(outputs.numpy(), f.behaviour_logits, rtol=1e-5, atol=1e-6)
        # Each sequence starts from the action and reward of the step before it (zeros where
        # that step ended an episode): column i * B + b of the second half is steps 10-19.
        tail = f.state_in[4:, 16:]
        first_half = slice(0, 4)
        ended = f.terminateds[9, first_half] | f.truncateds[9, first_half]
        expected = np.eye(2)[f.actions[9, first_half]]
        expected = np.concatenate([expected, f.rewards[9, first_half, None]], axis=1)
        np.testing.assert_array_equal(tail, np.where(ended[:, None], 0.0, expected))
        np.testing.assert_allclose(states[-1, :, 16:18].numpy(), np.eye(2)[f.actions[-1]])
    # Guard: an unroll that does not write the actions in is a different policy.
    outputs, _, _ = _unroll(worker.policies["default"].model, fragments[-1], prev=False)
    assert not np.allclose(outputs.numpy(), fragments[-1].behaviour_logits, atol=1e-4)
    built = worker.models["default"]
    config = LearnerConfig.of(_spec(lstmUsePrevActionReward=True, maxSeqLen=10))
    learner = Learner(config, built.obs_shape, built.actions)
    stats = learner.learn_on_batch(concat_fragments(fragments))
    assert np.isfinite(stats["total_loss"]) and learner.policy_version == 1


def test_async_gradients_workers_compute_gradients_of_a_recurrent_policy() -> None:
    """A3C mode (`training.mode: async-gradients`) takes an LSTM too: the worker unrolls its own
    fragment from the state it began with and the driver's learner applies the gradients."""
    spec = _spec().model_copy(deep=True)
    spec.training.mode = "async-gradients"
    worker = RolloutWorker(spec, "w", seed=5)
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    learner.set_weights(acting_weights(worker))
    out = worker.compute_gradients()
    grads = out.grads["default"]
    assert out.stats["default/batch_count"] == 80 and len(grads) == len(learner.params)
    assert any(np.abs(g).sum() > 0 for g in grads)
    learner.apply_gradients(grads)
    assert learner.policy_version == 1
