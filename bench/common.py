"""Shared benchmark harness: alternating trials, medians, the table, the JSON line, the machine.

Every scenario script runs ours and RLlib's IMPALA alternately (A B A B ...) in ONE invocation.
Each trial is a fresh child process (`script --trial SIDE ...`) so neither side inherits the other's
Ray instance, threads or heap; the child writes one JSON result the parent collects. The machine
is shared and noisy, so a number is only reported as a median over trials together with the
ratio against the peer measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
LOG_DIR = RESULTS_DIR / "logs"
POINT_FIELDS = ("t", "train_t", "sampled", "trained", "return_mean")
"""A curve point: seconds since the trial process was launched, seconds on the side's own training
clock, env steps sampled, env steps trained (None where the side does not report it), and the
100-episode return mean (None before the first episode ends)."""
SIDES = ("ours", "rllib", "rllib_old")
"""ours; RLlib IMPALA on its new API stack (the pinned peer); RLlib on its old API stack."""


# -- the machine ------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def _gpu_models() -> list[str]:
    """NVIDIA GPUs as the driver names them, read without importing torch (the parent is light)."""
    models = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
    return models


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def _git_revision() -> str:
    """The commit the trainer ran at (+dirty when trainer/ has uncommitted changes)."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "trainer"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "-"
    return f"{rev}+dirty" if rev and dirty else (rev or "-")


TRAINER_PACKAGES = ("ray", "torch", "gymnasium", "ale-py", "numpy")
"""The versions a trainer scenario records (both sides run on them)."""
PACKAGE_LABELS = {"ray": "Ray", "fastapi": "FastAPI", "ale_py": "ale-py",
                  "prometheus_client": "prometheus-client"}  # fmt: skip
"""How machine_line names a package (its key otherwise)."""


def machine_info(packages: Sequence[str] = TRAINER_PACKAGES) -> dict[str, Any]:
    """CPU model, cores, RAM, load, our git revision and the versions of `packages` (keyed by
    their distribution name with `-` as `_`: `ale-py` -> `ale_py`)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "git": _git_revision(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "ram_gib": round(_ram_gib(), 1),
        "gpus": _gpu_models(),
        "load_avg": [round(x, 2) for x in load],
        "python": platform.python_version(),
        **{dist.replace("-", "_"): _version(dist) for dist in packages},
    }


_NOT_VERSIONS = {"git", "cpu", "cores", "ram_gib", "gpus", "load_avg", "python"}


def hardware_line(m: dict[str, Any]) -> str:
    """`cpu, N cores[, gpus][, R GiB RAM]`."""
    gpus = "".join(f", {g}" for g in m.get("gpus", []))
    ram = f", {m['ram_gib']:.0f} GiB RAM" if m.get("ram_gib") else ""
    return f"{m.get('cpu', 'unknown cpu')}, {m.get('cores', '?')} cores{gpus}{ram}"


def software_line(m: dict[str, Any]) -> str:
    """`Python x, Ray y, torch z, ...`: every version the record holds."""
    versions = [f"{PACKAGE_LABELS.get(k, k)} {v}" for k, v in m.items() if k not in _NOT_VERSIONS]
    return ", ".join([f"Python {m.get('python', '?')}", *versions])


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One line for the doc: `cpu, N cores, R GiB RAM, load a/b/c; Python, Ray, ...; trainer at`."""
    m = info or machine_info()
    load = "/".join(f"{x:.1f}" for x in m["load_avg"])
    return f"{hardware_line(m)}, load {load}; {software_line(m)}; trainer at {m.get('git', '-')}"


# -- trials -----------------------------------------------------------------------------------


def add_trial_args(
    parser: argparse.ArgumentParser, sides: str = "ours,rllib", runs: int = 3
) -> None:
    """Options every scenario script shares (the parent passes them on to each child)."""
    parser.add_argument("--runs", type=int, default=runs, help="trials per side (alternating)")
    parser.add_argument(
        "--sides", default=sides, help=f"comma list, in order, from {', '.join(SIDES)}"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a manifest field for BOTH sides, e.g. --set env.numEnvsPerWorker=32",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write results here")
    # Internal: set by the parent when it starts a child for one trial.
    parser.add_argument("--trial", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--trial-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--trial-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trial-started", type=float, default=0.0, help=argparse.SUPPRESS)


def child_argv(argv: Sequence[str]) -> list[str]:
    """The parent's argv minus the options only the parent uses."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--runs", "--sides", "--json-out"):
            skip = True
            continue
        if arg.startswith(("--runs=", "--sides=", "--json-out=")):
            continue
        out.append(arg)
    return out


def run_child(
    script: Path, side: str, index: int, argv: Sequence[str], timeout: float
) -> dict[str, Any]:
    """Run one trial in a fresh interpreter; its JSON result (or an error record).

    The child's output goes to bench/results/logs/SCRIPT-SIDE-INDEX.log (not committed).
    """
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{script.stem}-{side}-{index}.log"
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, log_path.open("w") as log:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(script),
            *child_argv(argv),
            "--trial",
            side,
            "--trial-index",
            str(index),
            "--trial-out",
            str(out),
            "--trial-started",
            repr(time.time()),
        ]
        env = {**os.environ, "PYTHONPATH": _pythonpath()}
        started = time.time()
        try:
            proc = subprocess.run(
                cmd, env=env, timeout=timeout, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {timeout:.0f} s"
        if not out.exists():
            return {"side": side, "index": index, "error": f"{rc}: {_last_error(log_path)}"}
        result = json.loads(out.read_text())
        if rc != 0:  # it wrote (partial) results before dying: keep them, note the exit
            result["exit"] = f"{rc}: {_last_error(log_path)}"
        result.update(side=side, index=index, process_seconds=round(time.time() - started, 1))
        return result


def _last_error(log_path: Path) -> str:
    """The most telling line of a failed child's log: its last exception line, else its tail."""
    lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.split(":", 1)[0].endswith(("Error", "Exception", "Timeout")):
            return ln[:500] + f" (log: {log_path.relative_to(REPO)})"
    return (lines[-1][:500] if lines else "no output") + f" (log: {log_path.relative_to(REPO)})"


def _pythonpath() -> str:
    parts = [str(REPO / "trainer"), str(REPO / "bench")]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def alternate(
    script: Path,
    args: argparse.Namespace,
    argv: Sequence[str],
    timeout: float,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run `args.runs` rounds of one trial per side, sides in `args.sides` order (A B A B ...)."""
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for i in range(args.runs):
        for side in sides:
            log(f"[{time.strftime('%H:%M:%S')}] round {i + 1}/{args.runs}: {side} ...")
            r = run_child(script, side, i, argv, timeout)
            if "error" in r:
                log(f"    {side} failed: {r['error']}")
            results[side].append(r)
    return results


def write_trial(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Child side: write this trial's result (so far) for the parent, atomically."""
    tmp = args.trial_out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, args.trial_out)


def exit_child() -> None:
    """End a child at once once its result is written.

    Ray's and RLlib's daemon threads (learner threads blocked in queue.get, the core worker)
    sometimes abort the interpreter's teardown; the result is already on disk by then.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- statistics and output --------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None (None when there are none)."""
    vs = [float(v) for v in values if v is not None]
    return statistics.median(vs) if vs else None


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1) of `values`: the smallest value with at least a
    q share of the values at or below it (q=1: the largest)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(value: Any, digits: int = 1) -> str:
    """Table cell: numbers with thousands separators, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int | Sequence[int] = 1
) -> str:
    """A GitHub-markdown table (readable in a terminal too); `digits` as in fmt, for every
    column or one per column."""
    per_column = [digits] * len(headers) if isinstance(digits, int) else list(digits)
    cells = [[fmt(c, d) for c, d in zip(row, per_column, strict=True)] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    # Numbers right-aligned, text left-aligned (the markdown alignment markers say the same).
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    marks = [
        "-" * (w + 1) + ":" if n else "-" * (w + 2) for w, n in zip(widths, numeric, strict=True)
    ]
    sep = "|" + "|".join(marks) + "|"
    body = [
        "| "
        + " | ".join(
            c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, numeric, strict=True)
        )
        + " |"
        for r in cells
    ]
    return "\n".join([line, sep, *body])


def report(
    scenario: str,
    summary: dict[str, Any],
    trials: dict[str, list[dict[str, Any]]],
    info: dict[str, Any],
    args: argparse.Namespace,
    argv: Sequence[str],
) -> dict[str, Any]:
    """Print the machine line and the one JSON line; save the full record under bench/results."""
    record = {
        "scenario": scenario,
        "command": "python " + " ".join([f"bench/{Path(sys.argv[0]).name}", *argv]),
        "machine": info,
        "machine_end_load": [round(x, 2) for x in os.getloadavg()],
        "summary": summary,
        "trials": trials,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"machine: {machine_line(info)}")
    print(json.dumps({"scenario": scenario, **summary, "machine": machine_line(info)}))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{scenario}.json").write_text(json.dumps(record, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(record, indent=1))
    return record


def is_child(args: argparse.Namespace) -> bool:
    return args.trial is not None


def quiet_ray_logs() -> None:
    """Keep RLlib/Ray chatter off the child's stderr (the parent shows only failures)."""
    import logging
    import warnings

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.rllib", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)


# -- the peer's pinned config -----------------------------------------------------------------

ATARI_ENV = "bench_atari"
SYNTHETIC_ENV = "bench_synthetic"


def rllib_model_config(spec: Any, obs_shape: tuple[int, ...], stack: str) -> Any:
    """RLlib's model config with the same layers as ours (impala_trainer.learning.models).

    MLP: separate policy and value towers of `model.hidden` (our MLPActorCritic is exactly RLlib's
    fcnet with vf_share_layers=False). CNN: conv 16x8x8/4 and 32x4x4/2 (valid padding), then a
    256-wide fully connected layer written as a 9x9 valid convolution over the 9x9x32 map (the
    same weights as a Linear(2592, 256)), shared by the policy and value heads.
    """
    cnn = spec.model.type == "cnn" or (spec.model.type == "auto" and len(obs_shape) == 3)
    hidden = list(spec.model.hidden)
    if stack == "new":
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        if cnn:
            return DefaultModelConfig(
                conv_filters=[
                    [16, 8, 4, "valid"],
                    [32, 4, 2, "valid"],
                    [hidden[-1], 9, 1, "valid"],
                ],
                conv_activation="relu",
                head_fcnet_hiddens=[],
                vf_share_layers=True,
            )
        return DefaultModelConfig(
            fcnet_hiddens=hidden,
            fcnet_activation=spec.model.activation,
            head_fcnet_hiddens=[],
            vf_share_layers=False,
        )
    if cnn:
        # The old stack's VisionNet pads "same" before its last layer: 84 -> 21 -> 11, so the
        # 256 "fc" is an 11x11 valid convolution there (RLlib's own 84x84 default).
        return {
            "conv_filters": [[16, [8, 8], 4], [32, [4, 4], 2], [hidden[-1], [11, 11], 1]],
            "conv_activation": "relu",
        }
    return {
        "fcnet_hiddens": hidden,
        "fcnet_activation": spec.model.activation,
        "vf_share_layers": False,
    }


def register_bench_envs() -> None:
    """Register the Atari creator (RLlib's own new-stack Atari wrapper) and the synthetic env."""
    from ray.tune.registry import register_env

    def atari(cfg: dict[str, Any]) -> Any:
        import ale_py
        import gymnasium as gym
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        gym.register_envs(ale_py)
        # Frame skipping is the wrapper's (max over the last frames), as in ours.
        base = gym.make(cfg["id"], frameskip=1, repeat_action_probability=0.25)
        return wrap_atari_for_new_api_stack(
            base, dim=84, frameskip=cfg["frame_skip"], framestack=cfg["frame_stack"]
        )

    def synthetic(cfg: dict[str, Any]) -> Any:
        from synthetic_env import SyntheticEnv

        return SyntheticEnv(tuple(cfg["shape"]), cfg["dtype"], cfg["num_actions"])

    register_env(ATARI_ENV, atari)
    register_env(SYNTHETIC_ENV, synthetic)


def rllib_config(
    spec: Any,
    *,
    stack: str = "new",
    seed: int | None = 0,
    sample_only: bool = False,
    env_runners: int | None = None,
    synthetic: tuple[tuple[int, ...], str, int] | None = None,
    num_sgd_iter: int | None = None,
    algo: str = "impala",
) -> Any:
    """RLlib's IMPALAConfig pinned to the ImpalaJob spec ours runs (same env, sizes, lr, ...).

    Every value that matters to the comparison is set explicitly, so an RLlib default change
    cannot move the peer: EnvRunners = rollout workers (replicas x workersPerPod), envs per
    runner, fragment length, train batch, model layers, lr/gamma/coefficients/clip, epochs.
    New stack: one remote Learner (RLlib's IMPALA default `num_learners=1`, async updates).
    The learner gets `learner.gpus` GPUs on both stacks, as ours does (0: the CPU).
    The new stack has no separate value-function optimiser (separateVfOptimizer/lrVf): only the
    old stack gets those; the doc lists this as the one unmatched setting.
    `synthetic`: (obs_shape, dtype, actions) of a random-observation env for learner-only runs.
    `algo="appo"`: RLlib's APPO (IMPALA with PPO's clipped surrogate, its continuous-control
    algorithm) with `clip_param` = the spec's surrogateClip as it resolves for the env's space.
    """
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig

    register_bench_envs()
    t, env = spec.training, spec.env
    workers = spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod
    if env_runners is None:
        env_runners = workers
    cfg = (APPOConfig() if algo == "appo" else IMPALAConfig()).framework("torch")
    if stack == "old":
        cfg = cfg.api_stack(
            enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
        )
    if synthetic is not None:
        obs_shape = tuple(synthetic[0])
        cfg = cfg.environment(
            SYNTHETIC_ENV,
            env_config={
                "shape": list(obs_shape),
                "dtype": synthetic[1],
                "num_actions": synthetic[2],
            },
        )
    elif env.is_atari:
        obs_shape = (env.stacked_frames, 84, 84)
        cfg = cfg.environment(
            ATARI_ENV,
            env_config={
                "id": env.id,
                "frame_skip": env.frame_skip,
                "frame_stack": env.stacked_frames,
            },
            clip_rewards=True,
        )
    else:
        import gymnasium as gym

        obs_shape = tuple(gym.make(env.id).observation_space.shape or ())
        cfg = cfg.environment(env.id, env_config=dict(env.kwargs))
    cfg = cfg.env_runners(
        num_env_runners=env_runners,
        num_envs_per_env_runner=env.num_envs_per_worker,
        rollout_fragment_length=t.rollout_fragment_length,
        max_requests_in_flight_per_env_runner=t.max_requests_in_flight_per_worker,
    )
    epochs = num_sgd_iter if num_sgd_iter is not None else t.num_sgd_iter
    # Schedules are [[env steps, value], ...] on both sides: the new stack takes them in `lr` /
    # `entropy_coeff` themselves, the old one in separate *_schedule settings.
    lr_points = [list(p) for p in t.lr_schedule] if t.lr_schedule else None
    entropy_points = (
        [list(p) for p in t.entropy_coeff_schedule] if t.entropy_coeff_schedule else None
    )
    common_training: dict[str, Any] = dict(
        gamma=t.gamma,
        vf_loss_coeff=t.vf_loss_coeff,
        grad_clip=t.grad_clip,
        vtrace_clip_rho_threshold=t.vtrace_clip_rho_threshold,
        vtrace_clip_pg_rho_threshold=t.vtrace_clip_pg_rho_threshold,
        num_epochs=epochs,
        learner_queue_size=t.learner_queue_size,
        broadcast_interval=t.broadcast_interval,
    )
    model = rllib_model_config(spec, obs_shape, stack)
    if stack == "new":
        cfg = cfg.training(
            train_batch_size_per_learner=t.train_batch_size,
            lr=lr_points or t.lr,
            entropy_coeff=entropy_points or t.entropy_coeff_or_default,
            **common_training,
        )
        cfg = cfg.rl_module(model_config=model)
        if algo == "appo":
            # APPO's own KL term is off by default too; the clip is the spec's.
            cfg = cfg.training(clip_param=t.surrogate_clip, use_kl_loss=False)
        cfg = cfg.learners(
            num_learners=1 if env_runners > 0 else 0, num_gpus_per_learner=spec.learner.gpus
        )
        if sample_only:
            cfg = cfg.debugging(_env_runners_only=True)
    else:
        cfg = cfg.training(
            train_batch_size=t.train_batch_size,
            model=model,
            minibatch_buffer_size=t.minibatch_buffer_size,
            opt_type=t.optimizer.type,
            _separate_vf_optimizer=t.separate_vf_optimizer,
            _lr_vf=t.lr_vf,
            lr=t.lr,
            lr_schedule=lr_points,
            entropy_coeff=t.entropy_coeff_or_default,
            entropy_coeff_schedule=entropy_points,
            **common_training,
        )
        cfg = cfg.resources(num_gpus=spec.learner.gpus)
    # RLlib's IMPALA default is 10 s per train() call; 1 s gives the return curve resolution.
    cfg = cfg.reporting(min_time_s_per_iteration=1, metrics_num_episodes_for_smoothing=100)
    if seed is not None:
        cfg = cfg.debugging(seed=seed)
    return cfg


# -- the scenarios' manifests -----------------------------------------------------------------

MANIFESTS = REPO / "manifests" / "examples"


def manifest_path(name: str) -> Path:
    """manifests/examples/NAME.yaml."""
    return MANIFESTS / f"{name}.yaml"


def load_spec(name: str, overrides: Sequence[str] = ()) -> Any:
    """The ImpalaJob of manifests/examples/NAME.yaml with `--set` overrides applied."""
    from impala_api.manifest import load_manifest

    return load_manifest(MANIFESTS / f"{name}.yaml", list(overrides))


# -- curves -----------------------------------------------------------------------------------


class SecondPoints:
    """Curve points once a second over a fixed window, in the trials' point format:
    [seconds since launch, seconds into the window, steps, None, None]."""

    def __init__(self, seconds: float, process_start: float) -> None:
        self.seconds = seconds
        self.process_start = process_start
        self.t0 = time.perf_counter()
        self.next_point = 1.0
        self.points: list[list[float | None]] = [
            [round(time.time() - process_start, 3), 0.0, 0, None, None]
        ]

    def due(self, steps: int) -> bool:
        """Record a point if a second has passed since the last; True once the window is over."""
        t = time.perf_counter() - self.t0
        if t < self.next_point:
            return False
        launch_s = round(time.time() - self.process_start, 3)
        self.points.append([launch_s, round(t, 3), steps, None, None])
        self.next_point += 1.0
        return t >= self.seconds


def steady_rate(points: Sequence[Sequence[Any]], warmup_s: float, column: int = 2) -> float | None:
    """Steps per second on the process clock after `warmup_s` from the first sampled step.

    Both sides are measured by this one function: start-up (Ray, actors, first weights) is left
    out, and the rate is the straight line from the first point after the warm-up to the last.
    """
    started = [p for p in points if (p[column] or 0) > 0]
    if not started:
        return None
    t_first = started[0][0]
    window = [p for p in points if p[0] >= t_first + warmup_s and p[column] is not None]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    return (window[-1][column] - window[0][column]) / (window[-1][0] - window[0][0])


def point_at_steps(points: Sequence[Sequence[Any]], steps: int) -> Sequence[Any] | None:
    """The first curve point at or past `steps` env steps (None: the run never got there)."""
    return next((p for p in points if p[2] is not None and p[2] >= steps), None)


def first_crossing(points: Sequence[Sequence[Any]], threshold: float) -> Sequence[Any] | None:
    """The first point whose return mean is >= threshold (None: never crossed)."""
    for p in points:
        if p[4] is not None and p[4] >= threshold:
            return p
    return None
