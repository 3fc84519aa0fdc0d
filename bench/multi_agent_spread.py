"""Cooperative multi-agent learning side by side: MPE's simple_spread (3 agents, one shared
policy), ours against RLlib's IMPALA on its PettingZoo wrapper, the same env, seeds and machine.

Both sides run `manifests/examples/spread.yaml` (its env kwargs, network, fragment length,
batch, lr) for --cap seconds of training, alternating over seeds. The return is the team's (each
episode's rewards summed over its agents) as a 100-episode mean; the table gives it at equal env
steps (the curves are read at each mark) and the env steps each side sampled, with the median
over seeds. Uniformly random actions score about -81.

RLlib's side: `ParallelPettingZooEnv` (RLlib's own wrapper), one policy `shared` for every
agent, `count_steps_by="agent_steps"` so its batch counts agent steps as ours does, the same
workers x envs. On its old API stack: in Ray 2.60 here the new stack's IMPALA with a
MultiAgentEnvRunner sampled nothing (num_env_steps_sampled_lifetime 0 after three train() calls,
although each runner's own sample() returns episodes), so the stack that trains is the peer.

    python bench/multi_agent_spread.py                 # 3 seeds, 150 s each
    python bench/multi_agent_spread.py --runs 1 --cap 60
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    MANIFESTS,
    add_trial_args,
    alternate,
    exit_child,
    is_child,
    load_spec,
    machine_info,
    median,
    point_at_steps,
    report,
    rllib_model_config,
    table,
    write_trial,
)

MANIFEST = "spread"
RANDOM_RETURN = -80.9
"""simple_spread's team return under uniformly random actions (300 episodes, mpe2 1.1)."""
MARKS = (50_000, 100_000, 150_000)
"""Env steps at which the curves are compared."""
ENV_NAME = "bench_simple_spread"


def _rllib_config(spec: Any, seed: int) -> Any:
    from mpe2 import simple_spread_v3
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.rllib.policy.policy import PolicySpec
    from ray.tune.registry import register_env

    register_env(ENV_NAME, lambda cfg: ParallelPettingZooEnv(simple_spread_v3.parallel_env(**cfg)))
    t, env = spec.training, spec.env
    probe = simple_spread_v3.parallel_env(**env.kwargs)
    obs_shape = tuple(probe.observation_space(probe.possible_agents[0]).shape)
    return (
        IMPALAConfig()
        .framework("torch")
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .environment(ENV_NAME, env_config=dict(env.kwargs))
        .env_runners(
            num_env_runners=spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod,
            num_envs_per_env_runner=env.num_envs_per_worker,
            rollout_fragment_length=t.rollout_fragment_length,
        )
        .multi_agent(
            policies={"shared": PolicySpec()},
            policy_mapping_fn=lambda agent_id, *args, **kw: "shared",
            count_steps_by="agent_steps",
        )
        .training(
            train_batch_size=t.train_batch_size,
            lr=t.lr,
            entropy_coeff=t.entropy_coeff_or_default,
            gamma=t.gamma,
            vf_loss_coeff=t.vf_loss_coeff,
            grad_clip=t.grad_clip,
            num_epochs=t.num_sgd_iter,
            model=rllib_model_config(spec, obs_shape, "old"),
        )
        .resources(num_gpus=0)
        .reporting(min_time_s_per_iteration=1, metrics_num_episodes_for_smoothing=100)
        .debugging(seed=seed)
    )


def _rllib_train(spec: Any, seconds: float, seed: int, process_start: float) -> dict[str, Any]:
    import ray

    from rllib_side import _init_ray

    cfg = _rllib_config(spec, seed)
    _init_ray(cfg.num_env_runners)
    algo = cfg.build_algo()
    points: list[list[float | None]] = [[round(time.time() - process_start, 3), 0.0, 0, 0, None]]
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            result = algo.train()
            # The old stack's episode_return_mean is the last 100 episodes' team return.
            ret = result.get("env_runners", {}).get("episode_return_mean")
            ret = None if ret is None or math.isnan(ret) else float(ret)
            points.append([
                round(time.time() - process_start, 3), round(time.perf_counter() - t0, 3),
                float(result.get("num_env_steps_sampled", 0)),
                float(result.get("num_env_steps_trained", 0)), ret,
            ])  # fmt: skip
    finally:
        algo.stop()
        ray.shutdown()
    return {"points": points}


def trial(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed + args.trial_index
    if args.trial == "ours":
        from ours_side import train

        with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
            result = train(
                MANIFESTS / f"{MANIFEST}.yaml", args.overrides, args.cap, stop_return=None,
                seed=seed, process_start=args.trial_started, run_dir=Path(tmp) / "run",
            )  # fmt: skip
    else:
        spec = load_spec(MANIFEST, args.overrides).spec
        result = _rllib_train(spec, args.cap, seed, args.trial_started)
    result["seed"] = seed
    return result


def at_steps(points: list[list[Any]], steps: int) -> float | None:
    """The 100-episode mean return of the first curve point at or past `steps` env steps."""
    point = point_at_steps(points, steps)
    return None if point is None else point[4]


def summarise(trials: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, ts in trials.items():
        runs = [
            {
                "seed": t.get("seed"),
                "env_steps": (t.get("points") or [[0, 0, 0]])[-1][2],
                **{f"return_at_{m}": at_steps(t.get("points", []), m) for m in MARKS},
                "error": t.get("error"),
            }
            for t in ts
        ]
        out[side] = {
            "env_steps": median(r["env_steps"] for r in runs),
            **{f"return_at_{m}": median(r[f"return_at_{m}"] for r in runs) for m in MARKS},
            "runs": runs,
        }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser, sides="ours,rllib")
    parser.add_argument("--cap", type=float, default=150.0, help="training seconds per run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first round")
    args = parser.parse_args(argv)
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    info = machine_info()
    trials = alternate(Path(__file__), args, argv, timeout=args.cap + 400)
    summary = summarise(trials)
    summary.update(cap=args.cap, random_return=RANDOM_RETURN)
    headers = ["side", "env steps", *(f"return @ {m // 1000}K" for m in MARKS)]
    rows = [
        [side, summary[side]["env_steps"], *(summary[side][f"return_at_{m}"] for m in MARKS)]
        for side in trials
    ]
    print(table(headers, rows))
    print(f"random actions: {RANDOM_RETURN}")
    report("multi_agent_spread", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
