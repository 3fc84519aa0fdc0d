"""The base of every manifest section (camelCase on the wire, unknown fields refused) and the
schedule type the training fields share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

POLICY_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$"
"""A policy's name (spec.multiAgent.policies' keys): it becomes a metric label, a directory of
the checkpoint and a key of status.json."""


class SpecModel(BaseModel):
    """Base for every manifest section: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        validate_assignment=True,
    )


# A schedule's points are bounded so the CRD's CEL rule on their order stays within the API
# server's cost budget (an unbounded list is estimated at megabytes of points).
MAX_SCHEDULE_POINTS = 1000
Schedule = Annotated[
    list[tuple[Annotated[int, Field(ge=0)], float]], Field(max_length=MAX_SCHEDULE_POINTS)
]


def check_schedule(value: Schedule | None, field: str) -> Schedule | None:
    if value is None:
        return value
    if not value:
        raise ValueError(f"{field} must list at least one [timestep, value] point, or be omitted")
    steps = [step for step, _ in value]
    if steps != sorted(steps) or len(set(steps)) != len(steps):
        raise ValueError(
            f"{field} timesteps must strictly increase, got {steps}; "
            "write points as [[0, start], [N, end], ...]"
        )
    return value
