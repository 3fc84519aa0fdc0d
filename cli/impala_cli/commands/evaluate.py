"""`impalajob evaluate --run-dir DIR` (or `NAME`, a job on the cluster): play a checkpoint's
policy for N episodes and report.

Greedy by default (the distribution's mode; `--explore` samples as training does), on env seeds
of its own, nothing written back to the run. `--video DIR` records episodes as mp4 (GIF where no
encoder is installed). A job NAME's config and checkpoint are copied from its claim or its
storageUri first (`commands.results`). Exit 0 with the summary; exit 2 when the directory has
no job or checkpoint to load, 1 when the cluster's copy cannot be read.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from impala_cli.commands import CommandError

if TYPE_CHECKING:
    from impala_trainer.policy.loaded import LoadedPolicy


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """A run directory or a cluster job, and `--checkpoint`: every command that loads a trained
    policy."""
    parser.add_argument(
        "job", nargs="?", metavar="NAME", help="an ImpalaJob on the cluster (instead of --run-dir)"
    )
    parser.add_argument("--run-dir", type=Path, help="the run directory")
    parser.add_argument("-n", "--namespace", help="the job's namespace (default: the context's)")
    parser.add_argument(
        "--checkpoint",
        metavar="CKPT",
        help="a checkpoint of the run, e.g. ckpt-000012, or best (the best evaluation's); "
        "default: the newest",
    )


@contextmanager
def policy_from(args: argparse.Namespace) -> Iterator[LoadedPolicy]:
    """The policy `--run-dir` or the job NAME names (its files copied to a temporary directory,
    removed after)."""
    from impala_trainer.policy.loaded import PolicyNotFoundError, load_policy
    from impala_trainer.user_code import UserCodeError

    if (args.job is None) == (args.run_dir is None):
        raise CommandError("give a run directory (--run-dir DIR) or a job NAME, one of them")
    try:
        if args.run_dir is not None:
            yield load_policy(args.run_dir, args.checkpoint)
            return
        from impala_cli.commands.results import fetch_job_results

        with tempfile.TemporaryDirectory(prefix=f"impalajob-{args.job}-") as tmp:
            ckpt = fetch_job_results(args.job, args.namespace, args.checkpoint, Path(tmp))
            yield load_policy(Path(tmp), ckpt.name)
    except PolicyNotFoundError as err:
        raise CommandError(str(err)) from None
    except UserCodeError as err:  # the job's env module or model is not importable here
        raise CommandError(str(err)) from None


def register(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    parser.add_argument(
        "--explore", action="store_true", help="sample actions instead of taking the greedy one"
    )
    parser.add_argument("--seed", type=int, default=0, help="env and sampling seed (default 0)")
    parser.add_argument(
        "--num-envs", type=int, default=8, help="envs played side by side (default 8)"
    )
    parser.add_argument("--video", type=Path, metavar="DIR", help="record episodes into DIR")
    parser.add_argument(
        "--video-episodes", type=int, default=1, help="episodes recorded with --video (default 1)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    if args.episodes < 1 or args.num_envs < 1:
        raise CommandError("--episodes and --num-envs must be at least 1")
    if args.video is not None:
        try:
            args.video.mkdir(parents=True, exist_ok=True)
            probe = args.video / ".impalajob-write-check"
            probe.touch()
            probe.unlink()
        except OSError as err:
            raise CommandError(f"--video {args.video} cannot be written: {err.strerror}") from None
    from impala_trainer.policy.evaluation import evaluate

    with policy_from(args) as policy:
        return _evaluate(args, policy, evaluate)


def _evaluate(args: argparse.Namespace, policy: LoadedPolicy, evaluate: Any) -> int:
    result = evaluate(
        policy.job.spec.env,
        policy.model,
        policy.actions,
        args.episodes,
        explore=args.explore,
        seed=args.seed,
        num_envs=args.num_envs,
        video_dir=args.video,
        video_episodes=args.video_episodes,
    )
    summary = {
        "job": policy.job.metadata.name,
        "checkpoint": policy.checkpoint.name if args.job else str(policy.checkpoint),
        "global_timestep": policy.global_timestep,
        "explore": args.explore,
        **result.summary(),
        "videos": [str(v) for v in result.videos],
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"{summary['job']} {policy.checkpoint.name} (trained {policy.global_timestep:,} env "
        f"steps), {'sampled' if args.explore else 'greedy'}, {summary['episodes']} episodes:\n"
        f"  return  mean {summary['episode_return_mean']:.2f}  median "
        f"{summary['episode_return_median']:.2f}  min {summary['episode_return_min']:.2f}  "
        f"max {summary['episode_return_max']:.2f}\n"
        f"  length  mean {summary['episode_len_mean']:.1f}"
    )
    for video in result.videos:
        print(f"  video   {video}")
    return 0
