"""A population's search: the distributions of its fields' values (`Distribution`), and the values
it draws for each member (`draw_values`), from its seed."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from pydantic import Field, model_validator

from impala_api.population.paths import Values
from impala_api.spec import SpecModel

MAX_MEMBERS = 256
"""Members of one population: a population is one decision loop over its members' status."""
MAX_PARAMETERS = 32


ONE_DISTRIBUTION = (
    "a search parameter sets exactly one of grid, choice, uniform, logUniform, integer"
)
RANGE_ORDER = "a search parameter's range is [low, high] with low < high"
LOG_RANGE_POSITIVE = "a search parameter's logUniform range must be above 0"


class Distribution(SpecModel):
    """How a field's values are drawn: exactly one of the five."""

    grid: list[Any] | None = Field(default=None, min_length=1, max_length=MAX_MEMBERS)
    """Every value, each given to members/points members (all the grid's fields form one
    product grid, as Ray Tune's grid_search)."""

    choice: list[Any] | None = Field(default=None, min_length=1, max_length=1024)
    """One of these values, uniformly at random."""

    uniform: tuple[float, float] | None = None
    """[low, high): uniformly at random."""

    log_uniform: tuple[float, float] | None = None
    """[low, high): uniformly at random in log space (a learning rate over decades)."""

    integer: tuple[int, int] | None = None
    """[low, high]: a whole number, uniformly at random, both ends included."""

    @model_validator(mode="after")
    def _one(self) -> Distribution:
        given = [self.grid, self.choice, self.uniform, self.log_uniform, self.integer]
        if sum(g is not None for g in given) != 1:
            raise ValueError(ONE_DISTRIBUTION)
        for bounds in (self.uniform, self.log_uniform, self.integer):
            if bounds is not None and not bounds[0] < bounds[1]:
                raise ValueError(RANGE_ORDER)
        if self.log_uniform is not None and self.log_uniform[0] <= 0:
            raise ValueError(LOG_RANGE_POSITIVE)
        return self

    @property
    def is_numeric(self) -> bool:
        return self.uniform is not None or self.log_uniform is not None or self.integer is not None


class SearchSpec(SpecModel):
    """How members differ: field paths of the template and their distributions."""

    seed: int = Field(default=0, ge=0)
    """Seed of the draw: the same seed and parameters draw the same members."""

    parameters: dict[str, Distribution] = Field(default_factory=dict, max_length=MAX_PARAMETERS)
    """Field path of the template (`training.lr`, `model.hidden`, `training.seed`) to its
    distribution."""


def grid_points(search: SearchSpec) -> int:
    """The number of points of the search's product grid (1 without a grid)."""
    return math.prod(len(d.grid) for d in search.parameters.values() if d.grid is not None)


def sample(dist: Distribution, rng: random.Random) -> Any:
    """One draw of a random distribution (a grid is walked, not drawn: `draw_values`)."""
    if dist.choice is not None:
        return rng.choice(dist.choice)
    if dist.uniform is not None:
        return rng.uniform(*dist.uniform)
    if dist.log_uniform is not None:
        low, high = dist.log_uniform
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    if dist.integer is not None:
        return rng.randint(*dist.integer)
    raise ValueError("a grid is not drawn at random")


def draw_values(search: SearchSpec, members: int) -> list[Values]:
    """Each member's values: member i takes the product grid's point i mod its size (so every
    point has members / points members), and fresh draws of every random parameter, in the
    order the parameters are listed, from one generator seeded by `search.seed`."""
    grids = {path: d.grid for path, d in search.parameters.items() if d.grid is not None}
    points = list(itertools.product(*grids.values())) or [()]
    rng = random.Random(search.seed)
    out: list[Values] = []
    for i in range(members):
        values = dict(zip(grids, points[i % len(points)], strict=True))
        for path, dist in search.parameters.items():
            if dist.grid is None:
                values[path] = sample(dist, rng)
        out.append({path: values[path] for path in search.parameters})
    return out


