"""The user's code a job names: the module of a `module:Env-vN` id and the wrappers' classes.

Imported in every process that makes the env (`impalajob validate`/`train`, the learner's driver,
each rollout worker), from wherever Python finds it there: an installed package, or PYTHONPATH.
A failure is reported with the field that named it and the import's own reason, so a job that
cannot run is refused before anything starts (`impala_cli.commands.load_job`).
"""

from __future__ import annotations

import importlib
from typing import Any

from impala_api.spec import EnvSpec


class UserCodeError(Exception):
    """Something the job names cannot be imported or used; `field` is its path under spec.env."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def import_module(name: str, field: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as err:  # the user's module may raise anything while it imports
        raise UserCodeError(
            field,
            f"cannot import module {name!r}: {type(err).__name__}: {err}; install the package "
            "that provides it (on a cluster: in the job's image) or put it on PYTHONPATH",
        ) from err


def resolve(path: str, field: str) -> Any:
    """The object `package.module:Name` (or `package.module.Name`) names."""
    module, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    found = getattr(import_module(module, field), attr, None)
    if found is None:
        raise UserCodeError(field, f"module {module!r} has no {attr!r}")
    return found


def import_env_module(env: EnvSpec) -> None:
    """Import the module of a `module:Env-vN` id, which registers the env with gymnasium."""
    if env.module is not None:
        import_module(env.module, "id")


def wrapper_factories(env: EnvSpec) -> list[Any]:
    """The job's wrappers as callables env -> wrapped env, in order, each checked callable."""
    factories = []
    for i, wrapper in enumerate(env.wrappers):
        field = f"wrappers[{i}].import"
        cls = resolve(wrapper.import_path, field)
        if not callable(cls):
            raise UserCodeError(field, f"{wrapper.import_path} is not a class or callable")
        kwargs = dict(wrapper.kwargs)
        factories.append(lambda e, cls=cls, kwargs=kwargs: cls(e, **kwargs))
    return factories
