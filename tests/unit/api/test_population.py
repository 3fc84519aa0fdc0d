"""The ImpalaPopulation kind's pure parts: validation, the search's draw, PBT's decisions."""

from __future__ import annotations

import math
from typing import Any

import pytest

from impala_api.manifest import ManifestError, parse_population
from impala_api.population.members import draw_members
from impala_api.population.paths import live_value, value_paths
from impala_api.population.pbt import Decision, MemberFigures, decide, explore, fitness, ready
from impala_api.population.search import draw_values
from impala_api.population.spec import ImpalaPopulation, ImpalaPopulationSpec


def population(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"members": 4, "template": {"stop": {"timesteps": 100_000}}}
    body.update(spec)
    return {"apiVersion": "impala.dev/v1alpha1", "kind": "ImpalaPopulation",
            "metadata": {"name": "pop"}, "spec": body}  # fmt: skip


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ManifestError) as err:
        parse_population(data)
    return str(err.value)


PAPER = {"readyIntervalTimesteps": 10_000, "burnInTimesteps": 20_000,
         "selection": {"method": "tournament", "margin": 5.0, "noiseSigmas": 0.0},
         "mutations": {"training.lr": {"probability": 0.33},
                       "training.entropyCoeff": {"probability": 0.33}}}  # fmt: skip


def pbt_spec(**pbt: Any) -> ImpalaPopulationSpec:
    return parse_population(population(pbt={**PAPER, **pbt})).spec


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"search": {"parameters": {"training.lrr": {"choice": [1e-3]}}}},
         "training has no field 'lrr'"),
        ({"search": {"parameters": {"training": {"choice": [1]}}}}, "training is a section"),
        ({"search": {"parameters": {"model.hidden": {"uniform": [1, 2]}}}},
         "this field does not hold one; use grid or choice"),
        ({"search": {"parameters": {"training.lr": {"uniform": [2e-3, 1e-3]}}}}, "low < high"),
        ({"search": {"parameters": {"training.lr": {"logUniform": [0, 1e-3]}}}}, "above 0"),
        ({"search": {"parameters": {"training.lr": {"grid": []}}}}, "at least 1 item"),
        ({"search": {"parameters": {"training.lr": {"grid": [1e-3, 1e-4, 1e-5]}}}},
         "(3 points, 4 members)"),
        ({"search": {"parameters": {"training.lr": {"choice": [2.0]}}}},
         "member 0's values make an invalid job: training.lr"),
        ({"members": 0}, "greater than or equal to 1"),
        ({"template": {"stop": {}}}, "spec.template.stop"),
        ({"pbt": {**PAPER, "mutations": {"model.hidden": {}}}}, "only the fields a running"),
        ({"pbt": {**PAPER, "mutations": {"training.gamma": {}}}}, "only the fields a running"),
        ({"pbt": {**PAPER, "mutations": {"training.lr": {"min": 1e-2, "max": 1e-4}}}},
         "min must be below max"),
        ({"pbt": {**PAPER, "mutations": {"training.lr": {"resampleProbability": 0.5}}}},
         "resampleProbability > 0 draws from the field's search distribution"),
        ({"pbt": {**PAPER, "fitness": {"metric": "evaluationReturnMean"}}},
         "needs spec.template.evaluation"),
        ({"template": {"stop": {"timesteps": 1}, "training": {"gradClip": None}},
          "pbt": {**PAPER, "mutations": {"training.gradClip": {}}}}, "is off in spec.template"),
        ({"maxConcurrent": 2, "pbt": PAPER}, "a PBT population's members compare while"),
        ({"members": 1, "pbt": PAPER}, "needs at least 2"),
    ],
)  # fmt: skip
def test_bad_populations_are_refused_naming_the_field(spec: dict[str, Any], says: str) -> None:
    assert says in refused(population(**spec))


def test_a_long_name_leaves_no_room_for_member_names() -> None:
    data = population()
    data["metadata"]["name"] = "p" * 37
    assert "at most 36 characters" in refused(data)


def test_every_search_path_is_a_value_field() -> None:
    paths = set(value_paths())
    assert {"training.lr", "training.optimizer.epsilon", "model.hidden", "env.id"} <= paths
    assert "training" not in paths and "training.optimizer" not in paths


# -- the search ---------------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_members_and_another_seed_others() -> None:
    search = {"seed": 7, "parameters": {"training.lr": {"logUniform": [1e-5, 1e-2]},
                                        "training.seed": {"integer": [0, 9]}}}  # fmt: skip
    first = parse_population(population(search=search)).spec
    again = parse_population(population(search=search)).spec
    other = parse_population(population(search={**search, "seed": 8})).spec
    assert draw_values(first.search, 4) == draw_values(again.search, 4)
    assert draw_values(first.search, 4) != draw_values(other.search, 4)
    for values in draw_values(first.search, 4):
        assert 1e-5 <= values["training.lr"] < 1e-2 and values["training.seed"] in range(10)


def test_a_grid_gives_every_point_the_same_number_of_members() -> None:
    search = {"parameters": {"model.hidden": {"grid": [[64], [32, 32]]},
                             "training.gamma": {"grid": [0.99, 0.999]},
                             "training.lr": {"uniform": [1e-4, 1e-3]}}}  # fmt: skip
    spec = parse_population(population(members=8, search=search)).spec
    members = draw_members("pop", spec)
    points = [(tuple(m.spec.model.hidden), m.spec.training.gamma) for m in members]
    assert sorted(points) == sorted(2 * [((64,), 0.99), ((64,), 0.999), ((32, 32), 0.99),
                                         ((32, 32), 0.999)])  # fmt: skip
    assert [m.name for m in members] == [f"pop-{i}" for i in range(8)]
    assert len({m.spec.training.lr for m in members}) == 8


def test_a_drawn_rate_scales_the_templates_schedule() -> None:
    template = {"stop": {"timesteps": 1},
                "training": {"lr": 1e-3, "lrSchedule": [[0, 1e-3], [1000, 1e-4]]}}  # fmt: skip
    search = {"parameters": {"training.lr": {"choice": [2e-3]}}}
    (member, *_) = draw_members("pop", parse_population(population(
        template=template, search=search)).spec)  # fmt: skip
    assert member.spec.training.lr == 2e-3
    schedule = member.spec.training.lr_schedule
    assert schedule == [(0, pytest.approx(2e-3)), (1000, pytest.approx(2e-4))]


def test_live_values_resolve_what_the_learner_uses() -> None:
    spec = parse_population(population()).spec.template
    assert live_value(spec, "training.entropyCoeff") == 0.01
    assert live_value(spec, "training.optimizer.epsilon") == 1e-8
    assert live_value(spec, "training.lr") == 5e-4


# -- PBT: the paper's rules ---------------------------------------------------------------------


def figures(name: str, readings: list[float], steps: int = 30_000, **kw: Any) -> MemberFigures:
    values = {"training.lr": 1e-3, "training.entropyCoeff": 0.01}
    return MemberFigures(name, steps, readings, kw.pop("values", values), **kw)


def test_a_member_is_ready_after_the_burn_in_and_each_interval() -> None:
    pbt = pbt_spec().pbt
    assert pbt is not None
    assert not ready(pbt, figures("a", [1.0], steps=19_999))  # burn-in
    assert ready(pbt, figures("a", [1.0], steps=20_000))
    assert not ready(pbt, figures("a", [], steps=20_000))  # nothing to compare
    assert not ready(pbt, figures("a", [1.0], steps=25_000, last_decision_timesteps=20_000))
    assert ready(pbt, figures("a", [1.0], steps=30_000, last_decision_timesteps=20_000))


def test_tournament_copies_a_member_more_than_the_margin_better() -> None:
    spec = pbt_spec(selection={"method": "tournament", "margin": 5.0, "noiseSigmas": 0.0})
    loser = figures("a", [10.0])
    # Two members only: the tournament's other is the one other member.
    beaten = decide(spec, loser, [loser, figures("b", [15.5])])
    assert beaten.parent == "b" and beaten.exploits and beaten.fitness == 10.0
    assert beaten.parent_fitness == 15.5 and beaten.key == "a#0"
    close = decide(spec, loser, [loser, figures("b", [14.9])])  # within the 5-point margin
    assert close.parent is None and close.values == loser.values


def test_a_gap_within_the_readings_noise_is_no_reason_to_copy() -> None:
    spec = pbt_spec(selection={"method": "tournament", "margin": 0.0, "noiseSigmas": 2.0})
    noisy = figures("a", [20.5, 23.6, 18.0, 30.0, 12.0])
    better_mean = figures("b", [25.0, 19.0, 28.0, 21.0, 24.0])
    assert decide(spec, noisy, [noisy, better_mean]).parent is None
    steady = figures("a", [20.0, 20.5, 19.5, 20.0, 20.0])
    clearly = figures("b", [30.0, 30.5, 29.5, 30.0, 30.0])
    assert decide(spec, steady, [steady, clearly]).parent == "b"


def test_fitness_is_the_mean_of_the_last_window_readings() -> None:
    pbt = pbt_spec(fitness={"window": 2}).pbt
    assert pbt is not None
    got = fitness(pbt, figures("a", [0.0, 10.0, 20.0]))
    assert got is not None and got.mean == 15.0
    assert got.stderr == pytest.approx(math.sqrt(50.0) / math.sqrt(2))


def test_truncation_bottom_quantile_copies_the_top_quantile() -> None:
    spec = pbt_spec(selection={"method": "truncation", "quantileFraction": 0.25,
                               "noiseSigmas": 0.0})  # fmt: skip
    members = [figures(f"m{i}", [float(i)]) for i in range(8)]  # m7 best, m0 worst
    for m in members:
        got = decide(spec, m, members)
        if m.name in ("m0", "m1"):  # bottom 2 of 8
            assert got.parent in ("m6", "m7"), got
        else:
            assert got.parent is None, got


def test_explore_multiplies_by_a_factor_with_the_fields_probability() -> None:
    spec = pbt_spec(mutations={"training.lr": {"factors": [1.2, 1 / 1.2], "probability": 0.33},
                               "training.entropyCoeff": {"probability": 0.0}})  # fmt: skip
    import random

    rng = random.Random(0)
    changed = 0
    for _ in range(3000):
        out = explore(spec, {"training.lr": 1e-3, "training.entropyCoeff": 0.01}, rng)
        assert out["training.entropyCoeff"] == 0.01
        assert out["training.lr"] in (pytest.approx(1.2e-3), pytest.approx(1e-3 / 1.2), 1e-3)
        changed += out["training.lr"] != 1e-3
    assert 0.30 < changed / 3000 < 0.36


def test_explore_clips_to_the_bounds_and_resamples_from_the_search() -> None:
    search = {"parameters": {"training.lr": {"logUniform": [1e-5, 1e-4]}}}
    spec = parse_population(population(search=search, pbt={**PAPER, "mutations": {
        "training.lr": {"resampleProbability": 1.0}}})).spec  # fmt: skip
    import random

    rng = random.Random(1)
    for _ in range(50):
        assert 1e-5 <= explore(spec, {"training.lr": 0.5}, rng)["training.lr"] < 1e-4
    clipped = pbt_spec(mutations={"training.lr": {"factors": [10.0], "max": 2e-3}})
    assert explore(clipped, {"training.lr": 1e-3}, rng)["training.lr"] == 2e-3


def test_a_decision_is_the_same_however_often_it_is_computed() -> None:
    spec = pbt_spec(selection={"method": "tournament", "margin": 0.0, "noiseSigmas": 0.0})
    members = [figures(f"m{i}", [float(i)], decisions=3) for i in range(6)]
    first = [decide(spec, m, members) for m in members]
    again = [decide(spec, m, members) for m in members]
    assert first == again
    later = [decide(spec, m, members) for m in
             [figures(f"m{i}", [float(i)], decisions=4) for i in range(6)]]  # fmt: skip
    assert [d.index for d in later] == [4] * 6
    assert isinstance(first[0], Decision)


def test_a_winner_takes_the_winners_values_then_explores() -> None:
    spec = pbt_spec(selection={"method": "tournament", "margin": 0.0, "noiseSigmas": 0.0},
                    mutations={"training.lr": {"factors": [2.0], "probability": 1.0}})  # fmt: skip
    loser = figures("a", [0.0], values={"training.lr": 1e-4})
    winner = figures("b", [9.0], values={"training.lr": 1e-3})
    got = decide(spec, loser, [loser, winner])
    assert got.parent == "b" and got.values == {"training.lr": pytest.approx(2e-3)}


def test_the_population_model_round_trips_its_manifest() -> None:
    pop = ImpalaPopulation.model_validate(population(pbt=PAPER))
    assert ImpalaPopulation.model_validate(pop.to_manifest()) == pop
