"""`impalajob validate -f FILE`: check a manifest without running anything."""

from __future__ import annotations

import argparse
import sys

from impala_trainer.job.manifest import ManifestError, load_manifest


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, help="ImpalaJob manifest (YAML)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. training.lr=0.001 (repeatable)")


def run(args: argparse.Namespace) -> int:
    try:
        job = load_manifest(args.file, args.set)
    except ManifestError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{args.file}: ImpalaJob {job.name} is valid")
    return 0
