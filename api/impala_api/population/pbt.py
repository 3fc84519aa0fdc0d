"""Population-based training's decisions, as pure functions of the members' figures.

When a member is ready (`ready`: `readyIntervalTimesteps` env steps since its last decision, and
past `burnInTimesteps`), `decide` says whether it copies another member (exploit) and what its
hyperparameters become (explore). A decision draws from a generator seeded by the population's
seed, the member and the decision's index, so it is the same decision however often it is
computed: a controller that restarts mid-way computes it again and finds it already recorded.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from impala_api.population.paths import Values
from impala_api.population.search import sample
from impala_api.population.spec import ImpalaPopulationSpec, MutationSpec, PbtSpec


@dataclass
class MemberFigures:
    """What a decision reads of one member."""

    name: str
    timesteps: int
    """Env steps it has sampled."""
    readings: list[float] = field(default_factory=list)
    """Its fitness readings (oldest first), since its start or its last exploit."""
    values: Values = field(default_factory=dict)
    """Its live hyperparameters now (`pbt.mutations`' paths)."""
    decisions: int = 0
    """Decisions taken for it so far (the index of its next)."""
    last_decision_timesteps: int = 0
    """Its env steps at its last decision (0 before the first)."""


@dataclass(frozen=True)
class Fitness:
    mean: float
    stderr: float
    """Standard error of the mean over the window's readings (0 with one reading)."""


@dataclass(frozen=True)
class Decision:
    """One member's decision at one ready point."""

    member: str
    index: int
    """The member's decision count at it: `<member>#<index>` names it once."""
    timesteps: int
    fitness: float
    parent: str | None
    """The member it copies (its newest checkpoint), or None: it keeps its own weights."""
    parent_fitness: float | None
    values: Values
    """Its live hyperparameters from now on (its own, when it copies no one)."""
    reason: str

    @property
    def key(self) -> str:
        return f"{self.member}#{self.index}"

    @property
    def exploits(self) -> bool:
        return self.parent is not None


def fitness(pbt: PbtSpec, member: MemberFigures) -> Fitness | None:
    """The mean of its last `fitness.window` readings, or None before its first."""
    window = member.readings[-pbt.fitness.window :]
    if not window:
        return None
    stderr = statistics.stdev(window) / math.sqrt(len(window)) if len(window) > 1 else 0.0
    return Fitness(statistics.fmean(window), stderr)


def ready(pbt: PbtSpec, member: MemberFigures) -> bool:
    """Whether the member is due a decision: past the burn-in, an interval since its last, and
    with a fitness to compare."""
    return (
        member.timesteps >= pbt.burn_in_timesteps
        and member.timesteps - member.last_decision_timesteps >= pbt.ready_interval_timesteps
        and bool(member.readings)
    )


def _beats(pbt: PbtSpec, better: Fitness, worse: Fitness) -> bool:
    """Whether `better` is better by more than the margin and by more than noise."""
    gap = better.mean - worse.mean
    noise = pbt.selection.noise_sigmas * math.hypot(better.stderr, worse.stderr)
    return gap > pbt.selection.margin and gap > noise


def _rng(seed: int, member: MemberFigures) -> random.Random:
    return random.Random(f"{seed}/{member.name}/{member.decisions}")


def _parent(
    pbt: PbtSpec, member: MemberFigures, others: Sequence[MemberFigures], rng: random.Random
) -> tuple[MemberFigures | None, str]:
    """Whom `member` copies, if anyone, and why (in words for the lineage and the Event)."""
    own = fitness(pbt, member)
    assert own is not None  # ready() saw a reading
    scored = [(o, f) for o in others if (f := fitness(pbt, o)) is not None]
    if not scored:
        return None, "no other member has a fitness yet"
    if pbt.selection.method == "tournament":
        other, theirs = rng.choice(scored)
        if _beats(pbt, theirs, own):
            return other, f"{other.name} {theirs.mean:.4g} beat {own.mean:.4g} in a tournament"
        return None, f"kept: {other.name} {theirs.mean:.4g} is not clearly above {own.mean:.4g}"
    ranked = sorted([(member, own), *scored], key=lambda mf: mf[1].mean, reverse=True)
    # Ray Tune's count: the quantile's share rounded up, at most half the population.
    k = min(math.ceil(len(ranked) * pbt.selection.quantile_fraction), len(ranked) // 2)
    bottom = [m.name for m, _ in ranked[len(ranked) - k :]] if k else []
    if member.name not in bottom:
        return None, f"kept: {own.mean:.4g} is not in the bottom {k} of {len(ranked)}"
    other, theirs = rng.choice(ranked[:k])
    if _beats(pbt, theirs, own):
        return other, f"{other.name} {theirs.mean:.4g} (top {k}) over {own.mean:.4g} (bottom {k})"
    return None, f"kept: the top {k}'s {other.name} {theirs.mean:.4g} is not clearly above"


def explore(
    spec: ImpalaPopulationSpec, values: Values, rng: random.Random
) -> Values:
    """The winner's live hyperparameters perturbed, field by field (`pbt.mutations`)."""
    assert spec.pbt is not None
    out = dict(values)
    for path, mutation in spec.pbt.mutations.items():
        if path not in out or rng.random() >= mutation.probability:
            continue
        dist = spec.search.parameters.get(path)
        if dist is not None and rng.random() < mutation.resample_probability:
            new = float(sample(dist, rng))
        else:
            new = float(out[path]) * rng.choice(mutation.factors)
        out[path] = _clipped(new, mutation)
    return out


def _clipped(value: float, mutation: MutationSpec) -> float:
    if mutation.min is not None:
        value = max(value, mutation.min)
    if mutation.max is not None:
        value = min(value, mutation.max)
    return value


def decide(
    spec: ImpalaPopulationSpec, member: MemberFigures, population: Sequence[MemberFigures]
) -> Decision:
    """The decision for a ready `member` (`ready`) among `population` (every member, itself
    included, each with its figures now)."""
    assert spec.pbt is not None
    pbt = spec.pbt
    own = fitness(pbt, member)
    if own is None:
        raise ValueError(f"{member.name} has no fitness reading yet: it is not ready")
    rng = _rng(spec.search.seed, member)
    others = [m for m in population if m.name != member.name]
    parent, reason = _parent(pbt, member, others, rng)
    if parent is None:
        values = dict(member.values)
        parent_fitness = None
    else:
        values = explore(spec, parent.values, rng)
        theirs = fitness(pbt, parent)
        parent_fitness = theirs.mean if theirs else None
    return Decision(
        member=member.name,
        index=member.decisions,
        timesteps=member.timesteps,
        fitness=own.mean,
        parent=None if parent is None else parent.name,
        parent_fitness=parent_fitness,
        values=values,
        reason=reason,
    )
