"""Multi-agent sampling (spec.env.pettingzoo): agents' steps reach their own policy's columns,
one agent per column and in order; finished agents stop contributing; mapping errors name the
field; the driver trains one learner per policy and checkpoints each."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from impala_api.spec import ImpalaJob, ImpalaJobSpec
from impala_trainer.batches import MultiAgentFragment, concat_fragments, no_mask, policy_weights
from impala_trainer.driver.launch import Wiring, build_driver
from impala_trainer.driver.local_backend import LocalBackend
from impala_trainer.learners.policies import SelfPlayPool
from impala_trainer.learning.distributions import MASKED_LOGIT
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.policy.games import game_policies, load_game_policies, play_games
from impala_trainer.policy.loaded import PolicyNotFoundError, load_policy
from impala_trainer.policy.rounds import Evaluator
from impala_trainer.preflight import job_problem
from impala_trainer.rollouts.agent_envs import MappingError, policy_mapping, policy_models
from impala_trainer.rollouts.lanes import Lane, PolicyLanes, Step
from impala_trainer.rollouts.worker import RolloutWorker
from impala_trainer.rundir.writer import RunDir

pytest.importorskip("pettingzoo")

RELAY = "tests.support.agent_games:relay"
TURNS = "tests.support.agent_games:turns"
TWO_POLICIES = {
    "policies": {"a": {}, "b": {"model": {"hidden": [16]}}},
    "policyMapping": [{"agents": "a_*", "policy": "a"}, {"agents": "*", "policy": "b"}],
}


def spec_of(env: str, t_len: int = 4, num_envs: int = 2, **extra: Any) -> ImpalaJobSpec:
    kwargs = extra.pop("kwargs", {})
    raw = {
        "metadata": {"name": "agents"},
        "spec": {
            "env": {"pettingzoo": env, "numEnvsPerWorker": num_envs, "kwargs": kwargs},
            "model": {"hidden": [8]},
            "training": {"rolloutFragmentLength": t_len, "trainBatchSize": 8},
            "stop": {"timesteps": 1000},
            **extra,
        },
    }
    return ImpalaJob.model_validate(raw).spec


def columns_are_trajectories(obs: np.ndarray, index: int | set[int]) -> None:
    """Each column one agent's steps in order: its index fixed, its own step count rising by
    one within an episode (or restarting at a new one)."""
    indices = {index} if isinstance(index, int) else index
    for col in range(obs.shape[1]):
        agent, step, episode = obs[:, col, 0], obs[:, col, 1], obs[:, col, 2]
        assert len(set(agent)) == 1 and int(agent[0]) in indices
        for t in range(1, len(step)):
            same = episode[t] == episode[t - 1]
            assert (same and step[t] == step[t - 1] + 1) or (not same and step[t] == 0)


def test_each_policy_gets_its_own_agents_steps_one_agent_per_column() -> None:
    spec = spec_of(RELAY, multiAgent=TWO_POLICIES)
    worker = RolloutWorker(spec, "w", seed=1)
    for _ in range(4):
        sample = worker.sample()
        assert isinstance(sample, MultiAgentFragment)
        a, b = sample.fragments["a"], sample.fragments["b"]
        assert a.policy_id == "a" and b.policy_id == "b"
        # 2 envs x (a_0, a_1) and 2 envs x b_0
        assert a.obs.shape == (4, 4, 3) and b.obs.shape == (4, 2, 3)
        columns_are_trajectories(a.obs, {0, 1})
        columns_are_trajectories(b.obs, 2)
        assert set(np.unique(a.rewards)) <= {1.0, 2.0} and set(np.unique(b.rewards)) == {3.0}


def test_an_agent_that_finishes_early_gives_no_steps_until_its_next_episode() -> None:
    # a_1 is done after 3 of the episode's 7 steps: its lanes hold 3 steps per episode, a_0's 7.
    spec = spec_of(RELAY, t_len=3, kwargs={"short": 3, "long": 7}, multiAgent=TWO_POLICIES)
    worker = RolloutWorker(spec, "w", seed=1)
    obs, terms = [], []
    for _ in range(6):
        fragment = worker.sample().fragments["a"]
        obs.append(fragment.obs)
        terms.append(fragment.terminateds)
    steps = np.concatenate(obs, axis=1)
    done = np.concatenate(terms, axis=1)
    of_a1 = steps[0, :, 0] == 1
    assert of_a1.any() and (~of_a1).any()
    # Every a_1 column is one whole episode of 3 steps that ends terminated; a_1 never shows a
    # step past its third.
    assert (steps[:, of_a1, 1] == np.arange(3)[:, None]).all()
    assert done[2, of_a1].all() and not done[:2, of_a1].any()
    assert steps[:, ~of_a1, 1].max() == 6


def test_truncated_agents_carry_their_final_observation() -> None:
    spec = spec_of(RELAY, t_len=7, kwargs={"short": 7, "long": 7, "truncate": True})
    fragment = RolloutWorker(spec, "w", seed=0).sample().fragments["default"]
    assert fragment.truncateds[6].all() and not fragment.terminateds.any()
    assert len(fragment.final_steps) == fragment.obs.shape[1]
    # The final observation is the one after the 7th step: own step count 7.
    assert (fragment.final_obs[:, 1] == 7).all()


def test_turn_based_agents_get_what_their_moves_earned() -> None:
    # 5 moves: first moves 3 times (0.1, 0.1, then the winning 1.0), second twice: 0.1, then
    # 0.1 and the loser's -1 that came before its next turn, one reward for its last move.
    spec = spec_of(TURNS, t_len=6, num_envs=1, kwargs={"moves": 5})
    worker = RolloutWorker(spec, "w", seed=0)
    fragment = worker.sample().fragments["default"]
    columns_are_trajectories(fragment.obs, {0, 1})
    for col in range(fragment.obs.shape[1]):
        agent = int(fragment.obs[0, col, 0])
        rewards = fragment.rewards[:, col].tolist()
        per_episode = [0.1, 0.1, 1.0] if agent == 0 else [0.1, -0.9]
        assert rewards == pytest.approx((per_episode * 6)[: len(rewards)])
    sample = worker.sample()
    assert sample.episode_returns == pytest.approx([0.4] * len(sample.episode_returns))
    assert sample.episode_returns


def test_the_first_matching_rule_maps_and_an_unmatched_agent_is_refused() -> None:
    agents = spec_of(RELAY, multiAgent=TWO_POLICIES).agents
    policy_of = policy_mapping(agents)
    assert [policy_of(a) for a in ("a_0", "a_1", "b_0")] == ["a", "a", "b"]
    narrow = {**TWO_POLICIES, "policyMapping": [{"agents": "a_*", "policy": "a"}]}
    with pytest.raises(MappingError) as err:
        policy_mapping(spec_of(RELAY, multiAgent=narrow).agents)("b_0")
    assert err.value.field == "multiAgent.policyMapping" and "b_0" in str(err.value)


@pytest.mark.parametrize(
    ("multi_agent", "field"),
    [
        ({**TWO_POLICIES, "policyMapping": [{"agents": "a_*", "policy": "a"}]},
         "multiAgent.policyMapping"),
        ({**TWO_POLICIES, "policiesToTrain": []}, None),
        ({"policies": {"a": {}, "c": {}}, "policyMapping": [{"agents": "*", "policy": "a"}],
          "policiesToTrain": ["c"]}, "multiAgent.policiesToTrain"),
        ({"policies": {"a": {}, "b": {"model": {"type": "cnn"}}},
          "policyMapping": TWO_POLICIES["policyMapping"]}, "multiAgent.policies.b.model.type"),
    ],
)  # fmt: skip
def test_preflight_names_the_field(multi_agent: dict[str, Any], field: str | None) -> None:
    if multi_agent.get("policiesToTrain") == []:
        with pytest.raises(ValueError, match="policiesToTrain"):
            spec_of(RELAY, multiAgent=multi_agent)
        return
    problem = job_problem(spec_of(RELAY, multiAgent=multi_agent))
    assert problem is not None and problem[0] == field, problem


def test_an_env_module_that_does_not_import_is_refused_naming_pettingzoo() -> None:
    problem = job_problem(spec_of("no_such_games.board_v0"))
    assert problem is not None and problem[0] == "env.pettingzoo"
    assert "cannot import module 'no_such_games.board_v0'" in problem[1]


def test_two_agents_of_one_policy_must_share_their_spaces() -> None:
    spec = spec_of("mpe2.simple_tag_v3", kwargs={"num_good": 1, "num_adversaries": 1})
    problem = job_problem(spec)
    assert problem is not None and problem[0] == "multiAgent.policyMapping"
    assert "map them to policies of their own" in problem[1]


@pytest.mark.parametrize(
    ("evaluation", "field", "says"),
    [
        ({"opponent": "random", "policy": "c"}, "evaluation.policy", "no agent of"),
        ({"opponent": "c"}, "evaluation.opponent", "an opponent is 'random' or a policy"),
        # b plays a_1 and b_0 while a plays a_0 (then a_0 and b_0 while a plays a_1): they all
        # observe and act alike
        ({"opponent": "b", "policy": "a"}, None, ""),
    ],
)
def test_an_evaluation_opponent_must_have_seats_to_play(
    evaluation: dict[str, str], field: str | None, says: str
) -> None:
    agents = {**TWO_POLICIES, "policies": {**TWO_POLICIES["policies"], "c": {}}}
    problem = job_problem(spec_of(RELAY, multiAgent=agents, evaluation=evaluation))
    if field is None:
        assert problem is None, problem
    else:
        assert problem is not None and problem[0] == field and says in problem[1], problem


def test_a_stop_criterion_on_a_policy_no_agent_acts_by_is_refused() -> None:
    agents = {**TWO_POLICIES, "policies": {**TWO_POLICIES["policies"], "c": {}}}
    stop = {"episodeReturnMean": 1.0, "policy": "c"}
    problem = job_problem(spec_of(RELAY, multiAgent=agents, stop=stop))
    assert problem is not None and problem[0] == "stop.policy" and "no return" in problem[1]


def test_an_evaluation_opponent_must_fit_the_seats_it_takes() -> None:
    # Two predators: while one is scored, the prey's policy would have to play the other.
    spec = spec_of(
        "mpe2.simple_tag_v3", kwargs={"num_good": 1, "num_adversaries": 2},
        multiAgent={
            "policies": {"predator": {}, "prey": {}},
            "policyMapping": [{"agents": "adversary_*", "policy": "predator"},
                              {"agents": "*", "policy": "prey"}],
        },
        evaluation={"opponent": "prey", "policy": "predator"},
    )  # fmt: skip
    problem = job_problem(spec)
    assert problem is not None and problem[0] == "evaluation.opponent"
    assert "cannot take the seat of adversary_1 (policy predator): their spaces" in problem[1]


def test_lane_waits_for_the_next_observation_unless_the_step_ended_the_episode() -> None:
    lane = Lane()
    for t in range(2):
        lane.act(Step(np.array([t], np.float32), np.array(0), np.zeros(2, np.float32)))
        lane.complete(1.0, False, False, None)
    assert lane.ready(2) == 0  # its bootstrap observation is not known yet
    lane.act(Step(np.array([2], np.float32), np.array(0), np.zeros(2, np.float32)))
    assert lane.ready(2) == 1
    steps, bootstrap = lane.take(2)
    assert [float(s.obs[0]) for s in steps] == [0, 1] and float(bootstrap[0]) == 2
    lane.complete(1.0, True, False, None)
    lane.act(Step(np.array([0], np.float32), np.array(0), np.zeros(2, np.float32)))
    lane.complete(0.0, True, False, None)
    assert lane.ready(2) == 1  # ends terminated: nothing to bootstrap from


def test_a_lane_ahead_gives_two_columns_and_one_behind_none() -> None:
    lanes = PolicyLanes("p", num_lanes=2, t_len=1)
    ahead, behind = lanes.lanes
    for i in range(2):
        ahead.act(Step(np.array([i], np.float32), np.array(0), np.zeros(2, np.float32)))
        ahead.complete(1.0, False, False, None)
    ahead.act(Step(np.array([2], np.float32), np.array(0), np.zeros(2, np.float32)))
    assert lanes.ready()
    fragment = lanes.fragment(policy_version=3, worker_id="w")
    assert fragment.obs[0, :, 0].tolist() == [0, 1]
    assert fragment.bootstrap_obs[:, 0].tolist() == [1, 2]
    assert not behind.steps and fragment.policy_version == 3


def _run(tmp_path: Path, spec: ImpalaJobSpec, resume: bool = False, aggregators: int = 0) -> Any:
    job = ImpalaJob.model_validate({"metadata": {"name": "agents"}, "spec": spec.model_dump()})
    backend = LocalBackend(rollout_units=2, aggregator_units=aggregators)
    wiring = Wiring(rollout_workers=2, aggregator_workers=aggregators, resume=resume)
    run_dir = RunDir(tmp_path / "run")
    if not resume:
        run_dir.prepare(job)
    driver = build_driver(job, run_dir, backend, wiring)
    result = driver.run()
    assert result.phase == "Succeeded", result.message
    return driver


@pytest.mark.parametrize(
    ("aggregators", "process"), [(0, "driver"), (1, "driver"), (0, "separate")]
)
def test_each_trained_policy_learns_on_its_own_learner_and_resumes(
    tmp_path: Path, aggregators: int, process: str
) -> None:
    # learner.process separate: each policy's learner in a process of its own.
    spec = spec_of(RELAY, multiAgent=TWO_POLICIES, stop={"timesteps": 400},
                   learner={"process": process})  # fmt: skip
    driver = _run(tmp_path, spec, aggregators=aggregators)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert set(status["policies"]) == {"a", "b"}
    assert status["policies"]["b"]["episode_return_mean"] == pytest.approx(21.0)  # 7 x 3
    assert {"a/total_loss", "b/total_loss"} <= set(status["learner"])
    state = driver.learner.state_dict()["policies"]
    versions = {name: s["policy_version"] for name, s in state.items()}
    assert versions["a"] > 0 and versions["b"] > 0
    more = spec.model_copy(update={"stop": spec.stop.model_copy(update={"timesteps": 800})})
    resumed = _run(tmp_path, more, resume=True, aggregators=aggregators)
    again = resumed.learner.state_dict()["policies"]
    assert all(again[name]["policy_version"] > versions[name] for name in versions)


def test_two_learners_train_every_policy_in_lock_step_and_resume_at_one(tmp_path: Path) -> None:
    # 2000 steps: the learners' first steps are slow (gloo warming up) while the relay samples fast.
    spec = spec_of(RELAY, multiAgent=TWO_POLICIES, stop={"timesteps": 2000},
                   learner={"replicas": 2})  # fmt: skip
    driver = _run(tmp_path, spec)
    learners = [actor.learner for actor in driver.backend.learners]
    assert len(learners) == 2
    versions = driver.learner.state_dict()["policies"]
    for name in ("a", "b"):
        expected = versions[name]["policy_version"]
        assert [w.learners[name].policy_version for w in learners] == [expected] * 2
        ours, theirs = (pickle.loads(w.weights(name)) for w in learners)
        assert all(np.array_equal(v, theirs[k]) for k, v in ours.items())
    assert versions["a"]["policy_version"] > 0 and versions["b"]["policy_version"] > 0
    learner = spec.learner.model_copy(update={"replicas": 1})
    stop = spec.stop.model_copy(update={"timesteps": 3000})
    one = spec.model_copy(update={"learner": learner, "stop": stop})
    again = _run(tmp_path, one, resume=True).learner.state_dict()["policies"]
    assert all(again[n]["policy_version"] > versions[n]["policy_version"] for n in ("a", "b"))


RECURRENT = {
    **TWO_POLICIES,
    "policies": {"a": {"model": {"useLstm": True, "lstmCellSize": 8, "maxSeqLen": 2}}, "b": {}},
}


def _async(spec: ImpalaJobSpec) -> ImpalaJobSpec:
    training = spec.training.model_copy(update={"mode": "async-gradients"})
    return spec.model_copy(update={"training": training})


def test_a3c_gradients_of_each_policy_are_its_learners_on_its_own_agents_columns() -> None:
    # Policy a recurrent (its columns unrolled from the states they acted from), b feed-forward.
    spec = spec_of(RELAY, multiAgent=RECURRENT)
    acting = RolloutWorker(_async(spec), "a", seed=11)
    twin = RolloutWorker(spec, "b", seed=11)  # same seed, same weights: same sample
    twin.set_weights(acting.get_weights(), 0)
    gradients = acting.compute_gradients(global_timestep=0)
    assert set(gradients.grads) == {"a", "b"}
    assert {"a/total_loss", "b/total_loss", "a/entropy"} <= set(gradients.stats)
    sample = twin.sample()
    assert gradients.meta.env_steps == sample.env_steps > 0
    for name, grads in gradients.grads.items():
        learner = Learner(LearnerConfig.of(spec.policy_spec(name)), (3,),
                          acting.policies[name].actions)  # fmt: skip
        learner.set_weights(policy_weights(acting.get_weights())[name][0])
        expected, _ = learner.compute_gradients(concat_fragments([sample.fragments[name]]))
        assert len(grads) == len(expected)
        for g, e in zip(grads, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)


def test_async_gradients_train_every_policy_and_resume(tmp_path: Path) -> None:
    spec = _async(spec_of(RELAY, multiAgent=RECURRENT, stop={"timesteps": 400}))
    driver = _run(tmp_path, spec)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    c = status["counters"]
    # Each sample trained once, as the gradients of both policies from the worker that took it.
    assert c["num_env_steps_trained"] == c["num_env_steps_sampled"] >= 400
    state = driver.learner.state_dict()["policies"]
    versions = {name: s["policy_version"] for name, s in state.items()}
    assert versions["a"] == versions["b"] == c["learner_updates"] > 0
    assert {"a/total_loss", "b/total_loss"} <= set(status["learner"])
    assert status["policies"]["b"]["episode_return_mean"] == pytest.approx(21.0)  # 7 x 3
    more = spec.model_copy(update={"stop": spec.stop.model_copy(update={"timesteps": 800})})
    again = _run(tmp_path, more, resume=True).learner.state_dict()["policies"]
    assert all(again[name]["policy_version"] > versions[name] for name in versions)


def test_a_recurrent_policys_columns_start_from_the_state_their_agent_acted_from() -> None:
    spec = spec_of(RELAY, multiAgent=RECURRENT)
    worker = RolloutWorker(spec, "w", seed=4)
    model = worker.policies["a"].model
    for fragment_index in range(3):
        a = worker.sample().fragments["a"]
        # [T=4, 2 envs x (a_0, a_1)] cut into [maxSeqLen=2, 2 x 4] sequences
        assert a.obs.shape == (2, 8, 3) and a.state_in.shape == (8, model.state_size)
        firsts = a.obs[0, :, 1] == 0  # a sequence that starts an agent's episode ...
        assert firsts.any() or fragment_index > 0
        assert not a.state_in[firsts].any()  # ... starts from zeros
        for col in range(4):
            # Replaying a sequence's steps from its state gives the next sequence's state,
            # unless that agent's episode ended in between (then it starts from zeros).
            state = torch.from_numpy(a.state_in[col][None])
            with torch.no_grad():
                for t in range(2):
                    _, state = model.act(torch.from_numpy(a.obs[t, col][None]), state)
            ended = bool(a.terminateds[:, col].any() or a.truncateds[:, col].any())
            after = np.zeros_like(a.state_in[4 + col]) if ended else state.numpy()[0]
            assert np.allclose(a.state_in[4 + col], after, atol=1e-6), (fragment_index, col)
        columns_are_trajectories(a.obs[:, :4], {0, 1})


PREV_ACTION_REWARD = {
    **TWO_POLICIES,
    "policies": {
        "a": {"model": {"useLstm": True, "lstmCellSize": 8, "maxSeqLen": 2,
                        "lstmUsePrevActionReward": True}},
        "b": {},
    },
}  # fmt: skip


def test_a_policy_that_takes_its_previous_action_and_reward_is_unrolled_as_it_acted() -> None:
    """lstmUsePrevActionReward for a PettingZoo env: each agent's state takes its own last
    action and reward once the reward is in, so the learner's unroll of a sequence from its
    state, with the column's actions and rewards, gives back exactly the logits it acted by."""
    spec = spec_of(RELAY, multiAgent=PREV_ACTION_REWARD)
    assert job_problem(spec) is None
    worker = RolloutWorker(spec, "w", seed=4)
    model = worker.policies["a"].model
    assert model.uses_prev_action_reward
    carried = []
    for _ in range(3):
        a = worker.sample().fragments["a"]
        done = torch.from_numpy(a.terminateds | a.truncateds)
        resets = torch.cat([done.new_zeros(1, done.shape[1]), done[:-1]])
        with torch.no_grad():
            outputs, _, _ = model.forward_sequence(
                torch.from_numpy(a.obs), torch.from_numpy(a.state_in), resets,
                torch.from_numpy(a.actions), torch.from_numpy(a.rewards),
            )  # fmt: skip
        assert np.allclose(outputs.numpy(), a.behaviour_logits, atol=1e-5)
        carried.extend(a.state_in[:, -1].tolist())
    # The last reward rides in the state: a_0's is 1 at each step, a_1's 2 (Relay); 0 at an
    # episode's start.
    assert set(carried) == {0.0, 1.0, 2.0}
    # Evaluation's games carry them the same way (whole games, as the team).
    evaluator_spec = spec.model_copy(
        update={"evaluation": ImpalaJobSpec.model_validate(
            {"evaluation": {"duration": 2}, "stop": {"timesteps": 1}}).evaluation}
    )  # fmt: skip
    evaluator = Evaluator(evaluator_spec, seed=0)
    result, _ = evaluator.run(worker.get_weights(), 2, False)
    assert result.returns == [34.0, 34.0]
    policy = evaluator.games["a"]
    state = policy.initial_state()
    _, chosen, after = policy.act(np.zeros(3, np.float32), np.random.default_rng(0), False, state)
    assert policy.carry(after, chosen, 2.0)[0, -1] == 2.0


def test_a_recurrent_policy_trains_resumes_and_plays_games(tmp_path: Path) -> None:
    spec = spec_of(RELAY, multiAgent=RECURRENT, stop={"timesteps": 400})
    driver = _run(tmp_path, spec)
    versions = {n: s["policy_version"] for n, s in driver.learner.state_dict()["policies"].items()}
    assert versions["a"] > 0 and versions["b"] > 0
    more = spec.model_copy(update={"stop": spec.stop.model_copy(update={"timesteps": 800})})
    again = _run(tmp_path, more, resume=True).learner.state_dict()["policies"]
    assert again["a"]["policy_version"] > versions["a"]
    policies = load_game_policies(tmp_path / "run")
    assert policies["a"].recurrent and not policies["b"].recurrent
    # The team's game: a_0 7 x 1, a_1 3 x 2, b_0 7 x 3, whatever they play.
    evaluator_spec = spec.model_copy(
        update={"evaluation": ImpalaJobSpec.model_validate(
            {"evaluation": {"duration": 2}, "stop": {"timesteps": 1}}).evaluation}
    )  # fmt: skip
    evaluator = Evaluator(evaluator_spec, seed=0)
    weights = driver.learner.get_weights()
    result, _ = evaluator.run(weights, 2, False)
    assert result.returns == [34.0, 34.0] and result.lengths == [7, 7]


def test_a_custom_recurrent_model_acts_for_a_policy_and_a_broken_one_is_refused(
    tmp_path: Path,
) -> None:
    gru = {"type": "custom", "import": "tests.support.custom_models:GRUActorCritic"}
    custom = {**TWO_POLICIES, "policies": {"a": {}, "b": {"model": gru}}}
    spec = spec_of(RELAY, multiAgent=custom, stop={"timesteps": 200})
    assert job_problem(spec) is None
    driver = _run(tmp_path, spec)
    assert driver.learner.state_dict()["policies"]["b"]["policy_version"] > 0
    broken = {"type": "custom", "import": "tests.support.custom_models:WrongOutputs"}
    wrong = {**TWO_POLICIES, "policies": {"a": {}, "b": {"model": broken}}}
    problem = job_problem(spec_of(RELAY, multiAgent=wrong))
    assert problem is not None and problem[0] == "multiAgent.policies.b.model.import", problem
    assert problem[1].startswith("policy b: WrongOutputs breaks the model interface")


def test_a_policy_not_trained_keeps_its_weights_and_ships_no_steps(tmp_path: Path) -> None:
    frozen = {**TWO_POLICIES, "policiesToTrain": ["a"]}
    spec = spec_of(RELAY, multiAgent=frozen, stop={"timesteps": 400})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"seed": 3})})
    driver = _run(tmp_path, spec)
    state = driver.learner.state_dict()["policies"]
    assert state["a"]["policy_version"] > 0 and state["b"]["policy_version"] == 0
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert not any(k.startswith("b/") for k in status["learner"])
    weights = driver.learner.get_weights()
    fresh = _run(tmp_path / "again", spec).learner.get_weights()
    assert all(np.array_equal(weights[k], fresh[k]) for k in weights if k.startswith("b/"))


TICTACTOE = "pettingzoo.classic.tictactoe_v3"


def test_masked_actions_are_never_sampled() -> None:
    worker = RolloutWorker(spec_of(TICTACTOE, t_len=8, num_envs=4), "w", seed=0)
    for _ in range(5):
        fragment = worker.sample().fragments["default"]
        mask = fragment.action_mask
        assert mask.shape == (8, 8, 9)
        taken = np.take_along_axis(mask, fragment.actions[..., None], axis=2)[..., 0]
        assert taken.all()
        assert (fragment.behaviour_logits[~mask] == MASKED_LOGIT).all()


def test_the_loss_gives_masked_actions_no_probability() -> None:
    # One legal action per step: the masked policy is certain, so its entropy is 0 and the
    # importance weights exactly 1; unmasked, the untrained policy spreads over all 9.
    spec = spec_of(TICTACTOE, t_len=8, num_envs=4)
    worker = RolloutWorker(spec, "w", seed=0)
    fragment = worker.sample().fragments["default"]
    only = np.zeros_like(fragment.action_mask)
    np.put_along_axis(only, fragment.actions[..., None], True, axis=2)
    fragment.action_mask = only
    fragment.behaviour_logits = np.where(only, 0.0, MASKED_LOGIT).astype(np.float32)
    model = policy_models(spec)["default"]
    learner = Learner(LearnerConfig.of(spec), model.obs_shape, model.actions)
    stats = learner.learn_on_batch(concat_fragments([fragment]))
    assert stats["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert stats["mean_rho"] == pytest.approx(1.0)
    fragment.action_mask = no_mask()
    unmasked = Learner(LearnerConfig.of(spec), model.obs_shape, model.actions).learn_on_batch(
        concat_fragments([fragment])
    )
    assert unmasked["entropy"] > 1.0


SELF_PLAY = {
    "policies": {"main": {}},
    "selfPlay": {"policy": "main", "latestProbability": 0.0, "snapshotIntervalTimesteps": 100},
}


def test_against_a_snapshot_only_the_learning_seat_fills_the_policys_lanes() -> None:
    spec = spec_of(TURNS, t_len=4, num_envs=1, kwargs={"moves": 4}, multiAgent=SELF_PLAY)
    worker = RolloutWorker(spec, "w", seed=0)
    weights = worker.get_weights()  # keyed main/<name>
    snapshot = {f"main@0/{k[5:]}": np.zeros_like(v) for k, v in weights.items()}
    worker.set_weights({**weights, **snapshot}, policy_version=1)
    worker.sample()  # the episode in progress was seated before the pool existed
    seen: dict[int, set[int]] = {}
    scores: list[float] = []
    for _ in range(6):
        sample = worker.sample()
        scores += sample.self_play_scores
        obs = sample.fragments["main"].obs
        for t, col in np.ndindex(obs.shape[:2]):
            seen.setdefault(int(obs[t, col, 2]), set()).add(int(obs[t, col, 0]))
    assert seen and all(len(agents) == 1 for episode, agents in seen.items() if episode > 1)
    assert {a for agents in seen.values() for a in agents} == {0, 1}  # both seats, in turn
    # The 4th move wins: the second mover (whoever learns from that seat) always wins.
    assert scores and set(scores) <= {0.0, 1.0}


def test_against_the_random_player_only_the_learning_seat_trains_and_moves_are_legal() -> None:
    play = {**SELF_PLAY, "selfPlay": {"policy": "main", "randomProbability": 1.0}}
    spec = spec_of(TURNS, t_len=4, num_envs=1, kwargs={"moves": 4}, multiAgent=play)
    worker = RolloutWorker(spec, "w", seed=0)
    seen: dict[int, set[int]] = {}
    for _ in range(6):
        sample = worker.sample()
        assert sample.self_play_scores == []  # the pool's score counts snapshot games only
        # The policy's returns are its learning seat's alone: one per episode, not two.
        assert len(sample.policy_returns.get("main", [])) == len(sample.episode_returns)
        obs = sample.fragments["main"].obs
        for t, col in np.ndindex(obs.shape[:2]):
            seen.setdefault(int(obs[t, col, 2]), set()).add(int(obs[t, col, 0]))
    assert seen and all(len(agents) == 1 for agents in seen.values())
    assert {a for agents in seen.values() for a in agents} == {0, 1}

    # On a masked board the random player picks only free squares: every game ends lawfully.
    spec = spec_of(TICTACTOE, t_len=8, num_envs=4, multiAgent=play)
    worker = RolloutWorker(spec, "w", seed=3)
    totals = [r for _ in range(8) for r in worker.sample().episode_returns]
    # A lawful game's returns sum to 0 (won +1 -1, or drawn); PettingZoo ends one at an illegal
    # move with -1 for its mover and 0 for the other.
    assert totals and all(total == 0.0 for total in totals)


def test_the_pool_snapshots_every_interval_and_replaces_the_oldest() -> None:
    spec = spec_of(TURNS, multiAgent=SELF_PLAY)
    model = policy_models(spec)["main"]
    learner = Learner(LearnerConfig.of(spec), model.obs_shape, model.actions)
    pool = SelfPlayPool("main", interval=100, size=2)
    for steps in (50, 100, 150, 200, 320):
        with torch.no_grad():
            next(learner.model.parameters()).fill_(float(steps))
        pool.observe(steps, learner)
    assert pool.taken == 3 and len(pool.snapshots) == 2
    first = next(k for k in pool.snapshots[0] if k.endswith("weight"))
    # Taken at 100, 200 (next due at 300), then 320 replaced the oldest (100's).
    assert pool.snapshots[0][first].flat[0] == 320.0 and pool.snapshots[1][first].flat[0] == 200.0
    assert {k.split("/")[0] for k in pool.weights()} == {"main@0", "main@1"}


def test_self_play_resumes_with_its_pool(tmp_path: Path) -> None:
    play = {**SELF_PLAY, "selfPlay": {**SELF_PLAY["selfPlay"], "latestProbability": 0.5}}
    spec = spec_of(TURNS, multiAgent=play, stop={"timesteps": 600})
    driver = _run(tmp_path, spec)
    pool = driver.learner.state_dict()["self_play"]
    assert pool["taken"] >= 2
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["policies"]["main"]["self_play_games"] > 0
    # The learner trails the sampling by its queue: 3000 samples leave it time to train past
    # the next snapshot.
    more = spec.model_copy(update={"stop": spec.stop.model_copy(update={"timesteps": 3000})})
    resumed = _run(tmp_path, more, resume=True).learner.state_dict()["self_play"]
    assert resumed["taken"] > pool["taken"]


def test_games_against_random_and_a_policy_are_scored_per_seat(tmp_path: Path) -> None:
    spec = spec_of(TURNS, multiAgent=SELF_PLAY, stop={"timesteps": 300}, kwargs={"moves": 4})
    driver = _run(tmp_path, spec)
    job = ImpalaJob.model_validate({"metadata": {"name": "agents"}, "spec": spec.model_dump()})
    policies = load_game_policies(tmp_path / "run")
    assert set(policies) == {"main"} and policies["main"].policy_version > 0
    del driver
    # 4 moves: the second mover always wins, whatever anyone plays; the policy takes each seat
    # in turn, so it wins exactly the half of the games it moves second in.
    results = play_games(job.spec, policies["main"], None, games=10, seed=1)
    assert (results.games, results.wins, results.losses, results.draws) == (10, 5, 5, 0)
    mirror = play_games(job.spec, policies["main"], policies["main"], games=4)
    assert mirror.wins == 2 and mirror.score == 0.5


def test_random_openings_spread_greedy_games_over_many_positions() -> None:
    # Two greedy players replay one game per seat; random opening moves on both sides make
    # them meet in other positions (what `impalajob evaluate --opening N` is for).
    spec = spec_of("pettingzoo.classic.tictactoe_v3", multiAgent={"policies": {"main": {}}})
    torch.manual_seed(0)
    policies = game_policies(spec)
    main, other = policies["main"], game_policies(spec)["main"]

    def outcomes(opening: int) -> set[tuple[float, ...]]:
        results = play_games(spec, main, other, games=40, seed=3, opening=opening)
        assert results.games == 40 and results.returns is not None
        return {tuple(results.returns[seat::2]) for seat in (0, 1)}

    assert all(len(set(per_seat)) == 1 for per_seat in outcomes(0))
    assert all(len(set(per_seat)) > 1 for per_seat in outcomes(2))


def test_evaluation_while_training_scores_games_against_a_fixed_opponent(tmp_path: Path) -> None:
    # 4 moves: the second mover wins whatever anyone plays, and the policy takes each seat in
    # turn: 5 of 10 games won, each won with 0.1 + 1 and lost with 0.1 + 0.1 - 1.
    evaluation = {"intervalTimesteps": 200, "duration": 10, "opponent": "random"}
    spec = spec_of(TURNS, multiAgent=SELF_PLAY, kwargs={"moves": 4}, stop={"timesteps": 600},
                   evaluation=evaluation)  # fmt: skip
    _run(tmp_path, spec)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    ev = status["evaluation"]
    assert ev["evaluations"] >= 1 and (ev["policy"], ev["opponent"]) == ("main", "random")
    assert (ev["wins"], ev["draws"], ev["losses"], ev["win_rate"]) == (5, 0, 5, 0.5)
    assert ev["episode_return_mean"] == pytest.approx(0.15)
    assert ev["policy_return_means"] == {"main": pytest.approx(0.15)}
    assert ev["episode_len_mean"] == 4 and ev["env_steps"] == 40
    # The best round's weights, its policies alone (no self-play pool), for evaluate/export.
    best = load_game_policies(tmp_path / "run", "best")
    assert set(best) == {"main"} and best["main"].source == "best"


def test_evaluation_without_an_opponent_reports_the_team_and_each_policy(tmp_path: Path) -> None:
    # a_0 moves 7 times rewarded 1, a_1 3 times rewarded 2, b_0 7 times rewarded 3.
    evaluation = {"intervalTimesteps": 100, "duration": 4, "numEnvRunners": 2}
    spec = spec_of(RELAY, multiAgent=TWO_POLICIES, stop={"timesteps": 400}, evaluation=evaluation)
    _run(tmp_path, spec)
    ev = json.loads((tmp_path / "run" / "status.json").read_text())["evaluation"]
    assert ev["episodes"] == 4 and ev["episode_return_mean"] == 34.0
    assert ev["policy_return_means"] == {"a": 6.5, "b": 21.0}
    assert ev["opponent"] is None and ev["win_rate"] is None


def test_a_round_of_env_steps_counts_only_the_games_that_end_within_it() -> None:
    evaluation = {"duration": 10, "durationUnit": "timesteps", "opponent": "random"}
    spec = spec_of(TURNS, multiAgent=SELF_PLAY, kwargs={"moves": 4}, evaluation=evaluation)
    evaluator = Evaluator(spec, seed=0)
    model = evaluator.games["main"].model
    weights = {f"main/{k}": v.numpy() for k, v in model.state_dict().items()}
    result, video = evaluator.run({**weights, "main/@version": np.asarray(3)}, 10, False)
    # Two games of 4 moves fit in 10 env steps; the third would end past them.
    assert video is None and (result.wins, result.losses, result.env_steps) == (1, 1, 8)
    assert evaluator.games["main"].policy_version == 3


def test_one_policy_of_a_multi_agent_run_loads_as_a_policy(tmp_path: Path) -> None:
    spec = spec_of(RELAY, multiAgent=TWO_POLICIES, stop={"timesteps": 200})
    _run(tmp_path, spec)
    b = load_policy(tmp_path / "run", policy="b")
    assert b.job.spec.model.hidden == [16] and b.obs_shape == (3,)
    assert load_policy(tmp_path / "run").job.spec.model.hidden == [8]  # the first trained: a
    with pytest.raises(PolicyNotFoundError, match="no policy 'c'"):
        load_policy(tmp_path / "run", policy="c")


def _evaluate_json(capsys: pytest.CaptureFixture[str], run: Path, *flags: str) -> Any:
    from impala_cli.main import main

    code = main(["evaluate", "--run-dir", str(run), "--episodes", "4", "--json", *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_evaluate_plays_a_job_without_an_opponent_as_its_team(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two policies that each play their own agents and no opponent (no selfPlay, no
    spec.evaluation.opponent): `impalajob evaluate` plays every agent by its own policy and
    reports the team's return, as training and spec.evaluation do; it once scored the first
    policy against a random player ("0 wins, 200 draws")."""
    spec = spec_of(RELAY, multiAgent=TWO_POLICIES, stop={"timesteps": 200})
    _run(tmp_path, spec)
    team = _evaluate_json(capsys, tmp_path / "run")
    # Relay's game, whatever is played: a_0 7 x 1, a_1 3 x 2 (policy a), b_0 7 x 3 (policy b).
    assert team["team"] == ["a", "b"] and "opponent" not in team and "wins" not in team, team
    assert team["games"] == 4 and team["episode_return_mean"] == 34.0
    assert team["policy_return_means"] == {"a": 6.5, "b": 21.0}
    assert _evaluate_json(capsys, tmp_path / "run", "--team") == team
    # Scoring one policy against a random player is still there when asked for.
    scored = _evaluate_json(capsys, tmp_path / "run", "--opponent", "random", "--policy", "b")
    assert scored["opponent"] == "random" and scored["policy"] == "b" and scored["games"] == 4
    from impala_cli.main import main

    assert main(["evaluate", "--run-dir", str(tmp_path / "run"), "--team", "--opponent", "a"]) == 2
    assert "a team has no opponent" in capsys.readouterr().err


def test_evaluate_scores_a_self_play_job_against_a_random_player_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_of(TURNS, multiAgent=SELF_PLAY, stop={"timesteps": 300}, kwargs={"moves": 4})
    _run(tmp_path, spec)
    scored = _evaluate_json(capsys, tmp_path / "run")
    # 4 moves: the second mover wins, so a policy taking each seat in turn wins half.
    assert (scored["opponent"], scored["policy"]) == ("random", "main"), scored
    assert (scored["wins"], scored["losses"]) == (2, 2)


def test_a_game_evaluation_records_its_first_game_as_a_video(tmp_path: Path) -> None:
    """spec.evaluation.video for a PettingZoo env: the first game of a round, from the env's
    render_mode="rgb_array" frames, into the run's videos/ and the status' evaluation."""
    evaluation = {"intervalTimesteps": 100, "duration": 3, "opponent": "random", "video": True}
    spec = spec_of(TURNS, multiAgent=SELF_PLAY, stop={"timesteps": 300}, kwargs={"moves": 4},
                   evaluation=evaluation)  # fmt: skip
    assert job_problem(spec) is None
    evaluator = Evaluator(spec, seed=0)
    model = evaluator.games["main"].model
    weights = {f"main/{k}": v.numpy() for k, v in model.state_dict().items()}
    result, video = evaluator.run({**weights, "main/@version": np.asarray(1)}, 3, True)
    assert video is not None and video[0] in (".mp4", ".gif") and len(video[1]) > 100
    assert result.preview is not None and result.wins + result.draws + result.losses == 3
    assert evaluator.run(weights, 3, False)[1] is None  # asked for none, none recorded
    _run(tmp_path, spec)
    ev = json.loads((tmp_path / "run" / "status.json").read_text())["evaluation"]
    assert ev["video"] is not None and (tmp_path / "run" / ev["video"]).stat().st_size > 100
    # An env that cannot render is refused before the job starts, naming the field.
    relay = spec_of(RELAY, multiAgent=TWO_POLICIES, evaluation={"duration": 1, "video": True})
    problem = job_problem(relay)
    assert problem is not None and problem[0] == "evaluation.video" and "render_mode" in problem[1]
