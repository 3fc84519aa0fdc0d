"""membership.plan: the elastic-membership decisions, without Ray."""

from __future__ import annotations

from impala_trainer.driver.membership import ActorView, NodeView, plan


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
