"""`impalajob train` of PettingZoo envs on an embedded Ray, learning for real: self-play on
tic-tac-toe (an AEC game with action masks) beats a random player and its own earlier self;
MPE's simple_spread (three cooperating agents, one shared policy) improves its team return over
random play, with discrete and with Box actions; simple_tag's predators and prey train two
policies of different networks in one job, in IMPALA and in A3C (async-gradients) mode. The
CLI runs as a subprocess, as a user runs it; `impalajob evaluate` scores the result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

TIMEOUT = 900
TRAINED_STEPS = 1_000_000
RANDOM_SPREAD = -81.0
"""simple_spread's team return (3 agents, 25 steps) under uniformly random actions: -80.9 +- 1.4
over 300 episodes, measured once (mpe2 1.1.1)."""


def _cli(*args: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "impala_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _status(run: Path) -> Any:
    return json.loads((run / "status.json").read_text())


def _train(run: Path, example: str, *settings: str, resume: bool = False) -> Any:
    """`impalajob train` of manifests/examples/EXAMPLE.yaml with `--set` settings; its status."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    path = f"manifests/examples/{example}.yaml"
    res = _cli("train", "-f", path, "--run-dir", str(run), *sets, *["--resume"] * resume)
    assert res.returncode == 0, res.stderr[-3000:]
    return _status(run)


SNAPSHOT_AT = 50_000
"""The first run's end, whose checkpoint is the earlier self the trained policy must beat; the
second run resumes from it, self-play pool included. Not the 200K of issue 48's wording: by 200K
a run already plays near its final strength and two decent players of tic-tac-toe each win their
games moving first (the example at 1M against its 200K self, sampled: 251-69-80, 215-5-180,
209-0-191), so beating it by a margin is chance; at 50K its entropy bonus is still high."""


# Self-play on a turn-based game: PettingZoo's tic-tac-toe (an AEC env: the players move in
# turn, and each observation's action_mask says which squares are free). One policy, `main`,
# plays both sides: in every game one side learns by it and the other is, half the time, a
# random player (the positions a weak player leads to, which `main` never meets against itself),
# else `main` too or a snapshot of it from a pool of its past versions. Masked actions are never
# played and get no probability in the loss. The example's own 1M moves (~60 s): its entropy
# bonus falls from 0.05 to 0.001 by 800K.
@pytest.mark.slow
def test_tictactoe_self_play_beats_a_random_player_and_its_earlier_self(tmp_path: Path) -> None:
    run = tmp_path / "ttt"
    _train(run, "tictactoe", f"stop.timesteps={SNAPSHOT_AT}", "training.seed=7")
    # The checkpoint at SNAPSHOT_AT, copied aside: the resumed run writes one every
    # checkpoint.intervalSeconds of wall time and keeps the newest few, so on a slow machine
    # it would be rotated away before the games against it.
    newest = max((run / "checkpoints").glob("ckpt-*"))
    snapshot = shutil.copytree(newest, tmp_path / f"earlier-{newest.name}")
    status = _train(run, "tictactoe", "training.seed=7", resume=True)
    assert status["counters"]["num_env_steps_sampled"] >= TRAINED_STEPS
    main = status["policies"]["main"]
    assert main["self_play_games"] > 500 and main["self_play_score"] is not None
    # The example's evaluation: 100 greedy games against random every 50K moves; the trend
    # follows those rounds (the training return of a zero-sum game is 0 whatever is learned).
    evaluation = status["evaluation"]
    assert evaluation["evaluations"] >= 15 and evaluation["opponent"] == "random", evaluation
    assert evaluation["wins"] + evaluation["draws"] + evaluation["losses"] == 100
    assert evaluation["best_checkpoint"] == "checkpoints/best", evaluation
    trend = status["return_trend"]
    assert trend["source"] == "evaluation" and not trend["regressed"], trend

    def games(*opponent: str, episodes: int = 200) -> Any:
        args = ("--run-dir", str(run), "--episodes", str(episodes), "--json", *opponent)
        scored = _cli("evaluate", *args)
        assert scored.returncode == 0, scored.stderr[-3000:]
        return json.loads(scored.stdout)

    # A random player against a random player wins about 44% of the games over both seats
    # (58% moving first, 29% second); the best any player can do is 96.7% (99.5% and 93.9%).
    # The run's best policy (checkpoints/best: what a user keeps) plays each seat in turn,
    # greedily. Scored exactly (bench/tictactoe_exact.py), the example's best policies at 1M
    # win 90.3%, 91.6% and 92.0% (seeds 7, 8, 9; with the old constant bonus of 0.001, 68-86%
    # at 400K and 77.9% at 1M).
    against_random = games("--opponent", "random", "--checkpoint", "best")
    assert against_random["games"] == 200 and against_random["win_rate"] >= 0.8, against_random
    # The newest weights against their own 50K self, both sampling their moves (greedy
    # against greedy is one game per seat), over 400 games: 379-5-16, 364-8-28, 369-5-26.
    against_itself = games(
        "--opponent", "main", "--opponent-checkpoint", str(snapshot), "--explore",
        "--checkpoint", max(p.name for p in (run / "checkpoints").glob("ckpt-*")), episodes=400,
    )  # fmt: skip
    assert against_itself["opponent"] == f"main ({snapshot.name})", against_itself
    assert against_itself["wins"] > 2 * against_itself["losses"], against_itself


@pytest.mark.slow
def test_simple_spread_agents_cooperate_better_than_random(tmp_path: Path) -> None:
    status = _train(tmp_path / "spread", "spread", "stop.timesteps=150000", "training.seed=3")
    # The last 100 episodes' team return, 6 above random's (measured: -67.7 at 150K steps).
    assert status["episode_return_mean"] > RANDOM_SPREAD + 6, status["episode_return_mean"]
    assert set(status["policies"]) == {"default"}
    assert "default/total_loss" in status["learner"]


RANDOM_BOX_SPREAD = -78.9
"""simple_spread's team return with Box actions (`continuous_actions`: 5 forces in [0, 1] per
agent) under uniformly random actions: -78.9 +- 1.5 over 300 episodes (mpe2 1.1.1)."""


@pytest.mark.slow
def test_simple_spread_with_box_actions_learns_from_the_defaults_and_keeps_it(
    tmp_path: Path,
) -> None:
    """The spread example with Box actions and nothing else changed: the shared policy's model
    gets the squashed Gaussian and the training APPO's clip (said in config.yaml), the team
    return rises clearly above random forces' and does not fall back (the trend's warning)."""
    run = tmp_path / "spread-box"
    status = _train(run, "spread", "env.kwargs.continuous_actions=true",
                    "stop.timesteps=300000", "training.seed=3")  # fmt: skip
    said = (run / "config.yaml").read_text()  # its header: what the env set, and why
    assert "spec.multiAgent.policies.default.model.squashActions: true" in said, said[:2000]
    assert "spec.training.surrogateClip: 0.3" in said, said[:2000]
    # Measured at 300K env steps: -62.9 and -61.7 (seeds 3 and 4), every report after 20K at
    # -73 or above, rising; PopArt with a bonus of 0.001 (the single-agent Box default) fell
    # to -110 and -127 here, its entropy to -3.4 and -4.9, so it is not the default for policies.
    assert status["episode_return_mean"] > RANDOM_BOX_SPREAD + 8, status["episode_return_mean"]
    assert not status["return_trend"]["regressed"], status["return_trend"]


RANDOM_TAG = {"predator": 3.8, "prey": -16.5}
"""simple_tag's return per agent (3 predators, 1 prey, 2 obstacles, 25 steps) under uniformly
random actions: predators 3.8 +- 0.6, the prey -16.5 +- 1.3 over 300 episodes (mpe2 1.1.1)."""


@pytest.mark.slow
def test_predators_and_prey_train_two_policies_of_different_models_in_one_job(
    tmp_path: Path,
) -> None:
    run = tmp_path / "tag"
    status = _train(run, "tag", "stop.timesteps=100000", "training.seed=1")
    policies = status["policies"]
    assert set(policies) == {"predator", "prey"}
    for name in policies:  # a learner each: its own loss, updates and stats
        assert f"{name}/total_loss" in status["learner"], sorted(status["learner"])
    # Each checkpointed with its own network: the predators' [64, 64], the prey's [128, 128].
    from impala_trainer.policy.games import load_game_policies

    loaded = load_game_policies(run)
    widths = {
        name: {p.shape[0] for p in policy.model.parameters() if p.ndim == 2}
        for name, policy in loaded.items()
    }
    assert 64 in widths["predator"] and 128 not in widths["predator"], widths
    assert 128 in widths["prey"] and 64 not in widths["prey"], widths
    # Both learn, each against the other. Every predator is paid 10 per catch and the prey
    # loses 10 per catch, so a predator's return is what the catches cost the prey, and the
    # prey's return plus a predator's is what it lost by leaving the field. Measured at 100K
    # steps and at 150K (seeds 1 and 2): the predators catch it more often than random ones
    # (8.7, 8.4 and 5.7 against 3.8; a predator's window is only 33 games); the prey's loss at
    # the border falls from 12.7 to 3.1, 4.9 and 3.5.
    prey = policies["prey"]["episode_return_mean"]
    predator = policies["predator"]["episode_return_mean"]
    assert predator > RANDOM_TAG["predator"], policies
    random_border = RANDOM_TAG["prey"] + RANDOM_TAG["predator"]
    assert prey + predator > random_border + 4, policies


@pytest.mark.slow
def test_two_learners_train_both_policies_on_ray_and_resume_with_one(tmp_path: Path) -> None:
    # Each learner actor (a process of its own on the `learner` resource) holds both policies;
    # each policy's gradients are averaged over the two in a gloo group of its own.
    run = tmp_path / "tag"
    first = _train(run, "tag", "stop.timesteps=60000", "learner.replicas=2", "training.seed=1")
    assert "2 learners in lock step" in (run / "trainer.log").read_text()
    for name in ("predator", "prey"):
        assert f"{name}/total_loss" in first["learner"], sorted(first["learner"])
    steps = first["counters"]["num_env_steps_sampled"]
    again = _train(run, "tag", f"stop.timesteps={steps + 10_000}", "learner.replicas=1",
                   "training.seed=1", resume=True)  # fmt: skip
    assert again["counters"]["learner_updates"] > first["counters"]["learner_updates"]


@pytest.mark.slow
def test_async_gradients_train_predators_and_prey_each_on_its_own_agents_and_resume(
    tmp_path: Path,
) -> None:
    # A3C on a PettingZoo env: every rollout worker computes each policy's gradients on its own
    # agents' columns of a fragment and the driver applies them to that policy, once per sample.
    # Measured at 100K steps (seeds 1, 2, 3): predators 9.6, 7.8 and 11.1; the prey's loss at
    # the border 4.8, 6.3 and 3.5 (random play: 3.8 and 12.7), as in IMPALA mode.
    run = tmp_path / "tag"
    a3c = ("training.mode=async-gradients", "learner.process=driver", "training.seed=1")
    status = _train(run, "tag", "stop.timesteps=100000", *a3c)
    c = status["counters"]
    assert c["num_env_steps_trained"] == c["num_env_steps_sampled"] == 100_000
    for name in ("predator", "prey"):
        assert f"{name}/total_loss" in status["learner"], sorted(status["learner"])
    policies = status["policies"]
    prey = policies["prey"]["episode_return_mean"]
    predator = policies["predator"]["episode_return_mean"]
    assert predator > RANDOM_TAG["predator"], policies
    assert prey + predator > RANDOM_TAG["prey"] + RANDOM_TAG["predator"] + 4, policies
    again = _train(run, "tag", "stop.timesteps=120000", *a3c, resume=True)
    assert again["counters"]["learner_updates"] > c["learner_updates"]
    assert again["counters"]["policy_version"] > c["policy_version"]
