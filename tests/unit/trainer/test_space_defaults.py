"""The defaults that depend on the action space: set where the manifest omits them, each said
with why; what the manifest says stays; discrete spaces get none."""

from __future__ import annotations

from impala_trainer.preflight import job_problem, space_defaults
from tests.support.jobs import make_spec

REACH = {"id": "harness.reach:PointReach-v0"}


def test_a_bare_box_manifest_gets_the_squash_the_surrogate_and_popart() -> None:
    spec, chosen = space_defaults(make_spec(env=REACH))
    assert (spec.model.squash_actions, spec.training.surrogate_clip) == (True, 0.3)
    assert (spec.model.popart, spec.training.entropy_coeff) == (True, 0.001)
    said = "\n".join(map(str, chosen))
    assert "spec.model.squashActions: true (Box actions with finite bounds" in said
    assert "spec.training.surrogateClip: 0.3" in said
    assert "spec.model.popart: true (Box actions: advantages in units of" in said
    assert "spec.training.entropyCoeff: 0.001 (Box actions with PopArt" in said
    assert len(chosen) == 4


def test_what_the_manifest_says_stays_and_discrete_spaces_get_nothing() -> None:
    given = make_spec(env=REACH, model={"squashActions": False, "popart": False},
                      training={"surrogateClip": 0.2, "entropyCoeff": 0.01})  # fmt: skip
    spec, chosen = space_defaults(given)
    assert chosen == [] and spec == given
    # PopArt asked for by name keeps IMPALA's entropy bonus unless it is named too.
    spec, chosen = space_defaults(make_spec(env=REACH, model={"popart": True}))
    assert spec.training.entropy_coeff == 0.01 and "entropyCoeff" not in str(chosen)
    spec, chosen = space_defaults(make_spec(env={"id": "CartPole-v1"}))
    assert chosen == [] and (spec.model.popart, spec.training.entropy_coeff) == (False, 0.01)


def test_popart_is_no_default_where_it_cannot_run() -> None:
    # async-gradients has no V-trace targets to normalise (job.py refuses popart there).
    spec, chosen = space_defaults(make_spec(env=REACH, training={"mode": "async-gradients"}))
    assert (spec.model.popart, spec.training.entropy_coeff) == (False, 0.01)
    assert not any("popart" in str(c) for c in chosen)


def test_an_unbounded_box_is_clipped_and_squashing_it_is_refused_naming_the_field() -> None:
    unbounded = {"id": "harness.reach:UnboundedPointReach-v0"}
    spec, chosen = space_defaults(make_spec(env=unbounded))
    assert spec.model.squash_actions is False
    assert any("an infinite bound" in str(c) for c in chosen)
    problem = job_problem(make_spec(env=unbounded, model={"squashActions": True}))
    assert problem is not None and problem[0] == "model.squashActions", problem
    assert "finite bounds" in problem[1]
