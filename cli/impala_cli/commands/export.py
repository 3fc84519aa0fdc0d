"""`impalajob export --run-dir DIR (or NAME) --format onnx|torchscript -o FILE`: a checkpoint's
policy as a file a serving stack loads, and `FILE.json` beside it saying how to feed it and read
an action (`impala_trainer.policy.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from impala_cli.commands import EXIT_FAILED, CommandError
from impala_cli.commands.evaluate import add_checkpoint_arguments, policy_from

if TYPE_CHECKING:
    from impala_trainer.policy.export import Format
    from impala_trainer.policy.loaded import LoadedPolicy


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
    output: Path = args.output
    existed = output.exists()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.touch()  # refused here, before a minute of exporting, when it cannot be written
    except OSError as err:
        raise CommandError(f"-o {output} cannot be written: {err.strerror}") from None
    try:
        with policy_from(args) as policy:
            sidecar = _export(policy, args.format, output)
    except BaseException:
        if not existed:  # a failed export leaves nothing behind that looks like a result
            output.unlink(missing_ok=True)
        raise
    print(
        f"{args.output}: {policy.job.metadata.name} {policy.checkpoint.name} as {args.format} "
        f"(trained {policy.global_timestep:,} env steps); how to feed it: {sidecar}"
    )
    return 0


def _export(policy: LoadedPolicy, fmt: Format, output: Path) -> Path:
    """Write `policy` as `fmt` to `output`; the exporter's failures as one line."""
    from impala_trainer.driver.base import one_line
    from impala_trainer.policy.export import export_policy

    try:
        return export_policy(policy, fmt, output)
    except OSError as err:
        raise CommandError(f"-o {output}: {err.strerror or err}") from None
    except Exception as err:  # the exporter: an op or a model it cannot express
        raise CommandError(
            f"{policy.checkpoint.name} could not be exported as {fmt}: {one_line(err)}",
            EXIT_FAILED,
        ) from None
