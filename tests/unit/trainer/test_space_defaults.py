"""The defaults that depend on the action space: set where the manifest omits them, each said
with why; what the manifest says stays; discrete spaces get none."""

from __future__ import annotations

from impala_trainer.preflight import job_problem, space_defaults
from tests.support.jobs import make_spec

REACH = {"id": "harness.reach:PointReach-v0"}


def test_a_bare_box_manifest_gets_the_squash_and_the_surrogate() -> None:
    spec, chosen = space_defaults(make_spec(env=REACH))
    assert (spec.model.squash_actions, spec.training.surrogate_clip) == (True, 0.3)
    said = "\n".join(map(str, chosen))
    assert "spec.model.squashActions: true (Box actions with finite bounds" in said
    assert "spec.training.surrogateClip: 0.3" in said and len(chosen) == 2


def test_what_the_manifest_says_stays_and_discrete_spaces_get_nothing() -> None:
    given = make_spec(env=REACH, model={"squashActions": False},
                      training={"surrogateClip": 0.2})  # fmt: skip
    spec, chosen = space_defaults(given)
    assert chosen == [] and spec == given
    cartpole = make_spec(env={"id": "CartPole-v1"})
    assert space_defaults(cartpole) == (cartpole, [])


def test_an_unbounded_box_is_clipped_and_squashing_it_is_refused_naming_the_field() -> None:
    unbounded = {"id": "harness.reach:UnboundedPointReach-v0"}
    spec, chosen = space_defaults(make_spec(env=unbounded))
    assert spec.model.squash_actions is False
    assert any("an infinite bound" in str(c) for c in chosen)
    problem = job_problem(make_spec(env=unbounded, model={"squashActions": True}))
    assert problem is not None and problem[0] == "model.squashActions", problem
    assert "finite bounds" in problem[1]
