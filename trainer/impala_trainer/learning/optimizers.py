"""The learner's optimisers: torch.optim's Adam and RMSprop, without TorchDynamo's import.

torch.optim wraps `step`, `add_param_group`, `state_dict`, `load_state_dict` and `zero_grad` so
that a `torch.compile`d caller does not trace into them, and each wrapper imports `torch._dynamo`
on its first call: 1.2 CPU-s on the 2-core machine, paid by every process that builds a
learner (its first `add_param_group`: the driver, the learner process, an A3C worker), or at the
first checkpoint (`state_dict`); a local CartPole run took about a second longer for it
(timed from launch to exit). The learner never compiles its optimisers, so these subclasses
call the functions beneath the wrappers (`__wrapped__`, set by functools.wraps), with gradients
off as torch's step wrapper turns them off: the same arithmetic and the same state dicts (a
checkpoint of either loads into the other).
Should a later torch drop `__wrapped__`, they call the wrappers: slower to start, the same
results, and tests/unit/trainer/test_optimizers.py fails to say so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch

_F = TypeVar("_F", bound=Callable[..., Any])


def beneath(fn: _F) -> _F:
    """The function under torch's decorators (functools.wraps' `__wrapped__`), else `fn`."""
    return getattr(fn, "__wrapped__", fn)


class _Eager(torch.optim.Optimizer):
    """Optimizer methods without the dynamo wrappers; a subclass names its step beneath."""

    _step_beneath: ClassVar[Callable[..., Any]]

    add_param_group = beneath(torch.optim.Optimizer.add_param_group)
    state_dict = beneath(torch.optim.Optimizer.state_dict)
    load_state_dict = beneath(torch.optim.Optimizer.load_state_dict)
    zero_grad = beneath(torch.optim.Optimizer.zero_grad)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        # What torch's `_use_grad_for_differentiable` does around the step, less its graph break:
        # no autograd graph for the in-place updates of the parameters and the state.
        with torch.no_grad():
            result: float | None = type(self)._step_beneath(self, closure)
        return result


class Adam(_Eager, torch.optim.Adam):
    _step_beneath = beneath(torch.optim.Adam.step)


class RMSprop(_Eager, torch.optim.RMSprop):
    _step_beneath = beneath(torch.optim.RMSprop.step)
