"""Learner scaling (learner.replicas): learner samples/s for 1 and 2 learners, and the all-reduce.

Each learner is a process of its own with one intra-op thread, as a learner pod with a CPU
request of 1; with 2 they form the job's gloo group (`learning.collective`, over a TCPStore on
loopback) and average gradients before every step. Each learner steps on one pre-built synthetic
batch of the manifest's trainBatchSize, as fast as it can (`Learner.learn_on_batch`, no queue):

    samples/s = learners x updates/s x batch env steps / numSgdIter

The all-reduce's share is the time learner 0 waits for it after backward
(`GradientReducer.finish`: the buckets backward's overlap did not hide, its peer's lag included)
over its update time. A third case, 2 learners with no group (`apart`: each
steps alone), is the ceiling two processes reach on this machine, all-reduce aside. Cases
alternate (1, 2, apart, 1, ...), medians over --runs rounds, the ratios to 1 learner.

    python bench/learner_scaling.py                       # the Pong CNN, 3 rounds of 20 s
    python bench/learner_scaling.py --model mlp --seconds 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

from common import load_spec, machine_info, median, ratio, report, table
from ours_side import synthetic_batch

# (manifest, obs shape, actions, obs dtype)
MODELS: dict[str, tuple[str, tuple[int, ...], int, str]] = {
    "cnn": ("pong", (4, 84, 84), 6, "uint8"),
    "mlp": ("cartpole", (4,), 2, "float32"),
}


def _learner(
    rank: int, world: int, port: int, args: argparse.Namespace, out: Any, group: bool
) -> None:
    """One learner process: join the group, step for warmup + seconds, report rank 0's rates."""
    import torch

    from impala_trainer.learning.collective import Collective, GroupStopped, Rendezvous
    from impala_trainer.learning.learner import Learner, LearnerConfig

    torch.set_num_threads(1)
    manifest, obs_shape, actions, dtype = MODELS[args.model]
    spec = load_spec(manifest, args.overrides).spec
    t = spec.training
    columns = t.train_batch_size // t.rollout_fragment_length
    batch = synthetic_batch(t.rollout_fragment_length, columns, obs_shape, actions, dtype, rank)
    learner = Learner(LearnerConfig.of(spec), obs_shape, actions)
    reduce_s = [0.0]
    if world > 1 and group:
        collective = Collective.join(Rendezvous("127.0.0.1", port, world), rank,
                                     torch.device("cpu"), local_host="127.0.0.1")  # fmt: skip
        learner.join(collective)
        reducer = learner.reducer
        assert reducer is not None
        finish = reducer.finish

        def timed() -> None:
            start = time.perf_counter()
            finish()
            reduce_s[0] += time.perf_counter() - start

        reducer.finish = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    while time.perf_counter() - start < args.warmup:
        learner.learn_on_batch(batch)
    reduce_s[0], updates, start = 0.0, 0, time.perf_counter()
    try:
        while time.perf_counter() - start < args.seconds:
            learner.learn_on_batch(batch)
            updates += 1
    except GroupStopped:  # the peer's window ended first: this one ends with it
        pass
    elapsed = time.perf_counter() - start
    if rank == 0 or not group:
        out.put({
            "updates_per_s": updates / elapsed,
            "samples_per_s": world * updates * batch.env_steps / t.num_sgd_iter / elapsed,
            "allreduce_share": reduce_s[0] / elapsed,
            "batch_env_steps": batch.env_steps,
        })  # fmt: skip
    if world > 1 and group:  # the peers stop after the same step: none waits in an all-reduce
        learner.leave_group()
        learner.collective = learner.reducer = None  # the group closes before the interpreter ends


def trial(world: int, args: argparse.Namespace, group: bool = True) -> dict[str, Any]:
    """One case: `world` learner processes, in one group or (`group` False) each alone."""
    from impala_trainer.node.ray_node import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_learner, args=(r, world, port, args, out, group))
             for r in range(world)]  # fmt: skip
    for p in procs:
        p.start()
    timeout = args.warmup + args.seconds + 300
    results = [out.get(timeout=timeout) for _ in range(1 if group else world)]
    for p in procs:
        p.join(60)
    if group:
        return dict(results[0])
    # Each alone reported its own rate (world x its updates): the sum of what each did.
    return {"samples_per_s": sum(r["samples_per_s"] for r in results) / world,
            "allreduce_share": 0.0}  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--runs", type=int, default=3, help="rounds (1 then 2 learners each)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE", help="override a manifest field")  # fmt: skip
    parser.add_argument("--json-out", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    info = machine_info()
    cases = {"1": (1, True), "2": (2, True), "apart": (2, False)}
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for i in range(args.runs):
        for name, (world, group) in cases.items():
            print(f"[{time.strftime('%H:%M:%S')}] round {i + 1}/{args.runs}: {name}")
            r = trial(world, args, group)
            print(f"    {r['samples_per_s']:.0f} samples/s, all-reduce "
                  f"{100 * r['allreduce_share']:.1f}% of learner 0's time")  # fmt: skip
            trials[name].append(r)
    rate = {name: median(r["samples_per_s"] for r in trials[name]) for name in cases}
    share = median(r["allreduce_share"] for r in trials["2"])
    summary = {"model": args.model, "one_samples_per_s": rate["1"],
               "two_samples_per_s": rate["2"], "apart_samples_per_s": rate["apart"],
               "ratio_two_vs_one": ratio(rate["2"], rate["1"]),
               "ratio_apart_vs_one": ratio(rate["apart"], rate["1"]),
               "allreduce_share_two": share}  # fmt: skip
    headers = ["model", "1 learner", "2 learners", "2 / 1", "2 apart / 1", "all-reduce (2)"]
    row = [args.model, rate["1"], rate["2"], summary["ratio_two_vs_one"],
           summary["ratio_apart_vs_one"], share]  # fmt: skip
    print(table(headers, [row]))
    report("learner_scaling", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
