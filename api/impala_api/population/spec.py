"""The ImpalaPopulation resource: a template ImpalaJob, how many members run it, how they differ
(a search) and how they learn from each other (population-based training).

Members are ImpalaJobs named `<population>-<i>`. A search draws each member's values once, from
its seed, so the same population is drawn again. PBT (Jaderberg et al. 2017, as the IMPALA
paper ran it) then lets a member that is ready, after `readyIntervalTimesteps` more env steps,
compare itself with the others: a loser copies a winner's newest checkpoint (exploit) and
perturbs the winner's hyperparameters (explore), in its running learner.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from impala_api.population.paths import LIVE_FIELDS, field_at, is_numeric, live_value, with_values
from impala_api.population.search import MAX_MEMBERS, SearchSpec, draw_values, grid_points
from impala_api.spec import SpecModel
from impala_api.spec.job import ImpalaJobSpec, ObjectMeta

POPULATION_KIND = "ImpalaPopulation"
POPULATION_PLURAL = "impalapopulations"
MAX_POPULATION_NAME_LENGTH = 36
"""A member is `<population>-<i>` (at most 4 more characters), an ImpalaJob name of at most 40."""

GRID_MEMBERS = (
    "spec.members must be a multiple of the search grid's points (each point gets the same "
    "number of members)"
)
MUTATION_NOT_LIVE = (
    "spec.pbt.mutations may name only the fields a running learner takes at its next update: "
    + ", ".join(LIVE_FIELDS)
)
MUTATION_BOUNDS = "spec.pbt.mutations: min must be below max"
RESAMPLE_NEEDS_SEARCH = (
    "spec.pbt.mutations: resampleProbability > 0 draws from the field's search distribution; "
    "give the field one in spec.search.parameters, or set resampleProbability to 0"
)
FITNESS_NEEDS_EVALUATION = (
    "spec.pbt.fitness.metric evaluationReturnMean needs spec.template.evaluation"
)
PBT_NEEDS_VTRACE = (
    "spec.pbt needs spec.template.training.mode vtrace: async-gradients computes its gradients "
    "in the rollout workers, whose hyperparameters a running job cannot change"
)
PBT_TOGETHER = (
    "spec.maxConcurrent: a PBT population's members compare while they run, so they run "
    "together; omit maxConcurrent (or set it to spec.members)"
)


class SelectionSpec(SpecModel):
    """Who copies whom, when a member is ready."""

    method: Literal["tournament", "truncation"] = "tournament"
    """tournament (the IMPALA paper's): the ready member meets one other member at random and
    copies it when that member's fitness is more than `margin` higher. truncation (Ray Tune's
    PBT, Katib's truncationThreshold): a ready member in the bottom quantileFraction copies a
    member of the top quantileFraction at random."""

    margin: float = Field(default=0.0, ge=0.0)
    """tournament: how much higher the other's fitness must be (the paper: 5 points of
    human-normalised score). truncation: the least gap between the two."""

    quantile_fraction: float = Field(default=0.25, gt=0.0, le=0.5)
    """truncation: the fraction of the population at the bottom (copies) and at the top (is
    copied), as Ray Tune's quantile_fraction."""

    noise_sigmas: float = Field(default=2.0, ge=0.0)
    """A gap within noise is no reason to copy: the gap must also exceed this many standard
    errors of the two fitness means (each over its window's readings). 0 compares means only."""


class MutationSpec(SpecModel):
    """How one live hyperparameter changes after an exploit (explore)."""

    factors: list[float] = Field(default_factory=lambda: [1.2, 1 / 1.2], min_length=1,
                                 max_length=16)  # fmt: skip
    """The value is multiplied by one of these, at random (the paper: 1.2 or 1/1.2; Ray Tune's
    default is 1.2 or 0.8)."""

    probability: float = Field(default=1.0, ge=0.0, le=1.0)
    """The chance the field changes at all (the paper: 0.33); otherwise the winner's value is
    kept as it is."""

    resample_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    """The chance a change draws anew from the field's search distribution instead of
    multiplying (Ray Tune's resample_probability)."""

    min: float | None = None
    """The least value a change may reach (clipped to it)."""

    max: float | None = None
    """The greatest value a change may reach (clipped to it)."""

    @model_validator(mode="after")
    def _bounds(self) -> MutationSpec:
        if self.min is not None and self.max is not None and not self.min < self.max:
            raise ValueError(MUTATION_BOUNDS)
        if any(f <= 0 for f in self.factors):
            raise ValueError("spec.pbt.mutations: factors must be above 0")
        return self


class FitnessSpec(SpecModel):
    """What a member is judged by."""

    metric: Literal["episodeReturnMean", "evaluationReturnMean"] = "episodeReturnMean"
    """The status figure: the training return (its last 100 episodes' mean) or the latest
    evaluation's (the template needs spec.evaluation)."""

    window: int = Field(default=5, ge=1, le=1000)
    """Readings averaged: the last `window` values the member reported since its last exploit
    (a member's fitness is its own, not its parent's)."""


class PbtSpec(SpecModel):
    """Population-based training: exploit and explore while the members run."""

    ready_interval_timesteps: int = Field(ge=1)
    """Env steps a member samples between two of its decisions (Ray Tune's
    perturbation_interval, counted in env steps)."""

    burn_in_timesteps: int = Field(default=0, ge=0)
    """Env steps before a member's first decision: early fitness says little."""

    selection: SelectionSpec = Field(default_factory=SelectionSpec)
    """Who copies whom."""

    mutations: dict[str, MutationSpec] = Field(min_length=1, max_length=len(LIVE_FIELDS))
    """Live field path (`training.lr`, `training.entropyCoeff`, ...) to how it changes."""

    fitness: FitnessSpec = Field(default_factory=FitnessSpec)
    """What members are compared by."""

    @model_validator(mode="after")
    def _live(self) -> PbtSpec:
        for path in self.mutations:
            if path not in LIVE_FIELDS:
                raise ValueError(f"{MUTATION_NOT_LIVE} (got {path!r})")
        return self


class ImpalaPopulationSpec(SpecModel):
    """A population of ImpalaJobs: one template, drawn apart by a search, trained by PBT."""

    template: ImpalaJobSpec
    """Every member's ImpalaJob spec before its search values are set (a valid ImpalaJob
    spec)."""

    members: int = Field(ge=1, le=MAX_MEMBERS)
    """How many ImpalaJobs: `<population>-0` .. `<population>-<members-1>`."""

    max_concurrent: int | None = Field(default=None, ge=1, le=MAX_MEMBERS)
    """A sweep's members training at once (omitted: all), locally and on a cluster (the others
    wait, in order). A PBT population's members compare while they run, so it runs them all."""

    search: SearchSpec = Field(default_factory=SearchSpec)
    """How the members differ."""

    pbt: PbtSpec | None = None
    """Population-based training (omitted: the members train apart, a sweep)."""

    @model_validator(mode="after")
    def _search(self) -> ImpalaPopulationSpec:
        for path, dist in self.search.parameters.items():
            try:
                field_at(path)
            except ValueError as err:
                raise ValueError(f"spec.search.parameters: {err}") from None
            if dist.is_numeric and not is_numeric(path):
                raise ValueError(
                    f"spec.search.parameters.{path}: uniform, logUniform and integer draw "
                    "numbers, and this field does not hold one; use grid or choice"
                )
        points = grid_points(self.search)
        if self.members % points:
            raise ValueError(f"{GRID_MEMBERS} ({points} points, {self.members} members)")
        for i, values in enumerate(draw_values(self.search, self.members)):
            try:
                with_values(self.template, values)
            except ValueError as err:
                why = f"spec.search: member {i}'s values make an invalid job: {err}"
                raise ValueError(why) from None
        return self

    @model_validator(mode="after")
    def _pbt(self) -> ImpalaPopulationSpec:
        if self.pbt is None:
            return self
        for path, mutation in self.pbt.mutations.items():
            dist = self.search.parameters.get(path)
            if mutation.resample_probability > 0 and (dist is None or dist.grid is not None):
                raise ValueError(f"{RESAMPLE_NEEDS_SEARCH} (for {path})")
            if live_value(self.template, path) is None:
                raise ValueError(
                    f"spec.pbt.mutations: {path} is off in spec.template (null): there is no "
                    "value to change; give it one"
                )
        evaluated = self.template.evaluation is not None
        if self.pbt.fitness.metric == "evaluationReturnMean" and not evaluated:
            raise ValueError(FITNESS_NEEDS_EVALUATION)
        if self.members < 2:
            raise ValueError("spec.members: population-based training needs at least 2")
        if self.template.training.mode != "vtrace":
            raise ValueError(PBT_NEEDS_VTRACE)
        if self.max_concurrent not in (None, self.members):
            raise ValueError(PBT_TOGETHER)
        return self


class ImpalaPopulation(BaseModel):
    """An ImpalaPopulation manifest (impala.dev/v1alpha1)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["impala.dev/v1alpha1"] = Field(
        default="impala.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["ImpalaPopulation"] = "ImpalaPopulation"
    metadata: ObjectMeta
    spec: ImpalaPopulationSpec
    status: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _name(self) -> ImpalaPopulation:
        if len(self.metadata.name) > MAX_POPULATION_NAME_LENGTH:
            raise ValueError(
                f"metadata.name: at most {MAX_POPULATION_NAME_LENGTH} characters (a member is "
                f"<name>-<i>, an ImpalaJob name of at most 40)"
            )
        return self

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude={"status"})
