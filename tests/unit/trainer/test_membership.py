"""Elastic membership: `plan`'s decisions, then ElasticMembership with a driver, without Ray."""

from __future__ import annotations

from pathlib import Path

from impala_api.spec import ImpalaJob
from impala_trainer.backend import NodeView
from impala_trainer.driver.actor_manager import ManagedActor, remember_dead
from impala_trainer.driver.impala import ImpalaDriver
from impala_trainer.driver.launch import Wiring, build_driver
from impala_trainer.driver.local_backend import LocalBackend
from impala_trainer.driver.membership import ActorView, plan
from impala_trainer.rundir.writer import RunDir


def node(
    node_id: str, rollout: int = 0, aggregator: int = 0, alive: bool = True, draining: bool = False
) -> NodeView:
    return NodeView(node_id, alive, draining, {"rollout": rollout, "aggregator": aggregator})


def actor(actor_id: str, node_id: str = "", state: str = "healthy", role: str = "rollout"):
    return ActorView(actor_id, role, node_id, state)  # type: ignore[arg-type]


def test_targets_follow_alive_non_draining_units() -> None:
    nodes = [
        node("head"),
        node("r1", rollout=2),
        node("r2", rollout=3, draining=True),
        node("r3", rollout=4, alive=False),
        node("a1", aggregator=1),
    ]
    p = plan(nodes, [])
    assert p.targets == {"rollout": 2, "aggregator": 1}
    # A draining node still counts as a member node until it leaves; a dead one does not.
    assert p.nodes == {"rollout": 2, "aggregator": 1}


def test_actors_on_a_draining_node_are_drained_once() -> None:
    nodes = [node("r1", rollout=1), node("r2", rollout=2, draining=True)]
    actors = [
        actor("rollout-0", "r1"),
        actor("rollout-1", "r2"),
        actor("rollout-2", "r2", state="starting"),
        actor("rollout-3", "r2", state="draining"),
    ]
    p = plan(nodes, actors)
    assert p.drain == ["rollout-1", "rollout-2"]
    assert p.lost == [] and p.cancel == []


def test_actors_of_vanished_nodes_are_lost() -> None:
    nodes = [node("r1", rollout=1), node("r2", rollout=1, alive=False)]
    actors = [actor("rollout-0", "r1"), actor("rollout-1", "r2"), actor("rollout-2", "gone")]
    p = plan(nodes, actors)
    assert p.lost == ["rollout-1", "rollout-2"]
    assert p.drain == []


def test_unplaced_actors_beyond_capacity_are_cancelled_newest_first() -> None:
    nodes = [node("r1", rollout=2)]
    actors = [
        actor("rollout-0", "r1"),
        actor("rollout-1", "", state="starting"),
        actor("rollout-2", "", state="starting"),
        actor("rollout-3", "", state="starting"),
    ]
    p = plan(nodes, actors)
    assert p.targets["rollout"] == 2
    assert p.cancel == ["rollout-3", "rollout-2"]


def test_placed_actors_are_never_cancelled_and_unplaced_wait_for_capacity() -> None:
    nodes = [node("r1", rollout=2), node("a1", aggregator=1)]
    actors = [
        actor("rollout-0", "r1"),
        actor("rollout-1", "", state="starting"),
        actor("aggregator-0", "", state="starting", role="aggregator"),
    ]
    p = plan(nodes, actors)
    assert p.cancel == []


def test_starting_actors_queued_on_a_node_whose_units_are_held_are_cancelled() -> None:
    # After a network cut: the replacements of the cut nodes' actors were queued on a node
    # before the GCS declared the old nodes dead; the nodes rejoined under new ids and got actors
    # of their own. The GCS keeps the queued actor on r1, whose one unit rollout-2 holds.
    nodes = [node("r1", rollout=1), node("r2", rollout=1), node("old", rollout=1, alive=False)]
    actors = [
        actor("rollout-2", "r1"),
        actor("rollout-3", "r2"),
        actor("rollout-4", "r1", state="starting"),
    ]
    p = plan(nodes, actors)
    assert p.cancel == ["rollout-4"] and p.lost == []
    # A starting actor that holds its node's free unit (its constructor running) stays.
    p = plan(nodes, [actor("rollout-2", "r1"), actor("rollout-3", "r2", state="starting")])
    assert p.cancel == []
    # Two queued on a 2-unit node beside one healthy: the newest goes.
    nodes = [node("r1", rollout=2)]
    actors = [
        actor("rollout-0", "r1"),
        actor("rollout-1", "r1", state="starting"),
        actor("rollout-2", "r1", state="starting"),
    ]
    assert plan(nodes, actors).cancel == ["rollout-2"]


def test_dead_actors_are_ignored_and_draining_ones_do_not_count_toward_targets() -> None:
    nodes = [node("r1", rollout=1, draining=True), node("r2", rollout=1)]
    actors = [
        actor("rollout-0", "r1", state="draining"),
        actor("rollout-1", "r9", state="dead"),
        actor("rollout-2", "", state="starting"),
    ]
    p = plan(nodes, actors)
    # rollout-2 is the one actor the remaining capacity (r2) takes: not cancelled.
    assert p.lost == [] and p.drain == [] and p.cancel == []


# -- ElasticMembership with a driver, on the in-process backend ---------------------------------


def _elastic_driver(tmp_path: Path) -> tuple[ImpalaDriver, LocalBackend]:
    job = ImpalaJob.model_validate(
        {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "metadata": {"name": "elastic"},
            "spec": {
                "env": {"id": "CartPole-v1", "numEnvsPerWorker": 2},
                "model": {"type": "mlp", "hidden": [16]},
                # 3 fragments of 2x8 per batch: an aggregator always holds a partial batch.
                "training": {"rolloutFragmentLength": 8, "trainBatchSize": 48},
                "stop": {"timesteps": 10**9},
            },
        }
    )
    backend = LocalBackend(rollout_units=2, aggregator_units=1)
    driver = build_driver(job, RunDir(tmp_path / "run"), backend, Wiring(elastic=True))
    assert isinstance(driver, ImpalaDriver) and driver.membership is not None
    driver.membership.poll_seconds = 0.0
    # The learner thread is not started (its queue keeps what it is fed); _step checks it lives.
    driver.group.threads["default"].is_alive = lambda: True  # type: ignore[attr-defined]
    return driver, backend


def test_actors_follow_the_nodes_and_a_draining_node_hands_over_before_release(
    tmp_path: Path,
) -> None:
    driver, backend = _elastic_driver(tmp_path)
    membership = driver.membership
    assert membership is not None
    membership.tick(driver)  # the node offers 2 rollout units and 1 aggregator unit
    driver.manager.poll()
    assert sorted(driver.manager.actors) == ["aggregator-0", "rollout-0", "rollout-1"]
    for _ in range(4):
        driver._step()  # fragments go through the aggregator to the learner queue
    steps_before = driver.stats.counters.num_env_steps_sampled
    assert steps_before > 0 and all(driver.in_flight(a) for a in ("rollout-0", "rollout-1"))

    backend.draining = True  # the pod got SIGTERM: its raylet is draining
    membership.tick(driver)
    assert {a.state for a in driver.manager.actors.values()} == {"draining"}
    assert not membership._handovers
    # The rollout actors still owe the driver their samples, so they stay until those are in; an
    # aggregator with no batch in flight may hand over its partial batch and go at once.
    assert {"rollout-0", "rollout-1"} <= set(driver.manager.actors)
    driver._step()  # the last results arrive; draining actors are not asked again
    assert not any(driver.in_flight(a) for a in driver.manager.actors)
    membership.tick(driver)  # hand-overs asked for, answered and the actors released
    assert driver.manager.actors == {}
    produced = driver.manager.produced
    assert sum(produced.values()) == driver.stats.counters.num_env_steps_sampled
    assert membership.lost_env_steps == 0
    # Every sampled step is in a batch for the learner or in the local aggregator (the
    # aggregator's partial batch was handed over, not dropped).
    inqueue = driver.group.threads["default"].inqueue  # type: ignore[attr-defined]
    queued = sum(b.env_steps for b in [*driver.ledger.backlog, *inqueue.queue])
    held = sum(f.env_steps for f in driver.local_aggregator.take_pending())
    assert queued + held == driver.stats.counters.num_env_steps_sampled
    members = {m.actor_id: m for m in driver.manager.membership().members}
    assert {m.state for m in members.values()} == {"dead"}
    assert members["rollout-0"].env_steps_produced == members["rollout-0"].env_steps


def test_dead_actors_that_sampled_outlast_those_that_did_not() -> None:
    """status.json lists a few dead actors: those that never delivered a step go first, so the
    listed members' env steps keep adding up to the job's count (each step counted once)."""
    dead: list[ManagedActor] = []
    for i, steps in enumerate([500, 0, 300, 0, 0, 200, 0]):
        actor = ManagedActor(f"rollout-{i}", "rollout", None, seed=i, env_steps=steps)
        dead = remember_dead(dead, actor, keep=4)
    assert [a.actor_id for a in dead] == ["rollout-0", "rollout-2", "rollout-5", "rollout-6"]
    # Past `keep` actors that sampled, the oldest goes, as before.
    for i, steps in enumerate([100, 100], start=7):
        actor = ManagedActor(f"rollout-{i}", "rollout", None, seed=i, env_steps=steps)
        dead = remember_dead(dead, actor, keep=4)
    assert [a.actor_id for a in dead] == ["rollout-2", "rollout-5", "rollout-7", "rollout-8"]
