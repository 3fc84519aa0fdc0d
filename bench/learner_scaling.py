"""Learner scaling (learner.replicas): learner samples/s for 1 and 2 learners, and the all-reduce.

Each learner is a process of its own with one intra-op thread, as a learner pod with a CPU
request of 1; with 2 they form the job's gloo group (`learning.collective`, over a TCPStore on
loopback) and average gradients before every step. Each learner steps on one pre-built synthetic
batch of the manifest's trainBatchSize, as fast as it can (`Learner.learn_on_batch`, no queue):

    samples/s = learners x updates/s x batch env steps / numSgdIter

The all-reduce's share is the time learner 0 spends in `Collective.average` over its update
time. Counts alternate (1 2 1 2 ...), medians over --runs rounds, the ratio 2 / 1.

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


def _learner(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    """One learner process: join the group, step for warmup + seconds, report rank 0's rates."""
    import torch

    from impala_trainer.learning.collective import Collective, Rendezvous
    from impala_trainer.learning.learner import Learner

    torch.set_num_threads(1)
    manifest, obs_shape, actions, dtype = MODELS[args.model]
    spec = load_spec(manifest, args.overrides).spec
    t = spec.training
    columns = t.train_batch_size // t.rollout_fragment_length
    batch = synthetic_batch(t.rollout_fragment_length, columns, obs_shape, actions, dtype, rank)
    learner = Learner(spec, obs_shape, actions)
    reduce_s = [0.0]
    if world > 1:
        collective = Collective.join(Rendezvous("127.0.0.1", port, world), rank,
                                     torch.device("cpu"), local_host="127.0.0.1")  # fmt: skip
        average = collective.average

        def timed(tensors: list[Any]) -> None:
            start = time.perf_counter()
            average(tensors)
            reduce_s[0] += time.perf_counter() - start

        collective.average = timed  # type: ignore[method-assign]
        learner.join(collective)
    start = time.perf_counter()
    while time.perf_counter() - start < args.warmup:
        learner.learn_on_batch(batch)
    reduce_s[0], updates, start = 0.0, 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        learner.learn_on_batch(batch)
        updates += 1
    elapsed = time.perf_counter() - start
    if rank == 0:
        out.put({
            "updates_per_s": updates / elapsed,
            "samples_per_s": world * updates * batch.env_steps / t.num_sgd_iter / elapsed,
            "allreduce_share": reduce_s[0] / elapsed,
            "batch_env_steps": batch.env_steps,
        })  # fmt: skip
    if world > 1:  # the peers stop after the same step: none is left in an all-reduce
        learner.leave_group()


def trial(world: int, args: argparse.Namespace) -> dict[str, Any]:
    from impala_trainer.learning.collective import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port("127.0.0.1")
    procs = [ctx.Process(target=_learner, args=(r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    result: dict[str, Any] = out.get(timeout=args.warmup + args.seconds + 300)
    for p in procs:
        p.join(60)
    return result


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
    trials: dict[str, list[dict[str, Any]]] = {"1": [], "2": []}
    for i in range(args.runs):
        for world in (1, 2):
            print(f"[{time.strftime('%H:%M:%S')}] round {i + 1}/{args.runs}: {world} learner(s)")
            r = trial(world, args)
            print(f"    {r['samples_per_s']:.0f} samples/s, all-reduce "
                  f"{100 * r['allreduce_share']:.1f}% of learner 0's time")  # fmt: skip
            trials[str(world)].append(r)
    one = median(r["samples_per_s"] for r in trials["1"])
    two = median(r["samples_per_s"] for r in trials["2"])
    share = median(r["allreduce_share"] for r in trials["2"])
    summary = {"model": args.model, "one_samples_per_s": one, "two_samples_per_s": two,
               "ratio_two_vs_one": ratio(two, one), "allreduce_share_two": share}  # fmt: skip
    headers = ["model", "1 learner samples/s", "2 learners samples/s", "2 / 1", "all-reduce (2)"]
    print(table(headers, [[args.model, one, two, ratio(two, one), share]]))
    report("learner_scaling", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
