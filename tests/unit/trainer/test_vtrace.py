"""V-trace against a slow NumPy ground truth written like the paper (Espeholt et al. 2018, eq. 1).

v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t,
delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),
rho_t = min(rho_bar, pi/mu),  c_i = min(1, pi/mu),
pg_adv_s = min(rho_pg_bar, pi/mu) (r_s + gamma_s v_{s+1} - V(x_s)),  v_T = V(x_T).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from impala_trainer.learning import vtrace


def ground_truth(log_rhos, discounts, rewards, values, bootstrap, clip_rho, clip_pg_rho):
    T, B = log_rhos.shape
    rhos = np.exp(log_rhos.astype(np.float64))
    rho_bar = rhos if clip_rho is None else np.minimum(clip_rho, rhos)
    cs = np.minimum(1.0, rhos)
    values_ext = np.concatenate([values, bootstrap[None]], axis=0)
    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                trace = 1.0
                for i in range(s, t):
                    trace *= discounts[i, b] * cs[i, b]
                delta = rho_bar[t, b] * (
                    rewards[t, b] + discounts[t, b] * values_ext[t + 1, b] - values[t, b]
                )
                total += trace * delta
            vs[s, b] = values[s, b] + total
    vs_ext = np.concatenate([vs, bootstrap[None]], axis=0)
    pg_rhos = rhos if clip_pg_rho is None else np.minimum(clip_pg_rho, rhos)
    pg_adv = np.zeros((T, B))
    for s in range(T):
        for b in range(B):
            pg_adv[s, b] = pg_rhos[s, b] * (
                rewards[s, b] + discounts[s, b] * vs_ext[s + 1, b] - values[s, b]
            )
    return vs, pg_adv


def random_inputs(T: int, B: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    log_rhos = rng.uniform(-2.0, 2.0, (T, B))  # both sides of zero: clipping and trace cutting
    discounts = np.where(rng.random((T, B)) < 0.1, 0.0, 0.9)  # some episode ends
    return {
        "log_rhos": log_rhos,
        "discounts": discounts,
        "rewards": rng.standard_normal((T, B)),
        "values": rng.standard_normal((T, B)),
        "bootstrap_value": rng.standard_normal(B),
    }


@pytest.mark.parametrize("T,B", [(1, 1), (5, 3), (13, 7), (32, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("clip", [(1.0, 1.0), (None, None), (0.5, 2.0), (3.0, None)])
def test_matches_ground_truth(T: int, B: int, dtype: torch.dtype, clip) -> None:
    inputs = random_inputs(T, B, seed=T * 100 + B)
    rhos = np.exp(inputs["log_rhos"])
    if T * B >= 15:
        assert (rhos > 1.0).any() and (rhos < 1.0).any()
    expected_vs, expected_pg = ground_truth(
        inputs["log_rhos"],
        inputs["discounts"],
        inputs["rewards"],
        inputs["values"],
        inputs["bootstrap_value"],
        *clip,
    )
    tensors = {k: torch.from_numpy(v).to(dtype) for k, v in inputs.items()}
    out = vtrace.from_importance_weights(
        **tensors, clip_rho_threshold=clip[0], clip_pg_rho_threshold=clip[1]
    )
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert out.vs.dtype == dtype and out.pg_advantages.dtype == dtype
    assert out.vs.shape == (T, B) and out.pg_advantages.shape == (T, B)
    np.testing.assert_allclose(out.vs.double().numpy(), expected_vs, rtol=tol, atol=tol)
    np.testing.assert_allclose(out.pg_advantages.double().numpy(), expected_pg, rtol=tol, atol=tol)


def test_clipping_changes_the_targets() -> None:
    """Guards the test above: with these inputs clipping is not a no-op."""
    inputs = {k: torch.from_numpy(v) for k, v in random_inputs(20, 5, seed=1).items()}
    clipped = vtrace.from_importance_weights(**inputs)
    unclipped = vtrace.from_importance_weights(
        **inputs, clip_rho_threshold=None, clip_pg_rho_threshold=None
    )
    assert not torch.allclose(clipped.vs, unclipped.vs)
    assert not torch.allclose(clipped.pg_advantages, unclipped.pg_advantages)


def test_on_policy_is_n_step_return() -> None:
    """With pi == mu (log_rhos 0) and gamma constant, v_s is the discounted n-step return."""
    T, B, gamma = 6, 2, 0.9
    rng = np.random.default_rng(3)
    rewards, values, bootstrap = (
        rng.standard_normal((T, B)),
        rng.standard_normal((T, B)),
        rng.standard_normal(B),
    )
    out = vtrace.from_importance_weights(
        log_rhos=torch.zeros(T, B, dtype=torch.float64),
        discounts=torch.full((T, B), gamma, dtype=torch.float64),
        rewards=torch.from_numpy(rewards),
        values=torch.from_numpy(values),
        bootstrap_value=torch.from_numpy(bootstrap),
    )
    for s in range(T):
        ret = sum(gamma ** (t - s) * rewards[t] for t in range(s, T)) + gamma ** (T - s) * bootstrap
        np.testing.assert_allclose(out.vs[s].numpy(), ret, rtol=1e-12)


def test_tiny_rho_cuts_the_trace() -> None:
    """A near-zero importance weight at step k stops later TD errors reaching steps <= k-1."""
    T, B = 5, 1
    base = {k: torch.from_numpy(v) for k, v in random_inputs(T, B, seed=5).items()}
    base["discounts"] = torch.full((T, B), 0.9, dtype=torch.float64)
    base["log_rhos"] = torch.zeros(T, B, dtype=torch.float64)
    base["log_rhos"][2] = -50.0  # c_2 ~ 0
    changed = dict(base)
    changed["rewards"] = base["rewards"].clone()
    changed["rewards"][3:] += 10.0
    a = vtrace.from_importance_weights(**base)
    b = vtrace.from_importance_weights(**changed)
    torch.testing.assert_close(a.vs[:3], b.vs[:3])  # cut at 2: steps 0..2 do not see rewards 3..
    assert not torch.allclose(a.vs[3:], b.vs[3:])


def test_no_grad_and_signature() -> None:
    params = list(inspect.signature(vtrace.from_importance_weights).parameters)
    assert params == [
        "log_rhos",
        "discounts",
        "rewards",
        "values",
        "bootstrap_value",
        "clip_rho_threshold",
        "clip_pg_rho_threshold",
    ]
    inputs = {k: torch.from_numpy(v).requires_grad_() for k, v in random_inputs(4, 3, 0).items()}
    out = vtrace.from_importance_weights(**inputs)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_from_logits_matches_importance_weights(dtype: torch.dtype) -> None:
    T, B, A = 7, 4, 5
    rng = np.random.default_rng(11)
    behaviour = rng.standard_normal((T, B, A))
    target = rng.standard_normal((T, B, A))
    actions = rng.integers(0, A, (T, B))
    inputs = random_inputs(T, B, seed=2)
    del inputs["log_rhos"]

    def log_softmax_np(x: np.ndarray) -> np.ndarray:
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    idx = actions[..., None]
    target_lp = np.take_along_axis(log_softmax_np(target), idx, -1)[..., 0]
    behaviour_lp = np.take_along_axis(log_softmax_np(behaviour), idx, -1)[..., 0]

    target_t = torch.from_numpy(target).to(dtype).requires_grad_()
    out = vtrace.from_logits(
        behaviour_policy_logits=torch.from_numpy(behaviour).to(dtype),
        target_policy_logits=target_t,
        actions=torch.from_numpy(actions),
        **{k: torch.from_numpy(v).to(dtype) for k, v in inputs.items()},
    )
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(out.target_action_log_probs.detach().double(), target_lp, atol=tol)
    np.testing.assert_allclose(out.behaviour_action_log_probs.double(), behaviour_lp, atol=tol)
    np.testing.assert_allclose(out.log_rhos.double(), target_lp - behaviour_lp, atol=tol)
    expected_vs, expected_pg = ground_truth(
        target_lp - behaviour_lp,
        inputs["discounts"],
        inputs["rewards"],
        inputs["values"],
        inputs["bootstrap_value"],
        1.0,
        1.0,
    )
    np.testing.assert_allclose(out.vs.double(), expected_vs, atol=tol)
    np.testing.assert_allclose(out.pg_advantages.double(), expected_pg, atol=tol)
    assert out.vs.dtype == dtype
    # The policy-gradient term differentiates through the target log-probs.
    assert out.target_action_log_probs.requires_grad and not out.vs.requires_grad
