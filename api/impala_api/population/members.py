"""A population's members: their names, the values its search draws for each, and the ImpalaJob
spec each runs. Pure: the operator and `impalajob train` draw the same members from the same
population."""

from __future__ import annotations

from dataclasses import dataclass

from impala_api.population.paths import Values, with_values
from impala_api.population.search import draw_values
from impala_api.population.spec import ImpalaPopulationSpec
from impala_api.spec import ImpalaJobSpec


@dataclass(frozen=True)
class Member:
    index: int
    name: str
    values: Values
    """What the search drew for it."""
    spec: ImpalaJobSpec


def member_name(population: str, index: int) -> str:
    return f"{population}-{index}"


def draw_members(name: str, spec: ImpalaPopulationSpec) -> list[Member]:
    """Every member of population `name`: its name, drawn values and ImpalaJob spec (a valid
    population's members are valid jobs: its spec's validator drew them)."""
    return [
        Member(i, member_name(name, i), values, with_values(spec.template, values))
        for i, values in enumerate(draw_values(spec.search, spec.members))
    ]
