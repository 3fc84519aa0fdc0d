"""`impalajob evaluate --run-dir DIR` (or `NAME`, a job on the cluster): play a checkpoint's
policy for N episodes and report.

Greedy by default (the distribution's mode; `--explore` samples as training does), on env seeds
of its own, nothing written back to the run. `--video DIR` records episodes as mp4 (GIF where no
encoder is installed). A job NAME's config and checkpoint are copied from its claim or its
storageUri first (`commands.results`). A multi-agent run plays whole games as its
spec.evaluation does: one policy scored against an opponent (the job's, or `--opponent`), or,
for a job without one (cooperating agents), every agent by its own policy and the team's
return (`--team`). Exit 0 with the summary; exit 2 when the directory has
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

from impala_cli.commands import CommandError, add_cluster_arguments

if TYPE_CHECKING:
    from impala_api.spec import ImpalaJobSpec
    from impala_trainer.policy.games import GamePolicy
    from impala_trainer.policy.loaded import LoadedPolicy


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """A run directory or a cluster job, and `--checkpoint`: every command that loads a trained
    policy."""
    parser.add_argument(
        "job", nargs="?", metavar="NAME", help="an ImpalaJob on the cluster (instead of --run-dir)"
    )
    parser.add_argument("--run-dir", type=Path, help="the run directory")
    add_cluster_arguments(parser, "the job's namespace (default: the context's)")
    parser.add_argument(
        "--checkpoint",
        metavar="CKPT",
        help="a checkpoint of the run, e.g. ckpt-000012, or best (the best evaluation's); "
        "default: the newest",
    )
    parser.add_argument(
        "--policy",
        help="a multi-agent run's policy (default: its self-play policy, else the first that "
        "learns; evaluate scores its spec.evaluation.policy first)",
    )


@contextmanager
def results_from(args: argparse.Namespace) -> Iterator[tuple[Path, str | None]]:
    """(the run directory, the checkpoint's name) that `--run-dir` or the job NAME names (a
    job's files copied to a temporary directory, removed after)."""
    if (args.job is None) == (args.run_dir is None):
        raise CommandError("give a run directory (--run-dir DIR) or a job NAME, one of them")
    if args.run_dir is not None:
        yield args.run_dir, args.checkpoint
        return
    from impala_cli.commands.results import fetch_job_results

    with tempfile.TemporaryDirectory(prefix=f"impalajob-{args.job}-") as tmp:
        ckpt = fetch_job_results(args.job, args.namespace, args.checkpoint, Path(tmp))
        yield Path(tmp), ckpt.name


@contextmanager
def policy_from(args: argparse.Namespace) -> Iterator[LoadedPolicy]:
    """The policy `--run-dir` or the job NAME names."""
    from impala_trainer.policy.loaded import load_policy

    with results_from(args) as (run_dir, checkpoint), loading():
        yield load_policy(run_dir, checkpoint, args.policy)


@contextmanager
def loading() -> Iterator[None]:
    """A run's policy that cannot be loaded here, as one line and exit 2."""
    from impala_trainer.policy.loaded import PolicyNotFoundError
    from impala_trainer.user_code import UserCodeError

    try:
        yield
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
    games = parser.add_argument_group("a multi-agent run (spec.env.pettingzoo): games")
    games.add_argument(
        "--opponent",
        help="what every other agent acts by while --policy is scored: random (among the "
        "allowed actions) or a policy of the job; default: the job's spec.evaluation.opponent, "
        "else random for a self-play job, else none (--team)",
    )
    games.add_argument(
        "--team",
        action="store_true",
        help="every agent acts by its own policy and the return is the team's, as training "
        "reports it (the default for a job with no opponent: cooperating agents)",
    )
    games.add_argument(
        "--opponent-checkpoint",
        metavar="CKPT",
        help="the opponent policy's weights from this checkpoint (e.g. an earlier one of the "
        "same policy); default: --checkpoint's",
    )
    games.add_argument(
        "--opening",
        type=int,
        default=0,
        metavar="N",
        help="the first N moves of every game are random, on both sides (default 0): greedy "
        "policies then meet in many positions, not one game per seat",
    )


def run(args: argparse.Namespace) -> int:
    if args.episodes < 1 or args.num_envs < 1:
        raise CommandError("--episodes and --num-envs must be at least 1")
    if args.opening < 0:
        raise CommandError("--opening must be 0 or more")
    if args.video is not None:
        try:
            args.video.mkdir(parents=True, exist_ok=True)
            probe = args.video / ".impalajob-write-check"
            probe.touch()
            probe.unlink()
        except OSError as err:
            raise CommandError(f"--video {args.video} cannot be written: {err.strerror}") from None
    from impala_trainer.policy.episodes import evaluate

    with results_from(args) as (run_dir, checkpoint):
        if _multi_agent(run_dir):
            with loading():
                return _games(args, run_dir, checkpoint)
        games_only = [
            flag
            for flag, given in (
                ("--opponent", args.opponent is not None),
                ("--team", args.team),
                ("--opponent-checkpoint", args.opponent_checkpoint is not None),
                ("--opening", args.opening > 0),
            )
            if given
        ]
        if games_only:
            raise CommandError(
                f"{', '.join(games_only)}: only a multi-agent run (spec.env.pettingzoo) plays "
                "games against an opponent; drop it for this run"
            )
        with loading():
            from impala_trainer.policy.loaded import load_policy

            policy = load_policy(run_dir, checkpoint)
        return _evaluate(args, policy, evaluate)


def _multi_agent(run_dir: Path) -> bool:
    from impala_api.manifest import ManifestError, load_manifest
    from impala_api.snapshot import CONFIG_FILE

    try:
        return load_manifest(run_dir / CONFIG_FILE).spec.env.is_pettingzoo
    except (ManifestError, OSError):
        return False  # load_policy says what is wrong with it


def _games(args: argparse.Namespace, run_dir: Path, checkpoint: str | None) -> int:
    from impala_api.manifest import load_manifest
    from impala_api.snapshot import CONFIG_FILE
    from impala_trainer.policy.games import load_game_policies

    job = load_manifest(run_dir / CONFIG_FILE)
    policies = load_game_policies(run_dir, checkpoint)
    if args.team and args.opponent is not None:
        raise CommandError("--team and --opponent: a team has no opponent; give one of them")
    against = None if args.team else (args.opponent or default_opponent(job.spec))
    if against is None:
        return _team_games(args, job.metadata.name, policies, job.spec)
    return _scored_games(args, job.metadata.name, policies, job.spec, against, run_dir)


def default_opponent(spec: ImpalaJobSpec) -> str | None:
    """What a job's games are scored against unless told: its spec.evaluation.opponent, else a
    random player for a self-play job (a game against itself says nothing), else nothing: every
    agent by its own policy, as its training and spec.evaluation play it."""
    from impala_api.spec import RANDOM_OPPONENT

    if spec.evaluation is not None and spec.evaluation.opponent is not None:
        return spec.evaluation.opponent
    return RANDOM_OPPONENT if spec.agents.self_play is not None else None


def _team_games(
    args: argparse.Namespace, job: str, policies: dict[str, GamePolicy], spec: ImpalaJobSpec
) -> int:
    from impala_trainer.policy.games import play_team

    if args.policy is not None:
        raise CommandError(
            f"--policy {args.policy}: a team's games play every policy; score one against an "
            "opponent with --opponent random|POLICY"
        )
    if args.opponent_checkpoint is not None:
        raise CommandError(
            "--opponent-checkpoint: a team's games have no opponent; give --opponent POLICY"
        )
    results = play_team(spec, policies, args.episodes, args.seed, args.explore, args.opening)
    source = next(iter(policies.values())).source
    summary = {
        "job": job,
        "checkpoint": source,
        "team": sorted(policies),
        "explore": args.explore,
        "opening": args.opening,
        **results.summary(),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    each = ", ".join(f"{k} {v:.2f}" for k, v in summary["policy_return_means"].items())
    print(
        f"{job} {source}: every agent by its own policy, "
        f"{'sampled' if args.explore else 'greedy'}, {results.games} games:\n"
        f"  team return mean {summary['episode_return_mean']:.2f}  (per agent: {each})"
    )
    return 0


def _scored_games(
    args: argparse.Namespace,
    job: str,
    policies: dict[str, GamePolicy],
    spec: ImpalaJobSpec,
    against: str,
    run_dir: Path,
) -> int:
    from impala_trainer.policy.games import RANDOM, load_game_policies, play_games

    name = args.policy or spec.evaluated_policy
    if name not in policies:
        raise CommandError(f"--policy {name}: the run's policies are {', '.join(policies)}")
    opponent = None
    if against != RANDOM:
        pool = policies
        if args.opponent_checkpoint is not None:
            pool = load_game_policies(run_dir, args.opponent_checkpoint)
        if against not in pool:
            raise CommandError(
                f"--opponent {against}: random, or one of the run's policies "
                f"({', '.join(pool)})"
            )
        opponent = pool[against]
    policy = policies[name]
    results = play_games(spec, policy, opponent, args.episodes, args.seed, args.explore,
                         args.opening)  # fmt: skip
    shown = "random" if opponent is None else f"{opponent.name} ({opponent.source})"
    summary = {
        "job": job,
        "checkpoint": policy.source,
        "policy": name,
        "opponent": shown,
        "explore": args.explore,
        "opening": args.opening,
        **results.summary(),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"{job} {policy.source}: policy {name} against {shown}, "
        f"{'sampled' if args.explore else 'greedy'}, {results.games} games:\n"
        f"  won {results.wins}  drawn {results.draws}  lost {results.losses}  "
        f"(win rate {summary['win_rate']:.1%}, score {results.score:.3f})"
    )
    return 0


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
