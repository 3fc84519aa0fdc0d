"""The policy out of a run directory: `load_policy` builds the checkpoint's network, `evaluate`
plays whole episodes shared out fairly over its envs, and the TorchScript and ONNX exports give
the checkpoint's outputs and greedy actions on observations recorded from the env (an MLP, the
Pong CNN on uint8 frames, an LSTM, an LSTM fed its previous Box action and reward)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from impala_trainer.learning.distributions import SquashedGaussian
from impala_trainer.policy.episodes import _quotas, evaluate
from impala_trainer.policy.export import export_policy
from impala_trainer.policy.loaded import PolicyNotFoundError, load_policy
from impala_trainer.policy.player import Player
from impala_trainer.rollouts.envs import make_vector_env
from impala_trainer.rundir.writer import RunDir
from tests.support.jobs import make_job
from tests.support.learner import one_torch_thread
from tests.support.run_dirs import checkpointed_run_dir

KEEP = "impala_trainer.rollouts.wrappers:KeepObservations"
EXAMPLE_PACKAGE = Path(__file__).resolve().parents[3] / "examples" / "custom"
STATELESS = {"id": "CartPole-v1", "wrappers": [{"import": KEEP, "kwargs": {"indices": [0, 2]}}]}
JOBS: dict[str, dict[str, Any]] = {
    "mlp": {"env": {"id": "CartPole-v1"}, "model": {"hidden": [32, 32]}},
    "pong-cnn": {"env": {"id": "ALE/Pong-v5"}, "model": {"hidden": [64]}},
    "lstm": {"env": STATELESS, "model": {"hidden": [16], "useLstm": True, "lstmCellSize": 8}},
    # The user's own: a recurrent custom model on a Dict observation (flattened), and the
    # example package's MultiDiscrete env with its own model.
    "custom-gru-dict": {
        "env": {"id": "tests.support.corridor:DictCorridor-v0"},
        "model": {"type": "custom", "import": "tests.support.custom_models:GRUActorCritic"},
    },
    "custom-multidiscrete": {
        "env": {"id": "my_impala.envs:TwinCorridor-v0"},
        "model": {
            "type": "custom",
            "import": "my_impala.models:LayerNormMLP",
            "config": {"width": 16},
        },
    },
    "lstm-prev-box": {
        "env": {"id": "Pendulum-v1"},
        "model": {
            "hidden": [16],
            "useLstm": True,
            "lstmCellSize": 8,
            "lstmUsePrevActionReward": True,
        },
    },
}


def _recorded(run: Path, steps: int = 48) -> tuple[Any, list[dict[str, np.ndarray]]]:
    """The loaded policy and the graph inputs it met playing 4 envs for `steps` steps."""
    policy = load_policy(run)
    vec = make_vector_env(policy.job.spec.env, 4, seed=1)
    player = Player(policy.model, policy.actions, 4, explore=True, seed=1)
    obs, _ = vec.reset(seed=1)
    prev_action = policy.actions.empty_actions(1, 4)[0] * 0
    prev_reward = np.zeros(4, np.float32)
    feeds = []
    with one_torch_thread():
        for _ in range(steps):
            feed = {"obs": np.array(obs)}
            if policy.model.state_size:
                feed["state"] = player.state.copy()
            if policy.model.uses_prev_action_reward:
                feed |= {"prev_action": prev_action.copy(), "prev_reward": prev_reward.copy()}
            feeds.append(feed)
            action = player.act(obs)
            obs, reward, term, trunc, _ = vec.step(policy.actions.to_env(action))
            done = term | trunc
            player.observe(action, reward.astype(np.float32), done)
            keep = ~done.reshape(-1, *([1] * (action.ndim - 1)))
            prev_action, prev_reward = action * keep, np.where(done, 0.0, reward).astype(np.float32)
    vec.close()
    return policy, feeds


def _checkpoint_outputs(policy: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    model = policy.model
    obs = torch.from_numpy(feed["obs"])
    with torch.no_grad():
        if not model.state_size:
            outputs, values = model(obs)
            extra: list[np.ndarray] = []
        else:
            state = torch.from_numpy(feed["state"])
            if model.uses_prev_action_reward:
                state = model.carry(state, torch.from_numpy(feed["prev_action"]),
                                    torch.from_numpy(feed["prev_reward"]))  # fmt: skip
            no_reset = torch.zeros(1, len(obs), dtype=torch.bool)
            out, val, states = model.forward_sequence(obs[None], state, no_reset)
            outputs, values, extra = out[0], val[0], [states[0].numpy()]
    greedy = policy.actions.greedy(outputs.numpy())
    if isinstance(policy.actions, SquashedGaussian):  # the graph's action is the env's
        greedy = policy.actions.to_env(greedy).reshape(len(greedy), -1)
    return [outputs.numpy(), greedy, values.numpy(), *extra]


def _torchscript_runner(path: Path) -> Any:
    module = torch.jit.load(str(path))
    return lambda feed: [t.numpy() for t in module(*(torch.from_numpy(v) for v in feed.values()))]


def _onnx_runner(path: Path) -> Any:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("kind", list(JOBS))
def test_the_export_gives_the_checkpoints_actions_on_recorded_observations(
    tmp_path: Path, kind: str, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE_PACKAGE))  # my_impala, as a user's PYTHONPATH
    run = checkpointed_run_dir(tmp_path / "run", make_job(f"export-{kind}", **JOBS[kind]))
    policy, feeds = _recorded(run)
    path = tmp_path / f"policy.{fmt}"
    meta = json.loads(export_policy(policy, fmt, path).read_text())  # type: ignore[arg-type]
    assert [i["name"] for i in meta["inputs"]] == list(feeds[0])
    assert meta["observation"]["shape"] == list(policy.obs_shape)
    run_graph = _torchscript_runner(path) if fmt == "torchscript" else _onnx_runner(path)
    ties = 0
    for feed in feeds:
        want = _checkpoint_outputs(policy, feed)
        got = run_graph(feed)
        assert len(got) == len(want) == len(meta["outputs"])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)  # action inputs
        np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-5)  # value
        if len(want) == 4:
            np.testing.assert_allclose(got[3], want[3], rtol=1e-4, atol=1e-5)  # state out
        # Greedy actions: identical, but where two logits tie to float rounding.
        same = np.isclose(got[1], want[1], atol=1e-5)
        ties += int((~same).sum())
    assert ties <= 1, f"{ties} greedy actions differ"
    if kind == "pong-cnn":
        assert meta["inputs"][0]["dtype"] == "uint8"
        assert meta["observation"]["atari_preprocessing"]["frame_stack"] == 4


def test_evaluation_plays_exactly_its_episodes_shared_out_over_the_envs(tmp_path: Path) -> None:
    assert _quotas(7, 3).tolist() == [3, 2, 2]
    run = checkpointed_run_dir(tmp_path, make_job("evaluate", **JOBS["mlp"]))
    policy = load_policy(run)
    with one_torch_thread():
        greedy = evaluate(policy.job.spec.env, policy.model, policy.actions, 7, num_envs=3)
        again = evaluate(policy.job.spec.env, policy.model, policy.actions, 7, num_envs=3)
        sampled = evaluate(policy.job.spec.env, policy.model, policy.actions, 7, num_envs=3,
                           explore=True, seed=5)  # fmt: skip
    assert len(greedy.returns) == len(greedy.lengths) == 7
    assert greedy.returns == again.returns  # same seed, greedy: the same episodes
    assert sum(greedy.lengths) <= greedy.env_steps
    assert greedy.summary()["episode_return_min"] == min(greedy.returns)
    assert len(sampled.returns) == 7


def test_a_run_without_a_checkpoint_or_a_job_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFoundError, match=r"no config\.yaml"):
        load_policy(tmp_path)
    RunDir(tmp_path).prepare(make_job("empty", **JOBS["mlp"]))
    with pytest.raises(PolicyNotFoundError, match="has no checkpoint yet"):
        load_policy(tmp_path)
    checkpointed_run_dir(tmp_path, make_job("empty", **JOBS["mlp"]))
    with pytest.raises(PolicyNotFoundError, match="no complete checkpoint ckpt-000099"):
        load_policy(tmp_path, "ckpt-000099")
    # A checkpoint of another network than config.yaml describes, and one that is not a file
    # torch can read: each named, with why.
    RunDir(tmp_path).prepare(make_job("empty", env={"id": "CartPole-v1"}, model={"hidden": [8]}))
    with pytest.raises(PolicyNotFoundError, match=r"learner\.pt is not a checkpoint of the net"):
        load_policy(tmp_path)
    (ckpt,) = (tmp_path / "checkpoints").glob("ckpt-*")
    (ckpt / "learner.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PolicyNotFoundError, match=r"learner\.pt cannot be read"):
        load_policy(tmp_path)


def test_an_evaluation_video_is_an_mp4_of_the_rendered_episode(tmp_path: Path) -> None:
    run = checkpointed_run_dir(tmp_path / "run", make_job("video", **JOBS["mlp"]))
    policy = load_policy(run)
    with one_torch_thread():
        result = evaluate(policy.job.spec.env, policy.model, policy.actions, 2, num_envs=2,
                          video_dir=tmp_path / "videos")  # fmt: skip
    assert [v.name for v in result.videos] == ["episode-000.mp4"]
    data = result.videos[0].read_bytes()
    assert data[4:8] == b"ftyp" and len(data) > 1000  # an ISO media file, not an empty one
