"""`impalajob export --run-dir DIR --format onnx|torchscript -o FILE`: a checkpoint's policy as a
file a serving stack loads, and `FILE.json` beside it saying how to feed it and read an action
(`impala_trainer.policy.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from impala_cli.commands import CommandError
from impala_cli.commands.evaluate import add_checkpoint_arguments


def register(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument(
        "--format", required=True, choices=("onnx", "torchscript"), help="the file's format"
    )
    parser.add_argument("-o", "--output", required=True, type=Path, help="the file to write")


def run(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        try:
            import onnxscript  # noqa: F401  # torch's ONNX exporter needs it (and onnx)
        except ImportError:
            raise CommandError(
                "--format onnx needs the export extra: pip install 'impalajob[export]'"
            ) from None
    from impala_trainer.policy.export import export_policy
    from impala_trainer.policy.loaded import PolicyNotFoundError, load_policy

    try:
        policy = load_policy(args.run_dir, args.checkpoint)
    except PolicyNotFoundError as err:
        raise CommandError(str(err)) from None
    sidecar = export_policy(policy, args.format, args.output)
    print(
        f"{args.output}: {policy.job.metadata.name} {policy.checkpoint.name} as {args.format} "
        f"(trained {policy.global_timestep:,} env steps); how to feed it: {sidecar}"
    )
    return 0
