"""The learner's optimisers: torch.optim's arithmetic and state dicts, without torch._dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

from impala_trainer.learning import optimizers

# (ours, torch's, constructor arguments) as learning/learner.py builds them, and the variants a
# spec can ask for (RMSprop's momentum).
CASES: list[tuple[type[torch.optim.Optimizer], type[torch.optim.Optimizer], dict[str, object]]] = [
    (optimizers.Adam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-8, "fused": True}),
    (optimizers.Adam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-8, "foreach": True}),
    (optimizers.RMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.99, "eps": 0.1,
                                               "momentum": 0.0, "foreach": True}),
    (optimizers.RMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.9, "eps": 0.1,
                                               "momentum": 0.5, "foreach": True}),
]  # fmt: skip
IDS = ["adam-fused", "adam-foreach", "rmsprop", "rmsprop-momentum"]


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _train(
    net: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int = 1
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        for p in net.parameters():
            p.grad = None
        net(x).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), CASES, ids=IDS)
def test_steps_as_torch_optim_does(
    ours: Callable[..., torch.optim.Optimizer],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, object],
) -> None:
    a, b = _net(), _net()
    opt_a, opt_b = ours(a.parameters(), **kwargs), theirs(b.parameters(), **kwargs)
    assert isinstance(opt_a, theirs)  # type: ignore[arg-type]
    got, want = _train(a, opt_a, 5), _train(b, opt_b, 5)
    assert not _same(got, [p.detach() for p in _net().parameters()])  # it did step
    assert _same(got, want)
    assert all(not p.requires_grad or p.grad_fn is None for p in a.parameters())


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), CASES, ids=IDS)
def test_state_dicts_load_either_way(
    ours: Callable[..., torch.optim.Optimizer],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, object],
) -> None:
    """A checkpoint written by torch.optim (before this module) resumes in ours, and back."""
    for first, second in ((theirs, ours), (ours, theirs)):
        net = _net()
        opt = first(net.parameters(), **kwargs)
        _train(net, opt, 3)
        state = opt.state_dict()
        resumed_net, straight_net = _net(), _net()
        resumed_net.load_state_dict(net.state_dict())
        straight_net.load_state_dict(net.state_dict())
        # Copies, as a checkpoint file gives: load_state_dict keeps the tensors it is handed.
        resumed = second(resumed_net.parameters(), **kwargs)
        resumed.load_state_dict(copy.deepcopy(state))
        assert resumed.state_dict()["state"].keys() == state["state"].keys()
        straight = first(straight_net.parameters(), **kwargs)
        straight.load_state_dict(copy.deepcopy(state))
        got = _train(resumed_net, resumed, 3, seed=2)
        assert _same(got, _train(straight_net, straight, 3, seed=2))


def test_closure_is_evaluated_with_gradients() -> None:
    net = _net()
    opt = optimizers.Adam(net.parameters(), lr=1e-2)

    def closure() -> float:
        for p in net.parameters():
            p.grad = None
        loss = net(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        return loss.item()

    with torch.no_grad():
        want = _net()(torch.ones(2, 4)).pow(2).mean().item()
    assert opt.step(closure) == pytest.approx(want)


def test_a_learner_builds_steps_and_checkpoints_without_importing_dynamo() -> None:
    """torch.optim's wrappers import torch._dynamo (1.2 CPU-s on 2 cores) on their first call;
    the learner's optimisers never call them. A fresh interpreter, as a learner process is."""
    script = textwrap.dedent(
        """
        import sys
        import torch
        from impala_trainer.learning.learner import Learner, LearnerConfig
        from tests.support.learner import learner_spec, make_batch
        for spec in (
            learner_spec(separateVfOptimizer=True),
            learner_spec(optimizer={"type": "rmsprop", "momentum": 0.5}),
        ):
            learner = Learner(LearnerConfig.of(spec), (4,), 2)
            learner.learn_on_batch(make_batch())
            learner.load_state_dict(learner.state_dict())
            learner.learn_on_batch(make_batch())
        print("torch._dynamo" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr
